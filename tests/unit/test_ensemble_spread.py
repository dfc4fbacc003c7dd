"""Spread against skill of an ensemble (dynaforge.metrics.ensemble, dynaforge.evaluate.ensembles): analytic
cases, a calibrated ensemble drawn at random, undefined cases, metrics.json entries and the figure."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dynaforge.errors import ConfigError
from dynaforge.evaluate.ensembles import (
    ensemble_scores,
    ensemble_sentence,
    ensembles_section,
    spread_error_figure,
)
from dynaforge.evaluate.plots import figure_to_png
from dynaforge.evaluate.report import ensembles_html
from dynaforge.metrics.ensemble import (
    spread_error_correlation,
    spread_error_correlation_per_frame,
    spread_skill_per_frame,
    spread_skill_ratio,
)


def growing(batch: int, frames: int, points: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """(B, T, 1, X) fields of RMS (b + 1) * (t + 1): an error that grows with the step and differs by sample."""
    x = torch.linspace(0, 2 * math.pi, points + 1, dtype=torch.float64)[:-1]
    wave = math.sqrt(2) * torch.sin(3 * x)  # RMS 1
    scale = (torch.arange(batch, dtype=torch.float64)[:, None] + 1) * (torch.arange(frames) + 1)
    return (scale[:, :, None, None] * wave).to(dtype)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 5, 7), (2, 1, 9)])
def test_spread_equal_to_the_error_gives_ratio_one_and_correlation_one(
    dtype: torch.dtype, shape: tuple[int, int, int]
) -> None:
    batch, frames, points = shape
    error = growing(batch, frames, points, dtype)
    truth = torch.randn((batch, frames, 1, points), generator=torch.Generator().manual_seed(0)).to(dtype)
    mean = truth + error
    spread = error.flip(-1)  # another field with the same RMS at every (sample, step)
    assert spread_skill_ratio(spread, mean, truth) == pytest.approx(1.0, rel=1e-2)
    per_step = spread_skill_per_frame(spread, mean, truth)
    assert per_step.shape == (frames,) and torch.allclose(per_step, torch.ones(frames), rtol=1e-2)
    assert spread_error_correlation(spread, mean, truth) == pytest.approx(1.0, abs=1e-3)
    # across samples at each step: the spread ranks the samples as the error does
    assert spread_error_correlation_per_frame(spread, mean, truth) == pytest.approx([1.0] * frames, abs=1e-3)
    # half the spread: ratio 1/2, the correlation is unchanged (it ignores the scale)
    assert spread_skill_ratio(spread / 2, mean, truth) == pytest.approx(0.5, rel=1e-2)
    assert spread_error_correlation(spread / 2, mean, truth) == pytest.approx(1.0, abs=1e-3)


def test_constant_spread_against_growing_error_has_no_correlation() -> None:
    error = growing(4, 6, 16)
    truth = torch.zeros_like(error)
    spread = torch.full_like(error, 2.0)
    assert math.isnan(spread_error_correlation(spread, error, truth))  # the spread never varies
    assert all(math.isnan(r) for r in spread_error_correlation_per_frame(spread, error, truth))
    # the ratio stays defined: constant spread 2 against RMS errors (b + 1)(t + 1)
    rms_error = (torch.arange(1, 5.0)[:, None] * torch.arange(1, 7.0)).square().mean().sqrt()
    assert spread_skill_ratio(spread, error, truth) == pytest.approx(float(2 / rms_error), rel=1e-5)
    # a nearly constant spread: correlation near 0, not undefined
    wobble = spread + 1e-3 * torch.randn(error.shape, generator=torch.Generator().manual_seed(1))
    assert abs(spread_error_correlation(wobble, error, truth)) < 0.5
    # no error at all: the ratio is undefined, not infinite
    assert math.isnan(spread_skill_ratio(spread, truth, truth))
    assert torch.isnan(spread_skill_per_frame(spread, truth, truth)).all()


def test_a_calibrated_ensemble_has_ratio_one_after_the_finite_ensemble_factor() -> None:
    """Truth and M members exchangeable draws of the same Gaussian: RMS spread / RMS error ->
    sqrt(M / (M + 1)); the factor makes it 1. 20000 draws per member: the ratio's sampling error is
    about 0.005 (measured: 1.0003 for M = 4, seed 0), tolerance 0.02."""
    generator = torch.Generator().manual_seed(0)
    members = 4
    draws = torch.randn((members + 1, 50, 4, 1, 100), generator=generator, dtype=torch.float64)
    ensemble, truth = draws[:members], draws[members]
    mean, spread = ensemble.mean(dim=0), ensemble.std(dim=0)
    raw = spread_skill_ratio(spread, mean, truth)
    assert raw == pytest.approx(math.sqrt(members / (members + 1)), abs=0.02)
    assert spread_skill_ratio(spread, mean, truth, members) == pytest.approx(1.0, abs=0.02)
    assert spread_skill_per_frame(spread, mean, truth, members) == pytest.approx([1.0] * 4, abs=0.03)
    with pytest.raises(ConfigError, match="at least 2 members"):
        spread_skill_ratio(spread, mean, truth, 1)


def test_per_step_ratio_has_a_gradient_and_no_nan() -> None:
    spread = torch.rand((2, 3, 2, 5, 5), dtype=torch.float32, requires_grad=True)
    mean, truth = torch.randn((2, 3, 2, 5, 5)), torch.randn((2, 3, 2, 5, 5))
    ratio = spread_skill_per_frame(spread, mean, truth, 4)
    ratio.sum().backward()
    assert spread.grad is not None and torch.isfinite(spread.grad).all() and torch.isfinite(ratio).all()


def test_ensemble_scores_are_json_with_null_for_undefined_values_and_the_report_draws_them() -> None:
    truth = growing(3, 5, 8)
    # members spread evenly around truth + error: their std equals the error at every (sample, step)
    error = growing(3, 5, 8)
    offsets = torch.tensor([-1.0, 1.0], dtype=torch.float32).view(2, 1, 1, 1, 1) / math.sqrt(2)
    members = truth + error + offsets * error.flip(-1)
    row = ensemble_scores(members, truth, "matched ensemble")
    assert row["spread_skill_ratio"] == pytest.approx(math.sqrt(3 / 2), rel=1e-3)  # x sqrt((M+1)/M), M = 2
    assert row["spread_error_correlation"] == pytest.approx(1.0, abs=1e-3)
    steps = 5
    for key in ("spread_per_step", "error_per_step", "spread_skill_per_step", "correlation_per_step"):
        assert len(row[key]) == steps, key
    assert len(row["spread_samples"]) == len(row["error_samples"]) == 3 * steps
    flat = ensemble_scores(torch.stack([truth, truth]), truth, "no spread, no error")
    assert flat["spread_skill_ratio"] is None and flat["spread_error_correlation"] is None
    assert flat["correlation_per_step"] == [None] * steps
    section = ensembles_section({"matched": row, "flat": flat}, 2)
    assert json.loads(json.dumps(section, allow_nan=False)) == section  # strict JSON: no NaN
    sentence = ensemble_sentence(row, frame_dt=0.5)
    assert "spread-skill ratio is 1.22" in sentence and "r = 1" in sentence and "2.5 time units" in sentence
    assert "undefined" in ensemble_sentence(flat)
    figure = spread_error_figure(section, frame_dt=0.5)
    assert [a.get_xlabel() for a in figure.axes[:2]] == ["time after the last input frame"] * 2
    png = figure_to_png(figure)
    page = ensembles_html(section, [("caption", png)], 0.5)
    assert "Ensembles: spread against error" in page and "matched ensemble" in page
    assert page.count("data:image/png;base64,") == 1
    assert ensembles_html(None, []) == ""
