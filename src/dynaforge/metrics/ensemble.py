"""Scores of an ensemble of predictions against the truth (pure functions)."""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.errors import ConfigError


def energy_score(
    samples: Float[Tensor, "members batch *rest"], truth: Float[Tensor, " batch *rest"]
) -> Float[Tensor, " batch"]:
    """The energy score (a proper scoring rule; lower is better) with RMS distances:
    mean_i d(X_i, y) - 1/2 mean_{i != j} d(X_i, X_j). It rewards the right spread, not just the mean."""
    members = samples.shape[0]
    if members < 2:
        raise ConfigError("the energy score needs at least 2 samples")

    def rms(x: Tensor) -> Tensor:
        return x.float().square().flatten(1).mean(dim=1).sqrt()

    skill = torch.stack([rms(s - truth) for s in samples]).mean(dim=0)
    pairs = [rms(samples[i] - samples[j]) for i in range(members) for j in range(i + 1, members)]
    return skill - 0.5 * torch.stack(pairs).mean(dim=0)


def spread_error_correlation(
    spread: Float[Tensor, "batch frames channels *space"],
    mean: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> float:
    """Pearson correlation, over every (sample, frame), of the ensemble's RMS spread and the RMS error of
    its mean: near 1 when the spread tells where the rollout is wrong."""
    spread_rms = spread.float().square().flatten(2).mean(dim=-1).sqrt().flatten()
    error_rms = (mean - truth).float().square().flatten(2).mean(dim=-1).sqrt().flatten()
    a, b = spread_rms - spread_rms.mean(), error_rms - error_rms.mean()
    denominator = math.sqrt(float(a.square().sum()) * float(b.square().sum()))
    return float((a * b).sum()) / denominator if denominator > 0 else math.nan
