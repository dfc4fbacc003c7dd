"""Summaries of an error curve over a rollout's predicted frames, and the correlation with the truth.

Sources:
- Geometric mean of the rollout nRMSE over the first `horizon` predicted frames: APEBench (Koehler et al.,
  NeurIPS 2024), `aggregate_gmean` in `apebench/_utils.py` (scipy's `gmean` of the per-step mean nRMSE over
  steps 1 .. `up_to`, default 100).
- Time windows of a rollout: The Well's trainer (`split_up_losses` / `temporal_split_losses` in
  `the_well/benchmark/trainer/training.py`): boundaries [0] + [int(exp(x)) for x in linspace(0, log T, n)],
  n = min(T, 5), and the metric averaged over each window.
- Correlation time: Kochkov et al. (PNAS 2021, "Machine learning-accelerated computational fluid
  dynamics", Fig. 2), the time until the correlation of the prediction with the truth drops below a
  threshold (0.95 there).
- High-correlation time: PDE-Refiner (Lippe et al., NeurIPS 2023, Sec. 4.1 and App. D): per test trajectory,
  the Pearson correlation of prediction and truth over every grid point (and channel) of a step, and the
  time until it first falls below 0.8; reported as the mean over trajectories.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Bool, Float, Int
from torch import Tensor

from dynaforge.errors import ConfigError
from dynaforge.metrics.fields import EPS, check_same_shape, root, space_axes, space_mean, widen

WELL_TIME_INTERVALS = 5
"""The Well trainer's default `num_time_intervals`."""
CORRELATION_THRESHOLD = 0.95
"""Kochkov et al.'s threshold for the "high correlation" duration."""
HIGH_CORRELATION_THRESHOLD = 0.8
"""PDE-Refiner's threshold for the high-correlation time."""


def geometric_mean(curve: Float[Tensor, " frames"], horizon: int | None = None) -> float:
    """exp(mean(log v)) over the first `horizon` values (all when None). A zero value gives 0."""
    values = widen(curve)[: horizon if horizon is not None else len(curve)]
    if len(values) == 0:
        raise ConfigError("the geometric mean needs at least one frame")
    return float(torch.exp(torch.log(values).mean()))


def well_time_windows(frames: int, intervals: int = WELL_TIME_INTERVALS) -> list[tuple[int, int]]:
    """The Well's rollout windows [start, stop) over `frames` predicted frames (log-spaced boundaries).

    The last boundary is set to `frames` (int(exp(log T)) can round down to T - 1) and repeated
    boundaries are merged, so the windows are non-empty and cover every frame.
    """
    if frames < 1:
        raise ConfigError(f"need at least one frame, got {frames}")
    n = min(frames, intervals)
    boundaries = [0] + [int(math.exp(x)) for x in np.linspace(0, math.log(frames), n)]
    boundaries[-1] = frames
    ordered = sorted(set(boundaries))
    return list(itertools.pairwise(ordered))


def window_means(curve: Float[Tensor, " frames"], windows: list[tuple[int, int]]) -> dict[str, float]:
    """{"start:stop": mean of the curve over frames [start, stop)} (0-based predicted-frame indices)."""
    return {f"{lo}:{hi}": float(widen(curve)[lo:hi].mean()) for lo, hi in windows}


def correlation_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    fluid: Tensor | None = None,
) -> Float[Tensor, " frames"]:
    """Pearson correlation of prediction and truth over the grid (its `fluid` cells when given, a mask
    (batch, frames, 1, *space)), per sample, frame and channel, averaged over samples and channels. A
    constant frame (zero variance) has correlation 0."""
    check_same_shape(prediction, truth)
    p, u = widen(prediction), widen(truth)
    axes = space_axes(p)
    expand = (*p.shape[:3], *[1] * len(axes))
    p = p - space_mean(p, fluid).reshape(expand)
    u = u - space_mean(u, fluid).reshape(expand)
    if fluid is not None:  # deviations outside the fluid do not count
        p, u = torch.where(fluid, p, 0.0), torch.where(fluid, u, 0.0)
    covariance = (p * u).sum(dim=axes)
    scale = root(p.square().sum(dim=axes) * u.square().sum(dim=axes))
    return (covariance / scale.clamp_min(EPS)).mean(dim=(0, 2))


class CorrelationTime(NamedTuple):
    """How long a rollout stays correlated with the truth."""

    frames: int
    """Predicted frames, from the first, whose correlation is at least the threshold."""
    time: float | None
    """`frames` times the time between predicted frames (None when that time is unknown)."""
    censored: bool
    """True when the correlation never dropped below the threshold: the true time is at least `time`."""
    threshold: float


def correlation_time(
    correlation: Float[Tensor, " frames"],
    threshold: float = CORRELATION_THRESHOLD,
    frame_dt: float | None = None,
) -> CorrelationTime:
    """The time of the last predicted frame before the correlation first drops below `threshold`
    (0 when the first predicted frame is already below it)."""
    below = torch.nonzero(widen(correlation) < threshold)
    frames = int(below[0, 0]) if len(below) else len(correlation)
    return CorrelationTime(
        frames=frames,
        time=frames * frame_dt if frame_dt is not None else None,
        censored=len(below) == 0,
        threshold=threshold,
    )


def pearson_per_sample_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    fluid: Tensor | None = None,
) -> Float[Tensor, "batch frames"]:
    """Pearson correlation of prediction and truth per sample and frame, over every grid point and channel of
    the frame together (PDE-Refiner's definition; `correlation_per_frame` instead takes each channel apart);
    over the `fluid` cells only when given (a mask (batch, frames, 1, *space)).

    Undefined (NaN) where either field is constant over the frame (zero variance): a constant prediction
    carries no pattern to correlate, and `high_correlation_steps` counts such a frame as decorrelated.
    """
    check_same_shape(prediction, truth)
    p = widen(prediction).flatten(start_dim=2)  # (B, T, C * space)
    u = widen(truth).flatten(start_dim=2)
    if fluid is None:
        p = p - p.mean(dim=2, keepdim=True)
        u = u - u.mean(dim=2, keepdim=True)
    else:
        weights = fluid.expand_as(prediction).flatten(start_dim=2).to(p.dtype)
        count = weights.sum(dim=2, keepdim=True).clamp_min(1.0)
        p = (p - (p * weights).sum(dim=2, keepdim=True) / count) * weights
        u = (u - (u * weights).sum(dim=2, keepdim=True) / count) * weights
    covariance = (p * u).sum(dim=2)
    scale = root(p.square().sum(dim=2) * u.square().sum(dim=2))  # gradient 0, not NaN, at a constant frame
    defined = scale > 0
    return torch.where(defined, covariance / torch.where(defined, scale, 1.0), torch.nan)


class HighCorrelationSteps(NamedTuple):
    """Per sample, how many predicted frames stay correlated with the truth."""

    steps: Int[Tensor, " batch"]
    """Predicted frames, from the first, whose correlation is at least the threshold."""
    censored: Bool[Tensor, " batch"]
    """True where the correlation never fell below the threshold within the rollout: the sample's true
    high-correlation time is at least `steps` (the rollout's length), not equal to it."""


def high_correlation_steps(
    correlation: Float[Tensor, "batch frames"], threshold: float = HIGH_CORRELATION_THRESHOLD
) -> HighCorrelationSteps:
    """Leading frames whose correlation is >= `threshold`, per sample. An undefined (NaN) correlation ends
    the run like one below the threshold."""
    kept = widen(correlation) >= threshold  # NaN compares False
    steps = kept.to(torch.int64).cumprod(dim=1).sum(dim=1)
    return HighCorrelationSteps(steps=steps, censored=steps == correlation.shape[1])


def mean_and_stderr(values: Sequence[float] | Sequence[int]) -> tuple[float, float | None]:
    """Mean and its standard error, std (with Bessel's correction) / sqrt(n); None for one value."""
    array = np.asarray(values, dtype=np.float64)
    if array.size == 0:
        raise ConfigError("the mean needs at least one value")
    if array.size == 1:
        return float(array[0]), None
    return float(array.mean()), float(array.std(ddof=1) / math.sqrt(array.size))


def high_correlation_summary(
    correlation: Float[Tensor, "batch frames"],
    threshold: float = HIGH_CORRELATION_THRESHOLD,
    frame_dt: float | None = None,
) -> dict[str, Any]:
    """The high-correlation time per sample and as mean ± standard error, in steps and (when `frame_dt`, the
    time between predicted frames, is known) in time units; JSON-ready. When any sample is censored, the
    means are lower bounds (`censored_samples` says how many)."""
    run = high_correlation_steps(correlation, threshold)
    steps = [int(v) for v in run.steps]
    mean_steps, stderr_steps = mean_and_stderr(steps)
    scale = frame_dt if frame_dt is not None else math.nan
    return {
        "threshold": threshold,
        "frame_dt": frame_dt,
        "frames": int(correlation.shape[1]),
        "steps": steps,
        "time": [s * frame_dt for s in steps] if frame_dt is not None else None,
        "censored": [bool(v) for v in run.censored],
        "censored_samples": int(run.censored.sum()),
        "undefined_frames": int(torch.isnan(correlation).sum()),
        "mean_steps": mean_steps,
        "stderr_steps": stderr_steps,
        "mean_time": mean_steps * scale if frame_dt is not None else None,
        "stderr_time": stderr_steps * scale if frame_dt is not None and stderr_steps is not None else None,
    }
