"""Fourier neural operator (Li et al., "Fourier Neural Operator for Parametric PDEs", ICLR 2021).

lift (pointwise) -> `layers` blocks of [spectral convolution + pointwise convolution, GELU] -> project
(pointwise, GELU, pointwise). Grid coordinates are appended to the input channels only with
`model.coordinates` (Li et al.'s model reads them): without them, on a periodic domain, the operator commutes
with translations, as the PDEs it learns do.

Layout: the hidden fields are kept channels last, (batch, *space, width), so that every pointwise layer is
one matrix product over all points (`torch.nn.functional.linear`) instead of a 1x1 convolution, which
oneDNN runs several times slower on CPU (its backward above all), and the spectral convolutions' DFT
matrices contract the spatial axis directly. The pointwise layers keep the parameters (names, shapes and
initialisation) of the 1x1 convolutions they replace, so checkpoints are unchanged.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import FNOConfig
from dynaforge.models.base import (
    GridModel,
    ModelInput,
    ModelOutput,
    ModelShape,
    frames_prediction,
    zero_layer,
)
from dynaforge.models.spectral import SpectralConv, SpectralInit, Transform
from dynaforge.store.layout import channels_first_to_last, channels_last_to_first


class ChannelsLastPointwise:
    """The forward of a 1x1 convolution on channels-last fields: one matrix product over all points.

    Mixed into the convolution classes below, which keep their parameters (weight (out, in, 1, ...), bias)
    and initialisation; so checkpoints and the optimiser's routing (a convolution kernel, for Muon) see a
    1x1 convolution.
    """

    weight: Tensor
    bias: Tensor | None

    def forward(
        self, h: Float[Tensor, "batch *space in_channels"]
    ) -> Float[Tensor, "batch *space out_channels"]:
        return nn.functional.linear(h, self.weight.flatten(1), self.bias)


class Pointwise1d(ChannelsLastPointwise, nn.Conv1d):
    """A 1x1 Conv1d applied to (batch, x, channels)."""


class Pointwise2d(ChannelsLastPointwise, nn.Conv2d):
    """A 1x1 Conv2d applied to (batch, x, y, channels)."""


class Pointwise3d(ChannelsLastPointwise, nn.Conv3d):
    """A 1x1 Conv3d applied to (batch, x, y, z, channels)."""


POINTWISE: dict[int, type[nn.Module]] = {1: Pointwise1d, 2: Pointwise2d, 3: Pointwise3d}
"""A channels-last 1x1 convolution per number of spatial axes."""


def pointwise(in_channels: int, out_channels: int, spatial_dims: int) -> nn.Module:
    return POINTWISE[spatial_dims](in_channels, out_channels, kernel_size=1)


class FNOBlock(nn.Module):
    """h -> act(spectral(h) + pointwise(h)), channels last."""

    def __init__(
        self,
        width: int,
        modes: tuple[int, ...],
        activate: bool,
        transform: Transform = "auto",
        low_precision: bool = False,
        spectral_init: SpectralInit = "small",
    ) -> None:
        super().__init__()
        self.spectral = SpectralConv(width, width, modes, transform, low_precision, spectral_init)
        self.pointwise = pointwise(width, width, len(modes))
        self.activation = nn.GELU() if activate else nn.Identity()

    def forward(self, h: Float[Tensor, "batch *space width"]) -> Float[Tensor, "batch *space width"]:
        return self.activation(self.spectral.forward_channels_last(h) + self.pointwise(h))


class FNO(GridModel):
    """Fourier neural operator on grids with 1 (or more) spatial axes, periodic ones unless
    `domain_padding`; see the module docstring."""

    config: FNOConfig

    def __init__(self, config: FNOConfig, shape: ModelShape) -> None:
        super().__init__(config, shape, POINTWISE, "FNO")
        dims = shape.spatial_dims
        modes = (config.modes,) * dims
        extra = dims if config.coordinates else 0
        self.lift = pointwise(shape.in_channels + extra, config.width, dims)
        self.blocks = nn.ModuleList(
            FNOBlock(
                config.width,
                modes,
                activate=i < config.layers - 1,
                transform=config.spectral_transform,
                low_precision=config.spectral_low_precision,
                spectral_init=config.spectral_init,
            )
            for i in range(config.layers)
        )
        self.project = nn.Sequential(
            pointwise(config.width, config.projection, dims),
            nn.GELU(),
            pointwise(config.projection, shape.out_channels, dims),
        )
        if config.residual:
            # Start as "nothing changes": the first prediction is the last input frame.
            zero_layer(self.output_layer())

    def output_layer(self) -> nn.Module:
        """The layer that writes the update (zeroed at the start of a residual model)."""
        return self.project[-1]

    def forward(self, inputs: ModelInput) -> ModelOutput:
        return frames_prediction(inputs, self.shape, self.config.residual, self.network)

    def network(self, stacked: Tensor) -> Tensor:
        """Stacked frames (B, history * C, *space) -> stacked update (B, horizon * C, *space)."""
        fields = channels_first_to_last(stacked, lead=1)  # (B, *space, C)
        if self.config.coordinates:
            fields = torch.cat([fields, grid_coordinates(fields)], dim=-1)
        hidden = self.lift(fields)  # (B, *space, width)
        space = hidden.shape[1:-1]
        # TorchScript's tracer (the legacy ONNX exporter) gives the sizes as tensors, which round() refuses:
        # int() first (the traced graph keeps the padding of the traced grid).
        padding = self.config.domain_padding
        extra = [round(padding * int(n)) for n in space] if padding else []
        if any(extra):  # zeros at the far end of every axis (channels last: the last pair is the channels')
            pads = [0, 0]
            for e in reversed(extra):
                pads += [0, e]
            hidden = nn.functional.pad(hidden, pads)
        for block in self.blocks:
            hidden = block(hidden)
        if any(extra):
            hidden = hidden[(slice(None), *(slice(0, n) for n in space))]
        return channels_last_to_first(self.project(hidden), lead=1)


def grid_coordinates(fields: Float[Tensor, "batch *space channels"]) -> Float[Tensor, "batch *space dims"]:
    """x / L = i / n on every axis of a channels-last batch (left end included), one channel per axis."""
    space = fields.shape[1:-1]
    axes = [torch.arange(n, dtype=fields.dtype, device=fields.device) / n for n in space]
    grid = torch.stack(torch.meshgrid(*axes, indexing="ij"), dim=-1)  # (*space, dims)
    return grid.expand(fields.shape[0], *grid.shape)
