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
"""

from __future__ import annotations

import itertools
import math
from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.errors import ConfigError
from dynaforge.metrics.fields import EPS, check_same_shape, root, space_axes, widen

WELL_TIME_INTERVALS = 5
"""The Well trainer's default `num_time_intervals`."""
CORRELATION_THRESHOLD = 0.95
"""Kochkov et al.'s threshold for the "high correlation" duration."""


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
) -> Float[Tensor, " frames"]:
    """Pearson correlation of prediction and truth over the grid, per sample, frame and channel, averaged
    over samples and channels. A constant frame (zero variance) has correlation 0."""
    check_same_shape(prediction, truth)
    p, u = widen(prediction), widen(truth)
    axes = space_axes(p)
    p = p - p.mean(dim=axes, keepdim=True)
    u = u - u.mean(dim=axes, keepdim=True)
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
