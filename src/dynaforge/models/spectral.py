"""Spectral convolution in real arithmetic: rfft, real matrix products on the kept modes, inverse rfft.

The complex weights are stored as a (real, imaginary) pair of real tensors and the complex product is
written as one real matrix product per mode on stacked [real, imaginary] parts, so that the layer holds no complex parameters (optimisers, weight decay,
bf16 casts and ONNX export all see plain real tensors).

Kept modes: on the last axis the lowest `m` rfft frequencies; on every other axis the lowest `m` and the
highest `m` FFT frequencies (the positive and negative ones), gathered into one block of 2m. A single
weight tensor (in, out, 2 m_1, ..., 2 m_{d-1}, m_d) therefore covers every corner in any dimension; 1D is
the case d = 1 (one block of m modes).

Two ways to the kept modes, equal up to float rounding (`transform`):
- `fft`: rfftn, gather the kept modes, mix, scatter into a zero spectrum, irfftn. The FFTs run in float32
  with autocast off (CPU FFTs reject half precision); the result is cast back to the input's dtype.
- `dft`: truncated DFT matrices (`dynaforge.models.dft`): one real matrix product per spatial axis to the
  kept modes and one back, with no gather, scatter or complex tensors. Cheaper when few modes are kept and
  it compiles and exports as plain matrix products. It runs in float32 with autocast off too, unless
  `low_precision` lets autocast run its products in bf16 (measured in benchmarks/train_fno.py).
- `auto`: `dft` when every axis keeps at most a quarter of its grid points as modes (see `DFT_MAX_FRACTION`),
  `fft` otherwise; decided per call from the grid size.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import Literal, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.errors import ConfigError
from dynaforge.models.dft import fft_matrices, irfft_matrix, rfft_matrix
from dynaforge.store.layout import channels_first_to_last, channels_last_to_first

Transform = Literal["auto", "fft", "dft"]
TRANSFORMS: tuple[str, ...] = ("auto", "fft", "dft")
SpectralInit = Literal["small", "normal"]
SPECTRAL_INITS: tuple[str, ...] = ("small", "normal")
"""Ways to compute the kept modes; see the module docstring."""

DFT_MAX_FRACTION = 0.25
"""`auto` uses the DFT matrices when modes <= this fraction of the grid points on every axis."""


class AxisBases(NamedTuple):
    """A full (complex) axis's DFT matrices, to multiply from the left (the axis second to last): forward
    cos, sin (2m, n); inverse cos / n, sin / n (n, 2m)."""

    cos: Tensor
    sin: Tensor
    inverse_cos: Tensor
    inverse_sin: Tensor


class DFTBases(NamedTuple):
    """Every matrix of the `dft` path for one grid size, to multiply from the left: the last (rfft) axis
    and the other axes."""

    forward_last: Tensor  # (2 m_d, n_d)
    inverse_last: Tensor  # (n_d, 2 m_d)
    axes: tuple[AxisBases, ...]


class SpectralConv(nn.Module):
    """Multiply the lowest Fourier modes of each input channel by learned complex weights, per mode."""

    def __init__(
        self,
        in_channels: int,
        out_channels: int,
        modes: Sequence[int],
        transform: Transform = "fft",
        low_precision: bool = False,
        init: SpectralInit = "small",
    ) -> None:
        super().__init__()
        if init not in SPECTRAL_INITS:
            raise ConfigError(f"init must be one of {', '.join(SPECTRAL_INITS)}, got {init!r}")
        if transform not in TRANSFORMS:
            raise ConfigError(f"transform must be one of {', '.join(TRANSFORMS)}, got {transform!r}")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.modes = tuple(int(m) for m in modes)
        self.transform = transform
        self.low_precision = low_precision
        # DFT matrices per (grid size, device), built on first use; plain tensors, not state (a checkpoint
        # holds the same weights whichever transform computes the layer).
        self.dft_cache: dict[tuple[tuple[int, ...], torch.device], DFTBases] = {}
        block = (*(2 * m for m in self.modes[:-1]), self.modes[-1])
        if init == "small":
            # Li et al.'s scale: outputs start small, so each block begins close to its pointwise path.
            scale = 1.0 / (in_channels * out_channels)
            draw = torch.rand
        else:
            # Complex weights of standard deviation sqrt(2 / (in + out)) (Glorot's), split evenly between
            # the real and imaginary parts: the spectral path starts as strong as the pointwise one.
            scale = (1.0 / (in_channels + out_channels)) ** 0.5
            draw = torch.randn
        self.weight_real = nn.Parameter(scale * draw(in_channels, out_channels, *block, dtype=torch.float32))
        self.weight_imag = nn.Parameter(scale * draw(in_channels, out_channels, *block, dtype=torch.float32))

    @property
    def spatial_dims(self) -> int:
        return len(self.modes)

    def forward(
        self, x: Float[Tensor, "batch in_channels *space"]
    ) -> Float[Tensor, "batch out_channels *space"]:
        size = tuple(x.shape[-self.spatial_dims :])
        self.check_size(size)
        if self.chosen_transform(size) == "dft":
            return channels_last_to_first(self.forward_dft(channels_first_to_last(x, lead=1)), lead=1)
        return self.forward_fft(x)

    def chosen_transform(self, size: tuple[int, ...]) -> Literal["fft", "dft"]:
        """The transform a grid of `size` gets (`auto` decides by the fraction of modes kept)."""
        if self.transform != "auto":
            return self.transform  # type: ignore[return-value]
        few = all(m <= DFT_MAX_FRACTION * n for n, m in zip(size, self.modes))
        return "dft" if few else "fft"

    def forward_fft(
        self, x: Float[Tensor, "batch in_channels *space"]
    ) -> Float[Tensor, "batch out_channels *space"]:
        size = tuple(x.shape[-self.spatial_dims :])
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

    def forward_channels_last(
        self, h: Float[Tensor, "batch *space in_channels"]
    ) -> Float[Tensor, "batch *space out_channels"]:
        """The layer on channels-last fields (what the FNO keeps between its blocks)."""
        size = tuple(h.shape[1:-1])
        self.check_size(size)
        if self.chosen_transform(size) == "dft":
            return self.forward_dft(h)
        return channels_first_to_last(self.forward_fft(channels_last_to_first(h, lead=1)), lead=1)

    def forward_dft(
        self, h: Float[Tensor, "batch *space in_channels"]
    ) -> Float[Tensor, "batch *space out_channels"]:
        """The layer through truncated DFT matrices, channels last: per axis one matrix product to the kept
        modes and one back, contracting the spatial axis (second to last) of the channels-last layout."""
        bases = self.dft_bases(tuple(h.shape[1:-1]), h.device)
        if self.low_precision:
            precision, inputs = contextlib.nullcontext(), h  # autocast (if on) runs the products
        else:
            precision, inputs = torch.autocast(device_type=h.device.type, enabled=False), h.float()
        with precision:
            spectrum = bases.forward_last @ inputs  # (B, ..., 2 m_d, in): real parts, then imaginary
            m = self.modes[-1]
            real, imag = spectrum[..., :m, :], spectrum[..., m:, :]
            for axis, axis_bases in enumerate(bases.axes):
                real, imag = fft_along(real, imag, 1 + axis, axis_bases)
            kept = torch.cat([real, imag], dim=-1)  # (B, *kept, 2 in)
            mixed = mix_modes_channels_last(kept, self.block_weight())  # (B, *kept, 2 out)
            real, imag = mixed[..., : self.out_channels], mixed[..., self.out_channels :]
            for axis, axis_bases in reversed(list(enumerate(bases.axes))):
                real, imag = ifft_along(real, imag, 1 + axis, axis_bases)
            result = bases.inverse_last @ torch.cat([real, imag], dim=-2)  # (B, ..., n_d, out)
        return result.to(h.dtype)

    def dft_bases(self, size: tuple[int, ...], device: torch.device) -> DFTBases:
        """The DFT matrices of a grid of `size`: cached in eager mode, built inside the graph when compiled
        or exported (a few small constant ops that the compiler folds or fuses)."""
        if torch.compiler.is_compiling():
            return build_dft_bases(size, self.modes, device)
        key = (size, device)
        if key not in self.dft_cache:
            self.dft_cache[key] = build_dft_bases(size, self.modes, device)
        return self.dft_cache[key]

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
                raise ConfigError(
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


def build_dft_bases(size: tuple[int, ...], modes: tuple[int, ...], device: torch.device) -> DFTBases:
    """Every DFT matrix of the `dft` path for a grid of `size` keeping `modes` (transposed, contiguous)."""
    axes = []
    for n, m in zip(size[:-1], modes[:-1]):
        cos, sin = fft_matrices(n, m, device)  # (n, 2m)
        axes.append(AxisBases(cos.T.contiguous(), sin.T.contiguous(), cos / n, sin / n))
    n, m = size[-1], modes[-1]
    forward, inverse = rfft_matrix(n, m, device), irfft_matrix(n, m, device)
    return DFTBases(forward.T.contiguous(), inverse.T.contiguous(), tuple(axes))


def fft_along(real: Tensor, imag: Tensor, dim: int, bases: AxisBases) -> tuple[Tensor, Tensor]:
    """The kept modes of a complex DFT along `dim` of channels-last parts: (a + i b) exp(-i t) =
    (a cos + b sin) + i (b cos - a sin)."""
    row = real.ndim - 2  # positive dims throughout: the TorchScript ONNX exporter mishandles negative ones
    a, b = real.movedim(dim, row), imag.movedim(dim, row)
    new_real = bases.cos @ a + bases.sin @ b
    new_imag = bases.cos @ b - bases.sin @ a
    return new_real.movedim(row, dim), new_imag.movedim(row, dim)


def ifft_along(real: Tensor, imag: Tensor, dim: int, bases: AxisBases) -> tuple[Tensor, Tensor]:
    """The inverse DFT along `dim` of kept modes (the others zero): (a + i b) exp(i t) / n."""
    row = real.ndim - 2  # positive dims throughout: the TorchScript ONNX exporter mishandles negative ones
    a, b = real.movedim(dim, row), imag.movedim(dim, row)
    new_real = bases.inverse_cos @ a - bases.inverse_sin @ b
    new_imag = bases.inverse_sin @ a + bases.inverse_cos @ b
    return new_real.movedim(row, dim), new_imag.movedim(row, dim)


def mix_modes_channels_last(
    kept: Float[Tensor, "batch *kept two_in"], block: Float[Tensor, "k two_in two_out"]
) -> Float[Tensor, "batch *kept two_out"]:
    """`mix_modes` on channels-last modes: one batched matrix product over the modes."""
    modes_first = kept.flatten(1, -2).transpose(0, 1)  # (K, B, 2 in)
    mixed = torch.bmm(modes_first, block)  # (K, B, 2 out)
    return mixed.transpose(0, 1).unflatten(1, kept.shape[1:-1])
