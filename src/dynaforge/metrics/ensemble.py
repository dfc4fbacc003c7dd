"""Scores of an ensemble of predictions against the truth (pure functions).

The spread-skill functions take the ensemble's spread (the standard deviation across members, with
Bessel's correction), its mean and the truth, shaped (batch, frames, channels, *space); RMS values are taken
over channels and space. A calibrated ensemble of M members (truth and members exchangeable draws) has
E[spread^2] = sigma^2 and E[error of the mean^2] = sigma^2 (1 + 1/M): its spread-skill ratio
RMS spread / RMS error is sqrt(M / (M + 1)), and 1 after the finite-ensemble factor sqrt((M + 1) / M)
that `members` applies (Fortin et al., "Why should ensemble spread match the RMSE of the ensemble mean?",
J. Hydrometeorology 2014). Undefined values (no error, or a spread or an error that does not vary) are NaN.
"""

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


def rms_per_frame(
    fields: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, "batch frames"]:
    """Root mean square over channels and space of each (sample, frame), in float32 or wider."""
    wide = fields if fields.dtype == torch.float64 else fields.float()
    return wide.square().flatten(2).mean(dim=-1).sqrt()


def finite_ensemble_factor(members: int | None) -> float:
    """sqrt((M + 1) / M) for M members (see the module docstring); 1 when `members` is None."""
    if members is None:
        return 1.0
    if members < 2:
        raise ConfigError(f"a spread needs an ensemble of at least 2 members, got {members}")
    return math.sqrt((members + 1) / members)


def spread_skill_ratio(
    spread: Float[Tensor, "batch frames channels *space"],
    mean: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    members: int | None = None,
) -> float:
    """RMS spread / RMS error of the ensemble mean, both over every sample, frame, channel and point, times
    the finite-ensemble factor for `members` members: 1 for a calibrated ensemble, below 1 for an
    overconfident one (its spread understates its error), above 1 for an underconfident one."""
    spread_ms = rms_per_frame(spread).square().mean()
    error_ms = rms_per_frame(mean - truth).square().mean()
    if float(error_ms) == 0:
        return math.nan
    return float((spread_ms / error_ms).sqrt()) * finite_ensemble_factor(members)


def spread_skill_per_frame(
    spread: Float[Tensor, "batch frames channels *space"],
    mean: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    members: int | None = None,
) -> Float[Tensor, " frames"]:
    """`spread_skill_ratio` of each frame (rollout step) over the samples; NaN where the error is 0."""
    spread_ms = rms_per_frame(spread).square().mean(dim=0)
    error_ms = rms_per_frame(mean - truth).square().mean(dim=0)
    ratio = (spread_ms / error_ms.clamp_min(torch.finfo(error_ms.dtype).tiny)).sqrt()
    undefined = torch.full_like(ratio, math.nan)
    return torch.where(error_ms > 0, ratio * finite_ensemble_factor(members), undefined)


def pearson(a: Float[Tensor, " n"], b: Float[Tensor, " n"]) -> float:
    """Pearson correlation of two series; NaN when either is constant."""
    a, b = a.double() - a.double().mean(), b.double() - b.double().mean()
    denominator = math.sqrt(float(a.square().sum()) * float(b.square().sum()))
    return float((a * b).sum()) / denominator if denominator > 0 else math.nan


def spread_error_correlation_per_frame(
    spread: Float[Tensor, "batch frames channels *space"],
    mean: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> list[float]:
    """For each frame, the Pearson correlation across samples of the RMS spread and the RMS error of the
    mean: does the spread tell which trajectories are wrong at that step? NaN where undefined (one sample,
    or a spread or an error equal for every sample)."""
    spread_rms, error_rms = rms_per_frame(spread), rms_per_frame(mean - truth)
    return [pearson(spread_rms[:, t], error_rms[:, t]) for t in range(spread_rms.shape[1])]


def spread_error_correlation(
    spread: Float[Tensor, "batch frames channels *space"],
    mean: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> float:
    """Pearson correlation, over every (sample, frame), of the ensemble's RMS spread and the RMS error of
    its mean: near 1 when the spread tells where the rollout is wrong; NaN when either is constant."""
    return pearson(rms_per_frame(spread).flatten(), rms_per_frame(mean - truth).flatten())
