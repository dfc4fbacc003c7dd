"""A small 1D U-Net baseline with periodic (circular) padding, GroupNorm and GELU.

Encoder: at each level two convolutions, then average pooling by 2 (odd sizes are floored).
Decoder: upsample (linear) to the skip connection's exact size, concatenate, two convolutions.
Any grid size of at least 2^(levels-1) points works, odd ones included.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import UNetConfig
from dynaforge.models.base import (
    ModelInput,
    ModelOutput,
    ModelShape,
    check_input,
    frames_to_stack,
    stack_to_frames,
    update_to_output,
)


class ConvBlock(nn.Module):
    """Two [circular conv, GroupNorm, GELU] layers."""

    def __init__(self, in_channels: int, out_channels: int, kernel_size: int) -> None:
        super().__init__()
        padding = kernel_size // 2
        self.layers = nn.Sequential(
            nn.Conv1d(in_channels, out_channels, kernel_size, padding=padding, padding_mode="circular"),
            nn.GroupNorm(groups_for(out_channels), out_channels),
            nn.GELU(),
            nn.Conv1d(out_channels, out_channels, kernel_size, padding=padding, padding_mode="circular"),
            nn.GroupNorm(groups_for(out_channels), out_channels),
            nn.GELU(),
        )

    def forward(self, x: Float[Tensor, "batch c_in x"]) -> Float[Tensor, "batch c_out x"]:
        return self.layers(x)


def groups_for(channels: int) -> int:
    """The largest of 8, 4, 2, 1 groups that divides `channels`."""
    return next(g for g in (8, 4, 2, 1) if channels % g == 0)


class UNet(nn.Module):
    """U-Net over one periodic spatial axis; see the module docstring."""

    def __init__(self, config: UNetConfig, shape: ModelShape) -> None:
        super().__init__()
        if shape.spatial_dims != 1:
            raise ValueError(f"the U-Net is 1D only, got data with {shape.spatial_dims} spatial axes")
        self.config, self.shape = config, shape
        widths = [config.channels * 2**level for level in range(config.levels)]
        self.encoders = nn.ModuleList(
            ConvBlock(c_in, c_out, config.kernel_size)
            for c_in, c_out in zip([shape.in_channels, *widths[:-1]], widths)
        )
        self.decoders = nn.ModuleList(
            ConvBlock(widths[level + 1] + widths[level], widths[level], config.kernel_size)
            for level in reversed(range(config.levels - 1))
        )
        self.output = nn.Conv1d(widths[0], shape.out_channels, kernel_size=1)
        if config.residual:
            nn.init.zeros_(self.output.weight)
            nn.init.zeros_(self.output.bias)

    def forward(self, inputs: ModelInput) -> ModelOutput:
        check_input(inputs, self.shape)
        size = inputs.frames.shape[-1]
        if size < 2 ** (self.config.levels - 1):
            raise ValueError(
                f"a U-Net with {self.config.levels} levels needs >= {2 ** (self.config.levels - 1)} grid "
                f"points, got {size}; lower model.levels"
            )
        hidden = frames_to_stack(inputs.frames)
        skips = []
        for level, encoder in enumerate(self.encoders):
            if level > 0:
                hidden = nn.functional.avg_pool1d(hidden, kernel_size=2)
            hidden = encoder(hidden)
            skips.append(hidden)
        for decoder, skip in zip(self.decoders, reversed(skips[:-1])):
            hidden = nn.functional.interpolate(
                hidden, size=skip.shape[-1], mode="linear", align_corners=False
            )
            hidden = decoder(torch.cat([hidden, skip], dim=1))
        update = stack_to_frames(self.output(hidden), self.shape.channels)
        return update_to_output(inputs, update, self.config.residual)
