"""Fourier neural operator (Li et al., "Fourier Neural Operator for Parametric PDEs", ICLR 2021).

lift (pointwise) -> `layers` blocks of [spectral convolution + pointwise convolution, GELU] -> project
(pointwise, GELU, pointwise). No grid coordinates are appended: on a periodic domain the operator then
commutes with translations, as the PDEs it learns do.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import FNOConfig
from dynaforge.models.base import (
    ModelInput,
    ModelOutput,
    ModelShape,
    check_input,
    frames_to_stack,
    stack_to_frames,
    update_to_output,
)
from dynaforge.models.spectral import SpectralConv

POINTWISE = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
"""A 1x1 convolution per number of spatial axes."""


class FNOBlock(nn.Module):
    """x -> act(spectral(x) + pointwise(x))."""

    def __init__(self, width: int, modes: tuple[int, ...], activate: bool) -> None:
        super().__init__()
        self.spectral = SpectralConv(width, width, modes)
        self.pointwise = POINTWISE[len(modes)](width, width, kernel_size=1)
        self.activation = nn.GELU() if activate else nn.Identity()

    def forward(self, x: Float[Tensor, "batch width *space"]) -> Float[Tensor, "batch width *space"]:
        return self.activation(self.spectral(x) + self.pointwise(x))


class FNO(nn.Module):
    """Fourier neural operator on periodic grids with 1 (or more) spatial axes; see the module docstring."""

    def __init__(self, config: FNOConfig, shape: ModelShape) -> None:
        super().__init__()
        if shape.spatial_dims not in POINTWISE:
            raise ValueError(f"FNO supports 1 to 3 spatial axes, got {shape.spatial_dims}")
        self.config, self.shape = config, shape
        conv = POINTWISE[shape.spatial_dims]
        modes = (config.modes,) * shape.spatial_dims
        self.lift = conv(shape.in_channels, config.width, kernel_size=1)
        self.blocks = nn.ModuleList(
            FNOBlock(config.width, modes, activate=i < config.layers - 1) for i in range(config.layers)
        )
        self.project = nn.Sequential(
            conv(config.width, config.projection, kernel_size=1),
            nn.GELU(),
            conv(config.projection, shape.out_channels, kernel_size=1),
        )
        if config.residual:
            # Start as "nothing changes": the first prediction is the last input frame.
            nn.init.zeros_(self.project[-1].weight)
            nn.init.zeros_(self.project[-1].bias)

    def forward(self, inputs: ModelInput) -> ModelOutput:
        check_input(inputs, self.shape)
        hidden = self.lift(frames_to_stack(inputs.frames))
        for block in self.blocks:
            hidden = block(hidden)
        update = stack_to_frames(self.project(hidden), self.shape.channels)
        return update_to_output(inputs, update, self.config.residual)
