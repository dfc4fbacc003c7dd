"""Every metric of an evaluation, from predicted frames and their truth (never from input frames).

`score_predictions` scores one-step predictions (each window's predicted frames); `score_rollouts` scores
autoregressive rollouts: a curve per metric over the predicted frames, its mean, the geometric mean of the
nRMSE, The Well's window means, the correlation time, PDE-Refiner's per-sample high-correlation time, the
physics diagnostics and the worst samples. Both take the NamedTuples of `dynaforge.evaluate.rollout`; a
`Rollouts`' input frames are never read.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import torch
from torch import Tensor

from dynaforge.evaluate.rollout import Predictions, Rollouts
from dynaforge.metrics.fields import (
    brmse_per_frame,
    crmse_per_frame,
    fluid_fields,
    max_error_per_frame,
    nrmse_per_frame,
    nrmse_per_sample,
    rmse_per_frame,
    vrmse_per_frame,
)
from dynaforge.metrics.horizon import (
    CORRELATION_THRESHOLD,
    HIGH_CORRELATION_THRESHOLD,
    correlation_per_frame,
    correlation_time,
    geometric_mean,
    high_correlation_summary,
    pearson_per_sample_frame,
    well_time_windows,
    window_means,
)
from dynaforge.metrics.physics import (
    SPECTRUM_FLOOR,
    conserved_quantities,
    energy_drift_per_frame,
    mass_drift_per_frame,
    mean_spectrum,
    spectrum_error_per_frame,
)
from dynaforge.metrics.spectra import PDEBENCH_BANDS, binned_spectral_per_frame, fourier_band_rmse_per_frame


class MetricInfo(NamedTuple):
    label: str
    definition: str


METRICS: dict[str, MetricInfo] = {
    "rmse": MetricInfo("RMSE", "PDEBench metric_func err_RMSE: per-sample RMS error over the grid"),
    "nrmse": MetricInfo("nRMSE", "PDEBench metric_func err_nRMSE: per-sample RMSE / RMS of the true frame"),
    "crmse": MetricInfo(
        "cRMSE", "PDEBench metric_func err_CSV: RMS over samples of the error of the spatial mean"
    ),
    "brmse": MetricInfo("bRMSE", "PDEBench metric_func err_BD: RMS error on the boundary points of the grid"),
    "max_error": MetricInfo("max error", "PDEBench metric_func err_Max: max |error| over samples and grid"),
    "frmse_low": MetricInfo("fRMSE low", "PDEBench metric_func err_F: Fourier error, shells [0, iLow)"),
    "frmse_mid": MetricInfo("fRMSE mid", "PDEBench metric_func err_F: Fourier error, shells [iLow, iHigh)"),
    "frmse_high": MetricInfo("fRMSE high", "PDEBench metric_func err_F: Fourier error, shells [iHigh, end)"),
    "vrmse": MetricInfo("VRMSE", "The Well VRMSE: RMSE / sqrt(var(truth) + 1e-7)"),
    "spectral_mse_low": MetricInfo("spectral MSE low", "The Well binned_spectral_mse, low bin"),
    "spectral_mse_mid": MetricInfo("spectral MSE mid", "The Well binned_spectral_mse, mid bin"),
    "spectral_mse_high": MetricInfo("spectral MSE high", "The Well binned_spectral_mse, high bin"),
    "spectral_nmse_low": MetricInfo(
        "spectral nMSE low", "The Well binned_spectral_mse, low bin / true energy"
    ),
    "spectral_nmse_mid": MetricInfo(
        "spectral nMSE mid", "The Well binned_spectral_mse, mid bin / true energy"
    ),
    "spectral_nmse_high": MetricInfo(
        "spectral nMSE high", "The Well binned_spectral_mse, high bin / true energy"
    ),
    "correlation": MetricInfo(
        "correlation", "Pearson correlation with the truth over the grid (higher is better)"
    ),
    "spectrum_error": MetricInfo(
        "energy-spectrum error",
        "mean of |log10 E_pred(k) / E_true(k)| over the shells k >= 1 the data hold (E_true(k) at least "
        f"{SPECTRUM_FLOOR:g} of its largest; both floored there)",
    ),
    "mass_drift": MetricInfo("mass drift", "|spatial mean of prediction - of truth| (a conserved quantity)"),
    "energy_drift": MetricInfo(
        "energy drift", "|energy of prediction - of truth| / energy of truth (conserved)"
    ),
}
"""Every per-frame metric, in report order, with its label and definition (details in the functions)."""

PANELS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("relative errors", ("nrmse", "vrmse")),
    ("absolute errors", ("rmse", "brmse", "max_error", "crmse")),
    ("Fourier-band RMSE (PDEBench)", ("frmse_low", "frmse_mid", "frmse_high")),
    ("binned spectral MSE (The Well)", ("spectral_mse_low", "spectral_mse_mid", "spectral_mse_high")),
    ("binned spectral nMSE (The Well)", ("spectral_nmse_low", "spectral_nmse_mid", "spectral_nmse_high")),
    ("correlation with the truth", ("correlation",)),
    ("physics diagnostics", ("spectrum_error", "mass_drift", "energy_drift")),
)
"""How the report groups the metrics' curves into panels (every metric of METRICS is in one)."""


WINDOWED = (
    "vrmse",
    "nrmse",
    *(f"spectral_{kind}_{band}" for kind in ("mse", "nmse") for band in ("low", "mid", "high")),
)
"""Metrics also averaged over The Well's rollout windows (The Well reports VRMSE and the binned spectral
errors per window)."""


class MetricSettings(NamedTuple):
    """What the metrics need to know beyond the fields."""

    lengths: tuple[float, ...]
    """Domain length of every spatial axis (PDEBench's Lx, Ly, Lz, for the Fourier-band RMSE)."""
    fourier_bands: tuple[int, int] = PDEBENCH_BANDS
    """PDEBench's iLow and iHigh."""
    correlation_threshold: float = CORRELATION_THRESHOLD
    """Correlation below which a rollout is considered decorrelated."""
    high_correlation_threshold: float = HIGH_CORRELATION_THRESHOLD
    """PDE-Refiner's threshold of the per-sample high-correlation time."""
    gmean_horizon: int | None = None
    """Predicted frames the geometric mean of the rollout nRMSE covers (None: all)."""
    frame_dt: float | None = None
    """Time between predicted frames, when known."""
    system: str = ""
    """The dataset's system, for the conserved quantities (`dynaforge.metrics.physics.conserved_quantities`)."""
    worst_samples: int = 3
    """How many of the worst rollouts to list."""
    obstacle_channel: int | None = None
    """The channel holding an obstacle mask (the cylinder's `obstacle`), whose cells the metrics ignore
    (`dynaforge.metrics.fields.fluid_fields`: the mask channel is not scored, and the averaged metrics average
    over the fluid cells); None: every cell counts."""


def frame_curves(
    predicted: Tensor, truth: Tensor, settings: MetricSettings, fluid: Tensor | None = None
) -> dict[str, Tensor]:
    """Every metric of METRICS that applies, per predicted frame: name -> (frames,). Given `fluid` (the
    fields zeroed outside it, `fluid_fields`), the averages are over the fluid cells; the spectral metrics
    are those of the fields extended by zero into the obstacles (the error there is zero)."""
    curves = {
        "rmse": rmse_per_frame(predicted, truth, fluid),
        "nrmse": nrmse_per_frame(predicted, truth),
        "crmse": crmse_per_frame(predicted, truth, fluid),
        "brmse": brmse_per_frame(predicted, truth),
        "max_error": max_error_per_frame(predicted, truth),
    }
    bands = fourier_band_rmse_per_frame(predicted, truth, settings.lengths, settings.fourier_bands)
    curves.update({f"frmse_{band}": curve for band, curve in bands.items() if curve is not None})
    curves["vrmse"] = vrmse_per_frame(predicted, truth, fluid=fluid)
    curves.update({f"spectral_{k}": v for k, v in binned_spectral_per_frame(predicted, truth).items()})
    curves["correlation"] = correlation_per_frame(predicted, truth, fluid)
    curves["spectrum_error"] = spectrum_error_per_frame(predicted, truth)
    conserved = conserved_quantities(settings.system)
    if "mass" in conserved:
        curves["mass_drift"] = mass_drift_per_frame(predicted, truth)
    if "energy" in conserved:
        curves["energy_drift"] = energy_drift_per_frame(predicted, truth)
    return {name: curves[name] for name in METRICS if name in curves}


def score_predictions(predictions: Predictions, settings: MetricSettings) -> dict[str, float]:
    """One-step predictions: every metric averaged over the predicted frames (and windows)."""
    predicted, truth, fluid = fluid_fields(
        predictions.predicted, predictions.truth, settings.obstacle_channel
    )
    with torch.no_grad():
        curves = frame_curves(predicted, truth, settings, fluid)
    return {name: float(curve.mean()) for name, curve in curves.items()}


def score_rollouts(rollouts: Rollouts, settings: MetricSettings) -> dict[str, Any]:
    """Autoregressive rollouts, scored on `rollouts.predicted` against `rollouts.truth` only."""
    predicted, truth, fluid = fluid_fields(rollouts.predicted, rollouts.truth, settings.obstacle_channel)
    with torch.no_grad():
        curves = frame_curves(predicted, truth, settings, fluid)
        per_sample = nrmse_per_sample(predicted, truth).mean(dim=(1, 2))  # (N,)
        spectra = {"truth": mean_spectrum(truth), "predicted": mean_spectrum(predicted)}
        pearson = pearson_per_sample_frame(predicted, truth, fluid)  # (N, T)
    frames = predicted.shape[1]
    horizon = min(settings.gmean_horizon or frames, frames)
    windows = well_time_windows(frames)
    timing = correlation_time(curves["correlation"], settings.correlation_threshold, settings.frame_dt)
    worst = torch.argsort(per_sample, descending=True, stable=True)[: settings.worst_samples]
    return {
        "curves": {name: [float(v) for v in curve] for name, curve in curves.items()},
        "means": {name: float(curve.mean()) for name, curve in curves.items()},
        "nrmse_gmean": geometric_mean(curves["nrmse"], horizon),
        "gmean_horizon": horizon,
        "windows": {name: window_means(curves[name], windows) for name in WINDOWED if name in curves},
        "correlation_time": timing._asdict(),
        "high_correlation_time": high_correlation_time(pearson, settings),
        "conserved": list(conserved_quantities(settings.system)),
        "spectra": {
            "frames": [0, frames // 2, frames - 1],
            "truth": [[float(v) for v in spectra["truth"][f]] for f in (0, frames // 2, frames - 1)],
            "predicted": [[float(v) for v in spectra["predicted"][f]] for f in (0, frames // 2, frames - 1)],
        },
        "sample_nrmse": [float(v) for v in per_sample],
        "worst_samples": [{"index": int(i), "nrmse": float(per_sample[i])} for i in worst],
    }


def high_correlation_time(pearson: Tensor, settings: MetricSettings) -> dict[str, Any]:
    """PDE-Refiner's high-correlation time per sample with its mean ± standard error, and the mean
    correlation per predicted frame over the samples where it is defined (None where it is nowhere)."""
    summary = high_correlation_summary(pearson, settings.high_correlation_threshold, settings.frame_dt)
    curve = pearson.nanmean(dim=0)
    summary["mean_correlation"] = [None if torch.isnan(v) else float(v) for v in curve]
    return summary
