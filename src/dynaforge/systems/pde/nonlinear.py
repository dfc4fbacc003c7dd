"""The nonlinear terms the spectral PDEs share (`spectral.py`), and the zero-padded spectra they are
formed from: the conservative quadratic term -(u^2 / 2)_x of Burgers and Kuramoto-Sivashinsky, formed on a
fast product grid (`product_grid_size`), and `zero_padded`, the reused buffer a dealiased inverse
transform pads the 2/3 band into."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from torch import Tensor

Nonlinear = Callable[[Tensor], Tensor]
"""Maps a spectral state to the spectrum of its nonlinear term N(u)."""


@runtime_checkable
class Grid(Protocol):
    """What a nonlinear term reads of its system (`spectral.SpectralSystem`): the grid and its 2/3 band."""

    shape: Sequence[int]

    def kept_band(self) -> int: ...


class ZeroPadded(threading.local):
    """Each worker thread's zero-padded spectra, by shape, band width, dtype, device and inference mode
    (`zero_padded`)."""

    def __init__(self) -> None:
        # Each buffer with the view of its leading columns that calls write: indexing the buffer anew on
        # every call cost 4.5 us of Python (as much as the copy; 64 x 171 complex64 values, AMD EPYC).
        self.buffers: dict[
            tuple[tuple[int, ...], int, torch.dtype, torch.device, bool], tuple[Tensor, Tensor]
        ] = {}


ZERO_PADDED = ZeroPadded()
PADDED_KEPT = 8
"""Shapes of zero-padded spectra kept per thread (a rollout uses one or two)."""


def zero_padded(band: Tensor, width: int) -> Tensor:
    """`band` zero-padded along its last axis to `width` columns, in a buffer of this thread that is reused:
    every call writes the same leading columns (the 2/3 band) and the caller reads the result at once, so
    the columns past them stay zero. A buffer is kept per band width too: two systems whose padded spectra
    have one shape but whose bands differ (Burgers N = 256 keeps 86 of 129 columns, Kuramoto-Sivashinsky
    N = 200 on the same 256-point product grid 67) would otherwise see the wider band's stale columns
    (found on a GPU: a KS batch after a Burgers one differed from the same batch split, by 2e-6). This
    replaces the zero-filled copy `irfft(band, n=...)` makes on every
    call (about 7% of a 2D Kuramoto-Sivashinsky step: the fill, the copy and the allocation); the values are
    the same. Writing into it is in place on purpose (a preallocated buffer in the hot loop). A band that
    carries gradients gets a fresh padded tensor (a shared buffer would be overwritten before backward)."""
    if band.requires_grad:
        return F.pad(band, (0, width - band.shape[-1]))
    shape = (*band.shape[:-1], width)
    key = (shape, band.shape[-1], band.dtype, band.device, torch.is_inference_mode_enabled())
    kept = ZERO_PADDED.buffers.get(key)
    if kept is None:
        if len(ZERO_PADDED.buffers) >= PADDED_KEPT:
            ZERO_PADDED.buffers.clear()
        buffer = torch.zeros(shape, dtype=band.dtype, device=band.device)
        kept = ZERO_PADDED.buffers[key] = (buffer, buffer[..., : band.shape[-1]])
    buffer, leading = kept
    leading.copy_(band)
    return buffer


def conservative_quadratic(system: Grid) -> Nonlinear:
    """R(v) of N(u) = -(u^2 / 2)_x = `quadratic_multiplier` * R(v) in Fourier space with 2/3 dealiasing (1D).

    The state is truncated to the kept modes before the product and the product is truncated again (the
    multiplier holds the mask), so aliases of the quadratic term land only on discarded modes.

    The product is formed on a grid of `product_grid_size(n)` >= n points rather than on the n-point grid:
    with K kept modes (0 .. K-1, 3 (K-1) < n), u^2 holds modes up to 2 (K-1), whose aliases on any grid of
    n' >= n points fall at |m| >= n' - 2 (K-1) > K-1, outside the kept modes, so the kept modes of N are the
    same, up to rounding, as on the n-point grid. FFT libraries are several times faster on lengths 2^a or
    3 * 2^a, and the truncated spectrum is zero-padded by `irfft(..., n=n')` for free, which also replaces
    the mask product before the square.
    """
    n = system.shape[-1]
    kept = system.kept_band()
    modes = n // 2 + 1
    grid = product_grid_size(n)

    # On its own grid (n = 2^a or 3 * 2^a) the product's spectrum is the modes wanted: no slice is taken
    # (a view of every column would be the same values, 1-2 us of Python more per call).
    sliced = grid != n

    def nonlinear(v: Tensor) -> Tensor:
        u = torch.fft.irfft(zero_padded(v[..., :kept], grid // 2 + 1), n=grid)  # on the product grid
        spectrum = torch.fft.rfft(u * u)
        return spectrum[..., :modes] if sliced else spectrum

    return nonlinear


def quadratic_multiplier(system: Grid, k: Tensor, mask: Tensor) -> Tensor:
    """M = -(i k / 2) mask (n' / n) of `conservative_quadratic` (complex128).

    Moving between the n- and n'-point grids rescales both transforms (numpy's normalisation: 1/n on the
    inverse); the net factor on FFT_n'(IFFT_n'(v)^2) is n' / n."""
    n = system.shape[-1]
    return -0.5j * k.to(torch.float64) * mask * (product_grid_size(n) / n)


def product_grid_size(n: int) -> int:
    """The smallest length 2^a or 3 * 2^a that is >= n (a fast FFT length; see `conservative_quadratic`)."""
    size = 1
    while size < n:
        size *= 2
    three_halves = 3 * size // 4  # 3 * 2^(a-2), between size / 2 and size
    return three_halves if size >= 4 and three_halves >= n else size
