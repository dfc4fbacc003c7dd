"""Spectral convolution in real arithmetic: rfft, real matrix products on the kept modes, inverse rfft.

The complex weights are stored as a (real, imaginary) pair of real tensors and the complex product is
written as one real matrix product per mode on stacked [real, imaginary] parts, so that the layer holds no complex parameters (optimisers, weight decay,
bf16 casts and ONNX export all see plain real tensors).

Kept modes: on the last axis the lowest `m` rfft frequencies; on every other axis the lowest `m` and the
highest `m` FFT frequencies (the positive and negative ones), gathered into one block of 2m. A single
weight tensor (in, out, 2 m_1, ..., 2 m_{d-1}, m_d) therefore covers every corner in any dimension; 1D is
the case d = 1 (one block of m modes).

The FFTs run in float32 with autocast off (CPU FFTs reject half precision); the result is cast back to the
input's dtype.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from jaxtyping import Float
from torch import Tensor, nn


class SpectralConv(nn.Module):
    """Multiply the lowest Fourier modes of each input channel by learned complex weights, per mode."""

    def __init__(self, in_channels: int, out_channels: int, modes: Sequence[int]) -> None:
        super().__init__()
        self.in_channels, self.out_channels = in_channels, out_channels
        self.modes = tuple(int(m) for m in modes)
        block = (*(2 * m for m in self.modes[:-1]), self.modes[-1])
        # Li et al.'s scale: outputs start small, so each block begins close to its pointwise path.
        scale = 1.0 / (in_channels * out_channels)
        self.weight_real = nn.Parameter(
            scale * torch.rand(in_channels, out_channels, *block, dtype=torch.float32)
        )
        self.weight_imag = nn.Parameter(
            scale * torch.rand(in_channels, out_channels, *block, dtype=torch.float32)
        )

    @property
    def spatial_dims(self) -> int:
        return len(self.modes)

    def forward(
        self, x: Float[Tensor, "batch in_channels *space"]
    ) -> Float[Tensor, "batch out_channels *space"]:
        size = tuple(x.shape[-self.spatial_dims :])
        self.check_size(size)
        axes = tuple(range(-self.spatial_dims, 0))
        with torch.autocast(device_type=x.device.type, enabled=False):
            spectrum = torch.fft.rfftn(x.float(), dim=axes)  # (B, in, *spectral) complex
            kept = torch.cat([self.gather_modes(spectrum.real), self.gather_modes(spectrum.imag)], dim=1)
            mixed = mix_modes(kept, self.block_weight())  # (B, 2 out, *kept): real parts, then imaginary
            spectral_size = (*size[:-1], size[-1] // 2 + 1)
            real = self.scatter_modes(mixed[:, : self.out_channels], spectral_size)
            imag = self.scatter_modes(mixed[:, self.out_channels :], spectral_size)
            result = torch.fft.irfftn(torch.complex(real, imag), s=size, dim=axes)
        return result.to(x.dtype)

    def block_weight(self) -> Float[Tensor, "kept two_in two_out"]:
        """The complex weights as one real matrix per kept mode, [[W_r, W_i], [-W_i, W_r]].

        For a mode's input row [a, b] (real parts, then imaginary), [a, b] @ block = [a W_r - b W_i,
        a W_i + b W_r]: the real and imaginary parts of (a + i b)(W_r + i W_i).
        """
        real = self.weight_real.float().flatten(2).permute(2, 0, 1)  # (K, in, out)
        imag = self.weight_imag.float().flatten(2).permute(2, 0, 1)
        return torch.cat([torch.cat([real, imag], dim=2), torch.cat([-imag, real], dim=2)], dim=1)

    def check_size(self, size: tuple[int, ...]) -> None:
        for axis, (n, m) in enumerate(zip(size, self.modes)):
            last = axis == self.spatial_dims - 1
            limit = n // 2 + 1 if last else n // 2
            if m > limit:
                raise ValueError(
                    f"a grid of {n} points on spatial axis {axis} has only {limit} usable modes but the layer "
                    f"keeps {m}; lower model.modes to <= {limit} or use a finer grid"
                )

    def gather_modes(self, spectrum: Tensor) -> Tensor:
        """(B, C, *spectral) -> (B, C, 2 m_1, ..., m_d): the kept low (and negative) frequencies."""
        kept = spectrum[..., : self.modes[-1]]
        for axis, m in enumerate(self.modes[:-1]):
            dim = 2 + axis
            kept = torch.cat([kept.narrow(dim, 0, m), kept.narrow(dim, kept.shape[dim] - m, m)], dim=dim)
        return kept

    def scatter_modes(self, block: Tensor, spectral_size: tuple[int, ...]) -> Tensor:
        """The inverse of `gather_modes`: put the block back in a zero spectrum of `spectral_size`."""
        full = nn.functional.pad(block, (0, spectral_size[-1] - self.modes[-1]))
        for axis, m in enumerate(self.modes[:-1]):
            dim = 2 + axis
            gap = list(full.shape)
            gap[dim] = spectral_size[axis] - 2 * m
            zeros = torch.zeros(gap, dtype=full.dtype, device=full.device)
            full = torch.cat([full.narrow(dim, 0, m), zeros, full.narrow(dim, m, m)], dim=dim)
        return full


def mix_modes(
    kept: Float[Tensor, "batch two_in *kept"], block: Float[Tensor, "k two_in two_out"]
) -> Float[Tensor, "batch two_out *kept"]:
    """A separate (2 in x 2 out) real matrix per kept mode: one batched matrix product over the modes."""
    modes_first = kept.flatten(2).permute(2, 0, 1)  # (K, B, 2 in)
    mixed = torch.bmm(modes_first, block)  # (K, B, 2 out)
    return mixed.permute(1, 2, 0).unflatten(2, kept.shape[2:])
