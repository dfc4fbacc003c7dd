"""Errors in Fourier space, and energy spectra. Fields are (batch, frames, channels, *space), predicted
frames only, on uniform grids whose spatial axes are the trailing ones.

Sources:
- PDEBench `metric_func` (`pdebench/models/metrics.py`, `err_F`; Takamoto et al. 2022, App. D): the
  Fourier-band RMSE, low / mid / high bands of wavenumber shells split at `iLow` = 4 and `iHigh` = 12.
- The Well `binned_spectral_mse` (`the_well/benchmark/metrics/spectral.py`; Ohana et al. 2024, Sec. 4): the
  MSE restricted to three logarithmically spaced bins of isotropic wavenumber, and its version normalised by
  the truth's energy in the bin.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.errors import ConfigError
from dynaforge.metrics.fields import WELL_EPS, check_same_shape, root, space_axes, widen

PDEBENCH_BANDS = (4, 12)
"""PDEBench's defaults `iLow`, `iHigh`: shells [0, 4) are low, [4, 12) mid, [12, end) high."""
BAND_NAMES = ("low", "mid", "high")


def power(modes: Tensor) -> Tensor:
    """|z|^2 of complex Fourier modes (as re^2 + im^2: a finite gradient at z = 0)."""
    return modes.real.square() + modes.imag.square()


def floor_shells(indices: Sequence[np.ndarray]) -> Tensor:
    """The shell floor(sqrt(sum_a i_a^2)) of every point of the outer product of `indices` (one integer
    array per axis), flattened in C order: int64 (points,)."""
    grids = np.meshgrid(*indices, indexing="ij")
    radius = np.floor(np.sqrt(sum(g.astype(np.float64) ** 2 for g in grids)))
    return torch.from_numpy(radius.astype(np.int64).ravel())


def sum_over_shells(values: Tensor, shell: Tensor, shells: int, dims: int) -> Tensor:
    """(..., *grid) -> (..., shells): the sum of `values` over the points of each shell; `shell` (points,)
    gives every grid point's shell, and points whose shell is `shells` or more are left out."""
    flat = values.flatten(values.ndim - dims)
    keep = torch.nonzero(shell < shells).squeeze(-1).to(flat.device)
    index = shell.to(flat.device)[keep]
    empty = torch.zeros((*flat.shape[:-1], shells), dtype=flat.dtype, device=flat.device)
    return empty.index_add(-1, index, flat.index_select(-1, keep))


def pdebench_fourier_errors(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    lengths: Sequence[float],
) -> Float[Tensor, "frames channels shells"]:
    """PDEBench's per-shell Fourier error (`_err_F` in `metric_func`), before the bands are formed.

    1D: sqrt(mean over samples of |FFT(p - u)_k|^2) / X * L for every rfft mode k = 0 .. X // 2.
    2D/3D: |FFT(p - u)|^2 summed over shells floor(|(i, j[, k])|) of the first quadrant (octant) of
    indices i < X // 2, j < Y // 2, ..., shells up to min(X, Y[, Z]) // 2 - 1; then sqrt(mean over samples)
    / (X Y [Z]) * L_x L_y [L_z]. `lengths` are the domain lengths (PDEBench's `Lx`, `Ly`, `Lz`).
    """
    check_same_shape(prediction, truth)
    error = widen(prediction) - widen(truth)
    axes = space_axes(error)
    sizes = [error.shape[a] for a in axes]
    if len(lengths) != len(axes):
        raise ConfigError(f"need one domain length per spatial axis ({len(axes)}), got {list(lengths)}")
    scale = math.prod(lengths) / math.prod(sizes)
    if len(axes) == 1:
        energy = power(torch.fft.rfft(error, dim=-1))  # (B, F, C, X // 2 + 1)
    else:
        spectrum = power(torch.fft.fftn(error, dim=axes))
        quadrant = spectrum[(..., *(slice(0, n // 2) for n in sizes))]
        shells = min(n // 2 for n in sizes)
        energy = sum_over_shells(
            quadrant, floor_shells([np.arange(n // 2) for n in sizes]), shells, len(axes)
        )
    return root(energy.mean(dim=0)) * scale


def fourier_band_rmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    lengths: Sequence[float],
    bands: tuple[int, int] = PDEBENCH_BANDS,
) -> dict[str, Tensor | None]:
    """PDEBench Fourier-band RMSE (`metric_func`, `err_F`): the per-shell errors of
    `pdebench_fourier_errors` averaged over the shells of each band, low [0, iLow), mid [iLow, iHigh) and
    high [iHigh, end), then over channels: {"low", "mid", "high"} -> (frames,). A band with no shell (a grid
    too coarse for it) is None, where PDEBench would return NaN."""
    low, high = bands
    if not 0 < low < high:
        raise ConfigError(f"Fourier bands need 0 < low < high, got {bands}")
    shells = pdebench_fourier_errors(prediction, truth, lengths)
    edges = (0, low, high, shells.shape[-1])
    result: dict[str, Tensor | None] = {}
    for name, start, stop in zip(BAND_NAMES, edges[:-1], edges[1:]):
        band = shells[..., start:stop]
        result[name] = band.mean(dim=-1).mean(dim=-1) if band.shape[-1] > 0 else None
    return result


# ---- The Well ----------------------------------------------------------------------------------------


def well_wavenumbers(sizes: Sequence[int]) -> Tensor:
    """|k| of every FFT mode, k_a = 2 pi fftfreq(n_a) (grid spacing 1), flattened; float32 as The Well."""
    grids = torch.meshgrid(
        *[2 * np.pi * torch.fft.fftfreq(n, d=1.0, dtype=torch.float32) for n in sizes], indexing="ij"
    )
    return torch.sqrt(sum(g.square() for g in grids)).flatten()


def well_bin_edges(sizes: Sequence[int]) -> Tensor:
    """The Well's default bins: 4 edges log-spaced from 2 pi / max(n) to pi sqrt(d) + 1e-6, the first
    replaced by 0, giving three bins (low, mid, high) that hold every mode. float32, as The Well makes them."""
    edges = torch.logspace(
        math.log10(2 * math.pi / max(sizes)),
        math.log10(math.pi * math.sqrt(len(sizes)) + 1e-6),
        4,
        dtype=torch.float32,
    )
    return torch.cat([torch.zeros(1, dtype=torch.float32), edges[1:]])


def well_bins(sizes: Sequence[int]) -> Tensor:
    """The bin of every FFT mode, flattened: i where edges[i] <= |k| < edges[i + 1] (int64, 0 .. 3; bin 3,
    past the last edge, is empty with the default edges and dropped as in The Well)."""
    return torch.bucketize(well_wavenumbers(sizes), well_bin_edges(sizes), right=True) - 1


def binned_spectral_errors(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> tuple[Float[Tensor, "batch frames channels 3"], Float[Tensor, "batch frames channels 3"]]:
    """The Well's `binned_spectral_mse`: per sample, frame, channel and bin, the MSE of the error's modes
    in the bin, sum |FFT(p - u)|^2 / (points)^2 (bins summing to the MSE, by Parseval), and that divided by
    the truth's energy in the bin plus 1e-7 (`spectral_error_nmse_per_bin`). The Well divides a bin's sum
    by (count + 1e-7) and multiplies it back by count: a relative change below 1e-7, left out here."""
    check_same_shape(prediction, truth)
    wide = widen(truth)
    error = widen(prediction) - wide
    axes = space_axes(error)
    sizes = [error.shape[a] for a in axes]
    bins = well_bins(sizes)
    points = math.prod(sizes)
    error_energy = sum_over_shells(power(torch.fft.fftn(error, dim=axes)), bins, 3, len(axes))
    truth_energy = sum_over_shells(power(torch.fft.fftn(wide, dim=axes)), bins, 3, len(axes))
    mse = error_energy / points**2
    return mse, mse / (truth_energy / points**2 + WELL_EPS)


def binned_spectral_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> dict[str, Tensor]:
    """The Well's binned spectral MSE and normalised MSE per frame, averaged over samples and fields:
    {"mse_low", "mse_mid", "mse_high", "nmse_low", "nmse_mid", "nmse_high"} -> (frames,)."""
    mse, nmse = binned_spectral_errors(prediction, truth)
    result = {}
    for i, name in enumerate(BAND_NAMES):
        result[f"mse_{name}"] = mse[..., i].mean(dim=(0, 2))
        result[f"nmse_{name}"] = nmse[..., i].mean(dim=(0, 2))
    return result


# ---- energy spectra ------------------------------------------------------------------------------------


def energy_spectrum(
    fields: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, "batch frames channels shells"]:
    """E(k) = 1/2 sum over modes with round(|m|) = k of |u_m|^2, u_m = FFT(u) / points, m the integer
    (signed) wavenumbers in cycles per domain; shells k = 0 .. min(n) // 2 (modes past the last shell,
    the corners of a 2D grid, are left out). Parseval: sum_k E(k) is half the mean of u^2 over the grid
    when no mode is left out."""
    wide = widen(fields)
    axes = space_axes(wide)
    sizes = [wide.shape[a] for a in axes]
    shells = min(sizes) // 2 + 1
    grids = np.meshgrid(*[np.rint(np.fft.fftfreq(n) * n) for n in sizes], indexing="ij")
    shell = torch.from_numpy(np.rint(np.sqrt(sum(g**2 for g in grids))).astype(np.int64).ravel())
    modes = torch.fft.fftn(wide, dim=axes) / math.prod(sizes)
    return 0.5 * sum_over_shells(power(modes), shell, shells, len(axes))


SPECTRUM_RANGE = 1e-6
"""Shells whose true energy is below this fraction of the peak are left out of the spectrum error."""


def spectrum_distance(
    e_pred: Float[Tensor, " shells"], e_true: Float[Tensor, " shells"], spectrum_range: float = SPECTRUM_RANGE
) -> float:
    """Mean |log10 e_pred - log10 e_true| over shells k >= 1 whose true energy exceeds `spectrum_range`
    times the peak (the energetic shells: the dissipation range's round-off does not count)."""
    keep = e_true > spectrum_range * e_true.max()
    keep[0] = False
    if not bool(keep.any()):
        return math.nan
    return float((torch.log10(e_pred[keep] + 1e-30) - torch.log10(e_true[keep])).abs().mean())
