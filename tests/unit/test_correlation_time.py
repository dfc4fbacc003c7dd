"""PDE-Refiner's high-correlation time: analytic cases, the censored and undefined edges, the standard error
against numpy, and the metric's forward and backward in float32 and bfloat16 on odd shapes."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dynaforge.metrics.horizon import (
    HIGH_CORRELATION_THRESHOLD,
    high_correlation_steps,
    high_correlation_summary,
    mean_and_stderr,
    pearson_per_sample_frame,
)


def random_fields(shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    return torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)


def test_identical_fields_correlate_fully_and_are_censored_at_the_rollout_length() -> None:
    truth = random_fields((3, 7, 2, 33))
    correlation = pearson_per_sample_frame(truth, truth)
    torch.testing.assert_close(correlation, torch.ones(3, 7))
    summary = high_correlation_summary(correlation, frame_dt=0.2)
    assert summary["steps"] == [7, 7, 7] and summary["censored"] == [True, True, True]
    assert summary["censored_samples"] == 3
    assert summary["mean_steps"] == 7.0 and summary["stderr_steps"] == 0.0
    assert summary["mean_time"] == pytest.approx(1.4) and summary["time"] == pytest.approx([1.4] * 3)


def test_negated_field_correlates_minus_one_and_a_scaled_one_plus_one() -> None:
    truth = random_fields((2, 4, 3, 17, 5))
    torch.testing.assert_close(pearson_per_sample_frame(-truth, truth), -torch.ones(2, 4))
    # Pearson is free of scale and offset: the whole frame, every channel, scaled by one constant.
    torch.testing.assert_close(pearson_per_sample_frame(3.5 * truth + 2.0, truth), torch.ones(2, 4))
    assert high_correlation_summary(pearson_per_sample_frame(-truth, truth))["steps"] == [0, 0]


def test_channels_are_pooled_not_averaged() -> None:
    """Channel 0 exact, channel 1 negated at 3x the amplitude: the pooled correlation is about
    (1 - 9) / (1 + 9) = -0.8, where the mean of the per-channel correlations would be 0."""
    truth = random_fields((1, 1, 2, 4096))
    truth = torch.cat([truth[:, :, :1], 3.0 * truth[:, :, 1:]], dim=2)
    prediction = torch.cat([truth[:, :, :1], -truth[:, :, 1:]], dim=2)
    p, u = prediction.flatten().double().numpy(), truth.flatten().double().numpy()
    expected = np.corrcoef(p, u)[0, 1]
    assert pearson_per_sample_frame(prediction, truth).item() == pytest.approx(expected, abs=1e-5)
    assert expected < -0.7


def test_growing_independent_noise_crosses_where_theory_says() -> None:
    """prediction = truth + s_t * noise with unit variances: corr_t = 1 / sqrt(1 + s_t^2), which falls below
    0.8 at s = 0.75. With s_t = 0.25 t - 0.05 (t = 1, 2, ...), s_3 = 0.70 (corr 0.819) and s_4 = 0.95
    (corr 0.725): 3 steps stay above. The sample correlation of n points has standard error about
    (1 - r^2) / sqrt(n); the margins to 0.8 are checked to exceed 5 of those before the crossing is."""
    samples, frames, channels, points = 4, 8, 2, 4096
    n = channels * points
    s = 0.25 * torch.arange(1, frames + 1, dtype=torch.float32) - 0.05
    theory = 1.0 / torch.sqrt(1.0 + s**2)
    stderr = (1.0 - theory**2) / math.sqrt(n)
    assert theory[2] - HIGH_CORRELATION_THRESHOLD > 5 * stderr[2]
    assert HIGH_CORRELATION_THRESHOLD - theory[3] > 5 * stderr[3]
    truth = random_fields((samples, frames, channels, points), seed=1)
    noise = random_fields((samples, frames, channels, points), seed=2)
    prediction = truth + s.view(1, frames, 1, 1) * noise
    correlation = pearson_per_sample_frame(prediction, truth)
    assert torch.all((correlation - theory).abs() < 5 * stderr)
    summary = high_correlation_summary(correlation, frame_dt=0.5)
    assert summary["steps"] == [3] * samples and not any(summary["censored"])
    assert summary["mean_time"] == pytest.approx(1.5)


def test_the_first_drop_ends_the_run_even_when_the_correlation_recovers() -> None:
    correlation = torch.tensor([[0.9, 0.85, 0.79, 0.95], [0.7, 0.99, 0.99, 0.99], [0.8, 0.8, 0.8, 0.8]])
    run = high_correlation_steps(correlation)
    assert run.steps.tolist() == [2, 0, 4]  # exactly 0.8 is not below the threshold
    assert run.censored.tolist() == [False, False, True]


def test_a_constant_frame_is_undefined_and_ends_the_run() -> None:
    truth = random_fields((2, 5, 1, 16))
    prediction = truth.clone()
    prediction[0, 2] = 1.5  # a constant prediction: zero variance
    correlation = pearson_per_sample_frame(prediction, truth)
    assert torch.isnan(correlation[0, 2]) and torch.isfinite(correlation[1]).all()
    summary = high_correlation_summary(correlation)
    assert summary["steps"] == [2, 5] and summary["censored"] == [False, True]
    assert summary["undefined_frames"] == 1
    assert summary["time"] is None and summary["mean_time"] is None
    prediction.requires_grad_(True)
    pearson_per_sample_frame(prediction, truth).nan_to_num().sum().backward()
    assert prediction.grad is not None and torch.isfinite(prediction.grad).all()


def test_standard_error_matches_numpy() -> None:
    values = [3.0, 7.0, 4.0, 12.0, 9.0, 5.0]
    mean, stderr = mean_and_stderr(values)
    array = np.array(values)
    assert mean == pytest.approx(array.mean())
    assert stderr == pytest.approx(array.std(ddof=1) / np.sqrt(array.size))
    assert mean_and_stderr([4.0]) == (4.0, None)  # one sample has no spread to estimate


def test_summary_reports_time_as_steps_times_the_frame_interval() -> None:
    correlation = torch.tensor([[0.9, 0.7, 0.9], [0.9, 0.9, 0.1], [0.95, 0.9, 0.85]])
    summary = high_correlation_summary(correlation, frame_dt=0.25)
    assert summary["steps"] == [1, 2, 3] and summary["censored_samples"] == 1
    mean, stderr = mean_and_stderr([1.0, 2.0, 3.0])
    assert summary["mean_steps"] == mean and summary["stderr_steps"] == stderr
    assert summary["mean_time"] == pytest.approx(0.25 * mean)
    assert summary["stderr_time"] == pytest.approx(0.25 * stderr)  # type: ignore[operator]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_forward_and_backward_on_odd_shapes_are_finite(dtype: torch.dtype) -> None:
    truth = random_fields((3, 5, 2, 7, 3)).to(dtype)
    prediction = (truth.float() + 0.3 * random_fields((3, 5, 2, 7, 3), seed=4)).to(dtype)
    prediction.requires_grad_(True)
    correlation = pearson_per_sample_frame(prediction, truth)
    assert correlation.dtype == torch.float32 and correlation.shape == (3, 5)
    assert torch.isfinite(correlation).all() and (correlation.abs() <= 1 + 1e-5).all()
    correlation.sum().backward()
    assert prediction.grad is not None and torch.isfinite(prediction.grad.float()).all()


def test_mismatched_shapes_are_refused() -> None:
    with pytest.raises((ValueError, TypeError), match=r"differ in shape|Type-check"):
        pearson_per_sample_frame(torch.zeros(1, 2, 1, 8), torch.zeros(1, 2, 1, 9))
