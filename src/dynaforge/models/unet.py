"""A small U-Net baseline on 1, 2 or 3 periodic spatial axes: circular padding, GroupNorm and GELU.

Encoder: at each level two convolutions, then average pooling by 2 on every axis (odd sizes are floored).
Decoder: upsample ((bi/tri)linear) to the skip connection's exact size, concatenate, two convolutions.
Any grid of at least 2^(levels-1) points per axis works, odd sizes included. The convolutions have as many
spatial axes as the data (`ModelShape.spatial_dims`); the parameter names do not depend on it, so 1D
checkpoints written before the U-Net knew 2D still load.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import UNetConfig
from dynaforge.errors import ConfigError
from dynaforge.models.base import (
    GridModel,
    ModelInput,
    ModelOutput,
    ModelShape,
    frames_prediction,
    zero_layer,
)

CONVOLUTIONS = {1: nn.Conv1d, 2: nn.Conv2d, 3: nn.Conv3d}
"""The convolution per number of spatial axes."""
POOLING = {1: nn.functional.avg_pool1d, 2: nn.functional.avg_pool2d, 3: nn.functional.avg_pool3d}
"""Average pooling per number of spatial axes."""
UPSAMPLING = {1: "linear", 2: "bilinear", 3: "trilinear"}
"""The `interpolate` mode per number of spatial axes."""


class ConvBlock(nn.Module):
    """Two [conv, GroupNorm, GELU] layers (convolutions padded by `padding`: circular for periodic data)."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        kernel_size: int,
        spatial_dims: int = 1,
        padding_mode: str = "circular",
    ) -> None:
        super().__init__()
        conv = CONVOLUTIONS[spatial_dims]
        padding = kernel_size // 2
        self.layers = nn.Sequential(
            conv(in_channels, out_channels, kernel_size, padding=padding, padding_mode=padding_mode),
            nn.GroupNorm(groups_for(out_channels), out_channels),
            nn.GELU(),
            conv(out_channels, out_channels, kernel_size, padding=padding, padding_mode=padding_mode),
            nn.GroupNorm(groups_for(out_channels), out_channels),
            nn.GELU(),
        )

    def forward(self, x: Float[Tensor, "batch c_in *space"]) -> Float[Tensor, "batch c_out *space"]:
        return self.layers(x)


def groups_for(channels: int) -> int:
    """The largest of 8, 4, 2, 1 groups that divides `channels`."""
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class UNet(GridModel):
    """U-Net over 1 to 3 periodic spatial axes; see the module docstring."""

    config: UNetConfig

    def __init__(self, config: UNetConfig, shape: ModelShape) -> None:
        super().__init__(config, shape, CONVOLUTIONS, "the U-Net")
        dims = shape.spatial_dims
        widths = [config.channels * 2**level for level in range(config.levels)]
        self.encoders = nn.ModuleList(
            ConvBlock(c_in, c_out, config.kernel_size, dims, config.padding)
            for c_in, c_out in zip([shape.in_channels, *widths[:-1]], widths)
        )
        self.decoders = nn.ModuleList(
            ConvBlock(
                widths[level + 1] + widths[level], widths[level], config.kernel_size, dims, config.padding
            )
            for level in reversed(range(config.levels - 1))
        )
        self.output = CONVOLUTIONS[dims](widths[0], shape.out_channels, kernel_size=1)
        if config.residual:
            zero_layer(self.output_layer())

    def output_layer(self) -> nn.Module:
        """The layer that writes the update (zeroed at the start of a residual model)."""
        return self.output

    def forward(self, inputs: ModelInput) -> ModelOutput:
        return frames_prediction(inputs, self.shape, self.config.residual, self.network)

    def network(self, hidden: Tensor) -> Tensor:
        """Stacked frames (B, history * C, *space) -> stacked update (B, horizon * C, *space)."""
        dims = self.shape.spatial_dims
        if min(hidden.shape[-dims:]) < 2 ** (self.config.levels - 1):
            raise ConfigError(
                f"a U-Net with {self.config.levels} levels needs >= {2 ** (self.config.levels - 1)} grid "
                f"points per axis, got {tuple(hidden.shape[-dims:])}; lower model.levels"
            )
        skips = []
        for level, encoder in enumerate(self.encoders):
            if level > 0:
                hidden = POOLING[dims](hidden, kernel_size=2)
            hidden = encoder(hidden)
            skips.append(hidden)
        for decoder, skip in zip(self.decoders, reversed(skips[:-1])):
            hidden = nn.functional.interpolate(
                hidden, size=skip.shape[-dims:], mode=UPSAMPLING[dims], align_corners=False
            )
            hidden = decoder(torch.cat([hidden, skip], dim=1))
        return self.output(hidden)
