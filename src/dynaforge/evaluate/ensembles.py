"""Ensembles in an evaluation: does the spread of an ensemble of rollouts say how wrong its mean is?

Any stochastic rollout gives an ensemble: repeat it with independent noise (the latent stack's corrector and
its distilled student, `dynaforge.evaluate.stack_report.stack_ensembles`; any other sampler the same way).
`ensemble_scores` turns the members' physical rollouts into one entry of metrics.json's `ensembles`
section, {"members": M, "variants": {name: scores}}, and the report draws every entry alike
(`spread_error_figure`) and states its figures in a sentence (`ensemble_sentence`):
- `spread_per_step`, `error_per_step`: the RMS spread (std across members) and the RMS error of the
  ensemble mean, over channels and space, averaged over the test trajectories, per rollout step;
- `spread_skill_per_step` and `spread_skill_ratio`: RMS spread / RMS error times sqrt((M + 1) / M), per
  step and over the whole rollout (1: calibrated; below 1: the spread understates the error);
- `correlation_per_step`: across trajectories, the Pearson correlation of spread and error at each step;
  `spread_error_correlation`: over every (trajectory, step) (does the spread track where and when the
  rollout goes wrong?);
- `spread_samples`, `error_samples`: the (trajectory, step) points of the scatter.
Undefined values (a spread that does not vary, no error) are null in metrics.json (JSON has no NaN).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import numpy as np
from jaxtyping import Float
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from torch import Tensor

from dynaforge.evaluate.plots import label_axes
from dynaforge.metrics.ensemble import (
    rms_per_frame,
    spread_error_correlation,
    spread_error_correlation_per_frame,
    spread_skill_per_frame,
    spread_skill_ratio,
)
from dynaforge.metrics.fields import nrmse_per_frame

ENSEMBLE_MEMBERS = 4
"""Members of each ensemble an evaluation rolls out."""


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


def ensemble_scores(
    members: Float[Tensor, "members batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    label: str,
) -> dict[str, Any]:
    """One ensemble's entry of metrics.json (see the module docstring); physical units. `label`: how the
    report names it."""
    count = members.shape[0]
    wide = members.float()
    mean, spread = wide.mean(dim=0), wide.std(dim=0)
    truth = truth.float()
    spread_rms, error_rms = rms_per_frame(spread), rms_per_frame(mean - truth)  # (N, T)
    return {
        "label": label,
        "members": count,
        "spread_per_step": spread_rms.mean(dim=0).tolist(),
        "error_per_step": error_rms.mean(dim=0).tolist(),
        "spread_skill_per_step": [
            finite_or_none(v) for v in spread_skill_per_frame(spread, mean, truth, count).tolist()
        ],
        "spread_skill_ratio": finite_or_none(spread_skill_ratio(spread, mean, truth, count)),
        "correlation_per_step": [
            finite_or_none(v) for v in spread_error_correlation_per_frame(spread, mean, truth)
        ],
        "spread_error_correlation": finite_or_none(spread_error_correlation(spread, mean, truth)),
        "mean_nrmse": float(nrmse_per_frame(mean, truth).mean()),
        "spread_samples": spread_rms.flatten().tolist(),
        "error_samples": error_rms.flatten().tolist(),
    }


def ensembles_section(variants: Mapping[str, dict[str, Any]], members: int) -> dict[str, Any]:
    """metrics.json's `ensembles`: name -> `ensemble_scores` of each ensemble."""
    return {"members": members, "variants": dict(variants)}


def ensemble_sentence(row: Mapping[str, Any], frame_dt: float | None = None) -> str:
    """The entry's figures in words, for the report."""
    ratio, correlation = row["spread_skill_ratio"], row["spread_error_correlation"]
    steps = len(row["error_per_step"])
    horizon = f"{steps} steps" + (f" ({steps * frame_dt:.4g} time units)" if frame_dt else "")
    per_step = [(i + 1, v) for i, v in enumerate(row["spread_skill_per_step"]) if v is not None]
    if ratio is None:
        calibration = "the spread-skill ratio is undefined (the ensemble mean has no error)"
    else:
        verdict = "about right" if 0.8 <= ratio <= 1.25 else "too small" if ratio < 0.8 else "too large"
        calibration = (
            f"its spread-skill ratio is {ratio:.3g} (1 when the spread matches the error; the spread is "
            f"{verdict})"
        )
        if len(per_step) > 1:
            (first, low), (last, high) = per_step[0], per_step[-1]
            calibration += f", {low:.3g} at step {first} and {high:.3g} at step {last}"
    if correlation is None:
        tracking = (
            "the correlation of spread and error is undefined (the spread or the error does not vary over "
            "trajectories and steps)"
        )
    else:
        tracking = f"spread and error correlate with r = {correlation:.3g} over every (trajectory, step)"
    return (
        f"{row['label']}, {row['members']} members over {horizon}: {calibration}; {tracking}; the ensemble "
        f"mean's nRMSE is {row['mean_nrmse']:.3g} (mean over steps)."
    )


def spread_error_figure(section: Mapping[str, Any], frame_dt: float | None) -> Figure:
    """Every ensemble of the section, one colour each: RMS error of the mean (solid) and RMS spread (dashed)
    against rollout time (left), the spread-skill ratio per step with the calibrated line at 1 (middle), and
    one point per (trajectory, step) of spread against error with the diagonal (right); one legend below."""
    figure = Figure(figsize=(14, 5), layout="constrained")
    curves, ratios, scatter = figure.subplots(1, 3)
    unit = "time after the last input frame" if frame_dt else "rollout step"
    handles: list[Line2D] = []
    largest = 0.0
    for index, row in enumerate(section["variants"].values()):
        color = f"C{index}"
        steps = np.arange(1, len(row["error_per_step"]) + 1, dtype=np.float64)
        x = steps * frame_dt if frame_dt else steps
        curves.plot(x, row["error_per_step"], color=color)
        curves.plot(x, row["spread_per_step"], color=color, linestyle="--")
        ratio = [np.nan if v is None else v for v in row["spread_skill_per_step"]]
        ratios.plot(x, ratio, color=color, marker="o", markersize=3)
        scatter.scatter(row["spread_samples"], row["error_samples"], s=6, alpha=0.4, color=color)
        largest = max(largest, *row["spread_samples"], *row["error_samples"])
        r = row["spread_error_correlation"]
        ratio_all = row["spread_skill_ratio"]
        handles.append(
            Line2D(
                [],
                [],
                color=color,
                label=f"{row['label']}: spread-skill ratio "
                f"{'undefined' if ratio_all is None else format(ratio_all, '.3g')}, "
                f"r = {'undefined' if r is None else format(r, '.3g')}",
            )
        )
    ratios.axhline(1.0, color="gray", linestyle=":")
    scatter.plot([0, largest], [0, largest], color="gray", linestyle=":")
    handles += [
        Line2D([], [], color="gray", label="error of the ensemble mean"),
        Line2D([], [], color="gray", linestyle="--", label="ensemble spread"),
        Line2D([], [], color="gray", linestyle=":", label="calibrated: ratio 1, spread = error"),
    ]
    label_axes(curves, unit, "RMS (units of the field)", f"{section['members']}-member ensembles")
    label_axes(ratios, unit, "spread-skill ratio", "Spread / error x sqrt((M+1)/M)")
    label_axes(scatter, "ensemble spread (RMS)", "error of the mean (RMS)", "Each (trajectory, step)")
    figure.legend(handles=handles, loc="outside lower center", ncols=2, fontsize="small")
    return figure
