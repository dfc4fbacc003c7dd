"""Per-trajectory summary features of 2D fields, computed batched (torch, float32) during generation.

For a trajectory u(t, c, x, y) on the periodic grid (grid units, spacing 1), averaged over channels:
- `mean`, `std`, `skewness`, `kurtosis`: spatial moments per frame, averaged over frames;
- `gradient_energy`: mean |grad u|^2 (central differences), averaged over frames;
- `laplacian_energy`: mean (laplacian u)^2 (5-point stencil), averaged over frames;
- `spectrum_0 .. spectrum_{B-1}`: the final frame's power spectrum summed in B equal radial bins of
  |m| in [0, n/2], as fractions of the total power;
- `energy_growth_rate`: least-squares slope of log(mean u^2) against the frame index;
- `autocorrelation_time`: frames until the temporal autocorrelation of the fluctuation u - mean_t(u),
  summed over the grid, first falls below 1/e (linearly interpolated; T - 1 if it never does).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

MOMENTS = ("mean", "std", "skewness", "kurtosis")
EPS = 1e-12


def feature_names(spectrum_bins: int) -> tuple[str, ...]:
    spectrum = tuple(f"spectrum_{b}" for b in range(spectrum_bins))
    return (
        *MOMENTS,
        "gradient_energy",
        "laplacian_energy",
        *spectrum,
        "energy_growth_rate",
        "autocorrelation_time",
    )


def trajectory_features(
    frames: Float[Tensor, "batch time channels x y"], spectrum_bins: int
) -> Float[Tensor, "batch features"]:
    """Every feature of `feature_names(spectrum_bins)`, in that order (float32)."""
    u = frames.to(torch.float32)
    columns = [
        *spatial_moments(u),
        gradient_energy(u),
        laplacian_energy(u),
        *radial_spectrum(u[:, -1], spectrum_bins).unbind(dim=1),
        energy_growth_rate(u),
        autocorrelation_time(u),
    ]
    return torch.stack(columns, dim=1)


def spatial_moments(u: Tensor) -> list[Tensor]:
    mean = u.mean(dim=(-1, -2), keepdim=True)
    centred = u - mean
    var = centred.pow(2).mean(dim=(-1, -2))
    std = var.sqrt()
    skew = centred.pow(3).mean(dim=(-1, -2)) / (std**3 + EPS)
    kurt = centred.pow(4).mean(dim=(-1, -2)) / (var**2 + EPS)
    return [v.mean(dim=(1, 2)) for v in (mean[..., 0, 0], std, skew, kurt)]


def gradient_energy(u: Tensor) -> Tensor:
    dx = (torch.roll(u, -1, dims=-2) - torch.roll(u, 1, dims=-2)) / 2
    dy = (torch.roll(u, -1, dims=-1) - torch.roll(u, 1, dims=-1)) / 2
    return (dx**2 + dy**2).mean(dim=(1, 2, 3, 4))


def laplacian_energy(u: Tensor) -> Tensor:
    lap = (
        torch.roll(u, 1, dims=-2)
        + torch.roll(u, -1, dims=-2)
        + torch.roll(u, 1, dims=-1)
        + torch.roll(u, -1, dims=-1)
        - 4 * u
    )
    return lap.pow(2).mean(dim=(1, 2, 3, 4))


def radial_spectrum(u: Float[Tensor, "batch channels x y"], bins: int) -> Float[Tensor, "batch bins"]:
    n_x, n_y = u.shape[-2], u.shape[-1]
    power = torch.fft.rfft2(u).abs().pow(2).sum(dim=1)  # (batch, X, Y//2+1)
    power[..., 1 : (n_y + 1) // 2] *= 2  # in place on a fresh tensor: count the mirrored half-plane
    mx = torch.fft.fftfreq(n_x, d=1.0 / n_x, dtype=torch.float32, device=u.device)
    my = torch.fft.rfftfreq(n_y, d=1.0 / n_y, dtype=torch.float32, device=u.device)
    radius = torch.sqrt(mx[:, None] ** 2 + my[None, :] ** 2)
    edges = torch.linspace(0, min(n_x, n_y) / 2, bins + 1, dtype=torch.float32, device=u.device)
    index = torch.bucketize(radius, edges[1:-1], right=True).reshape(-1)  # radii beyond n/2 join the last bin
    binned = torch.zeros((u.shape[0], bins), dtype=torch.float32, device=u.device)
    binned = binned.index_add(1, index, power.reshape(u.shape[0], -1))
    return binned / (binned.sum(dim=1, keepdim=True) + EPS)


def energy_growth_rate(u: Tensor) -> Tensor:
    energy = torch.log(u.pow(2).mean(dim=(2, 3, 4)) + EPS)  # (batch, time)
    t = torch.arange(u.shape[1], dtype=torch.float32, device=u.device)
    t = t - t.mean()
    return ((energy - energy.mean(dim=1, keepdim=True)) * t).sum(dim=1) / (t.pow(2).sum() + EPS)


def autocorrelation_time(u: Tensor) -> Tensor:
    n_t = u.shape[1]
    fluctuation = (u - u.mean(dim=1, keepdim=True)).flatten(2)  # (batch, time, cells)
    spectrum = torch.fft.rfft(fluctuation, n=2 * n_t, dim=1)
    acf = torch.fft.irfft(spectrum.abs().pow(2), n=2 * n_t, dim=1)[:, :n_t].sum(dim=2)  # (batch, lags)
    acf = acf / (acf[:, :1] + EPS)
    threshold = 1.0 / math.e
    below = acf < threshold
    first = torch.where(
        below.any(dim=1), below.float().argmax(dim=1), torch.full_like(acf[:, 0], n_t - 1).long()
    )
    prev = (first - 1).clamp(min=0)
    a = acf.gather(1, prev[:, None])[:, 0]
    b = acf.gather(1, first[:, None])[:, 0]
    fraction = ((a - threshold) / (a - b + EPS)).clamp(0, 1)
    crossed = below.any(dim=1)
    return torch.where(crossed, prev.float() + fraction, torch.full_like(a, float(n_t - 1)))
