"""The evaluation metrics: each against a hand-computed case; forward and backward in float32 and bfloat16
on odd shapes without NaN or Inf; and none of them ever sees a rollout's input frames."""

from __future__ import annotations

import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from dynaforge.evaluate.rollout import Predictions, Rollouts
from dynaforge.evaluate.suite import METRICS, MetricSettings, frame_curves, score_predictions, score_rollouts
from dynaforge.metrics import fields as metrics
from dynaforge.metrics import horizon, physics
from dynaforge.metrics import spectra as spectral


def frames(*values: list[float]) -> Tensor:
    """One sample, one frame, one channel per list: (1, 1, C, X)."""
    return torch.tensor([[list(values)]], dtype=torch.float32)


def test_rmse_and_nrmse_by_hand_are_per_channel() -> None:
    truth = frames([1.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 0.0])  # RMS 1 and 1
    prediction = frames([2.0, 1.0, 1.0, 1.0], [2.0, 0.0, 0.0, 2.0])  # RMSE 0.5 and 1
    torch.testing.assert_close(metrics.rmse_per_frame(prediction, truth), torch.tensor([0.75]))
    torch.testing.assert_close(metrics.nrmse_per_frame(prediction, truth), torch.tensor([0.75]))
    # The pooled relative L2 over both channels is sqrt(5 / 8), not PDEBench's per-channel mean.
    pooled = metrics.relative_l2_per_frame(prediction, truth)
    torch.testing.assert_close(pooled, torch.tensor([[math.sqrt(5 / 8)]]))


def test_nrmse_is_relative_l2_for_one_channel() -> None:
    truth = torch.zeros(2, 1, 1, 4, dtype=torch.float32)
    truth[0, 0, 0] = torch.tensor([3.0, 4.0, 0.0, 0.0])
    truth[1, 0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])
    prediction = truth.clone()
    prediction[0, 0, 0, 0] += 1.0  # 1 / 5
    prediction[1, 0, 0, 1] += 0.5  # 0.5 / 1
    torch.testing.assert_close(metrics.nrmse(prediction, truth), torch.tensor(0.35))


def test_crmse_by_hand() -> None:
    truth = torch.zeros(2, 1, 1, 4, dtype=torch.float32)
    prediction = truth.clone()
    prediction[0, 0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # mean error 0.25
    prediction[1, 0, 0] = torch.tensor([1.0, 1.0, -1.0, -1.0])  # mean error 0
    expected = math.sqrt((0.25**2 + 0.0) / 2)
    torch.testing.assert_close(metrics.crmse_per_frame(prediction, truth), torch.tensor([expected]))


def test_max_error_by_hand() -> None:
    truth = torch.zeros(2, 1, 2, 4, dtype=torch.float32)
    prediction = truth.clone()
    prediction[0, 0, 0] = torch.tensor([0.5, -3.0, 0.0, 0.0])
    prediction[1, 0, 0] = torch.tensor([2.0, 0.0, 0.0, 0.0])
    prediction[1, 0, 1] = torch.tensor([0.0, 0.0, 1.0, 0.0])
    torch.testing.assert_close(metrics.max_error_per_frame(prediction, truth), torch.tensor([2.0]))


def test_brmse_by_hand_in_1d_and_2d() -> None:
    truth = torch.zeros(1, 1, 1, 4, dtype=torch.float32)
    prediction = torch.tensor([[[[1.0, 5.0, 5.0, 2.0]]]])
    torch.testing.assert_close(metrics.brmse_per_frame(prediction, truth), torch.tensor([math.sqrt(2.5)]))
    error = torch.ones(1, 1, 1, 3, 3, dtype=torch.float32)
    error[..., 1, 1] = 100.0  # interior: ignored
    error[..., 0, 0] = 2.0  # a corner: on two faces
    # faces x=0: 4+1+1, x=2: 3, y=0: 4+1+1, y=2: 3 -> 18 over 2*3 + 2*3 = 12 points
    torch.testing.assert_close(
        metrics.brmse_per_frame(error, torch.zeros_like(error)), torch.tensor([math.sqrt(1.5)])
    )


def test_vrmse_by_hand() -> None:
    truth = frames([1.0, 2.0, 3.0, 4.0])  # unbiased variance 5/3
    prediction = truth + 1.0  # MSE 1
    expected = math.sqrt(1.0 / (5.0 / 3.0 + 1e-7))
    torch.testing.assert_close(metrics.vrmse_per_frame(prediction, truth), torch.tensor([expected]))


def grid(n: int) -> Tensor:
    return torch.arange(n, dtype=torch.float64) / n


def test_fourier_band_rmse_by_hand_1d() -> None:
    x = grid(32)
    error = (1.0 + torch.cos(2 * math.pi * 5 * x) + torch.cos(2 * math.pi * 13 * x)).float()
    error = error.view(1, 1, 1, 32)
    bands = spectral.fourier_band_rmse_per_frame(error, torch.zeros_like(error), lengths=[2.0])
    # rfft: mode 0 = 32 -> 32 / 32 * L = 2; modes 5 and 13 = 16 -> 1. Bands [0,4), [4,12), [12,17).
    torch.testing.assert_close(bands["low"], torch.tensor([2.0 / 4]))
    torch.testing.assert_close(bands["mid"], torch.tensor([1.0 / 8]))
    torch.testing.assert_close(bands["high"], torch.tensor([1.0 / 5]))


def test_fourier_band_rmse_by_hand_2d_and_empty_bands() -> None:
    x = grid(8)
    error = torch.cos(2 * math.pi * 3 * x)[:, None].expand(8, 8).float().reshape(1, 1, 1, 8, 8)
    # FFT: 32 at (3, 0) (in the quadrant, shell 3) and at (5, 0) (outside); 4 shells.
    shells = spectral.pdebench_fourier_errors(error, torch.zeros_like(error), lengths=[1.0, 1.0])
    torch.testing.assert_close(shells, torch.tensor([[[0.0, 0.0, 0.0, 0.5]]]), atol=1e-6, rtol=0)
    bands = spectral.fourier_band_rmse_per_frame(error, torch.zeros_like(error), [1.0, 1.0], bands=(1, 2))
    torch.testing.assert_close(bands["high"], torch.tensor([0.25]))
    default = spectral.fourier_band_rmse_per_frame(error, torch.zeros_like(error), [1.0, 1.0])
    assert default["mid"] is None and default["high"] is None  # 4 shells: no mid or high band


def test_binned_spectral_mse_by_hand() -> None:
    x = grid(32)
    truth = (2 * torch.cos(2 * math.pi * 1 * x) + torch.cos(2 * math.pi * 3 * x)).float().view(1, 1, 1, 32)
    prediction = truth - torch.cos(2 * math.pi * 3 * x).float().view(1, 1, 1, 32)
    # Bin edges 0, 0.495, 1.247, pi + 1e-6: |k| = 2 pi / 32 (m = 1) is low, 3 * 2 pi / 32 = 0.589 is mid.
    result = spectral.binned_spectral_per_frame(prediction, truth)
    torch.testing.assert_close(result["mse_low"], torch.tensor([0.0]), atol=1e-9, rtol=0)
    torch.testing.assert_close(result["mse_mid"], torch.tensor([0.5]))
    torch.testing.assert_close(result["mse_high"], torch.tensor([0.0]), atol=1e-9, rtol=0)
    torch.testing.assert_close(result["nmse_mid"], torch.tensor([0.5 / (0.5 + 1e-7)]))
    torch.testing.assert_close(result["nmse_low"], torch.tensor([0.0]), atol=1e-7, rtol=0)


@pytest.mark.parametrize("shape", [(2, 3, 2, 17), (1, 2, 1, 9, 12), (1, 1, 2, 5, 6, 7)])
def test_binned_spectral_mse_sums_to_the_mse(shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    prediction, truth = torch.randn(shape), torch.randn(shape)
    mse, _ = spectral.binned_spectral_errors(prediction, truth)
    space = tuple(range(3, len(shape)))
    torch.testing.assert_close(mse.sum(dim=-1), (prediction - truth).square().mean(dim=space))


def test_energy_spectrum_by_hand_and_parseval() -> None:
    x = grid(16)
    u = (1.0 + 2.0 * torch.cos(2 * math.pi * 3 * x)).float().view(1, 1, 1, 16)
    expected = torch.zeros(9)
    expected[0], expected[3] = 0.5, 1.0  # 1/2 |u_0|^2; 1/2 (|u_3|^2 + |u_-3|^2)
    torch.testing.assert_close(spectral.energy_spectrum(u)[0, 0, 0], expected, atol=1e-6, rtol=0)
    torch.manual_seed(0)
    v = torch.randn(2, 1, 1, 16)
    torch.testing.assert_close(spectral.energy_spectrum(v).sum(-1), 0.5 * v.square().mean(-1))


def test_spectrum_error_by_hand() -> None:
    torch.manual_seed(0)
    truth = torch.randn(3, 2, 1, 32)
    truth = truth - truth.mean(dim=-1, keepdim=True)
    same = physics.spectrum_error_per_frame(truth.clone(), truth)
    torch.testing.assert_close(same, torch.zeros(2), atol=1e-6, rtol=0)
    louder = physics.spectrum_error_per_frame(truth * math.sqrt(10.0), truth)  # 10x the energy everywhere
    torch.testing.assert_close(louder, torch.ones(2), atol=1e-4, rtol=0)


def test_conservation_drifts_by_hand() -> None:
    torch.manual_seed(0)
    truth = torch.randn(2, 3, 1, 16)
    truth = truth - truth.mean(dim=-1, keepdim=True)
    torch.testing.assert_close(physics.mass_drift_per_frame(truth + 0.3, truth), torch.full((3,), 0.3))
    torch.testing.assert_close(physics.energy_drift_per_frame(truth * math.sqrt(2.0), truth), torch.ones(3))
    assert physics.conserved_quantities("advection") == ("mass", "energy")
    assert physics.conserved_quantities("burgers") == ("mass",)
    assert physics.conserved_quantities("pdebench:1D_Advection") == ()


def test_correlation_by_hand() -> None:
    truth = frames([1.0, 2.0, 0.0, -1.0])
    torch.testing.assert_close(horizon.correlation_per_frame(3 * truth + 5, truth), torch.tensor([1.0]))
    torch.testing.assert_close(horizon.correlation_per_frame(-truth, truth), torch.tensor([-1.0]))
    constant = torch.full_like(truth, 2.0)
    torch.testing.assert_close(horizon.correlation_per_frame(constant, truth), torch.tensor([0.0]))


def test_correlation_time_by_hand() -> None:
    timing = horizon.correlation_time(torch.tensor([0.99, 0.97, 0.9, 0.99]), 0.95, frame_dt=0.5)
    assert timing.frames == 2 and timing.time == 1.0 and not timing.censored
    timing = horizon.correlation_time(torch.tensor([0.99, 0.98]), 0.95)
    assert timing.frames == 2 and timing.time is None and timing.censored
    assert horizon.correlation_time(torch.tensor([0.5, 0.99]), 0.95, 1.0).time == 0.0


def test_geometric_mean_and_well_windows_by_hand() -> None:
    assert horizon.geometric_mean(torch.tensor([1.0, 4.0, 16.0])) == pytest.approx(4.0)
    assert horizon.geometric_mean(torch.tensor([1.0, 4.0, 16.0]), horizon=2) == pytest.approx(2.0)
    # exp(linspace(0, log 20, 5)) = 1, 2.11, 4.47, 9.46, 20
    assert horizon.well_time_windows(20) == [(0, 1), (1, 2), (2, 4), (4, 9), (9, 20)]
    assert horizon.well_time_windows(1) == [(0, 1)]
    means = horizon.window_means(torch.tensor([1.0, 2.0, 3.0, 5.0]), [(0, 1), (1, 4)])
    assert means == {"0:1": 1.0, "1:4": pytest.approx(10 / 3)}


# ---- no metric sees the input frames ---------------------------------------------------------------


def settings(**overrides: object) -> MetricSettings:
    return MetricSettings(lengths=(1.0,), system="advection", frame_dt=0.1, **overrides)


def test_scores_ignore_the_input_frames() -> None:
    torch.manual_seed(0)
    truth = torch.randn(3, 5, 1, 32)
    predicted = truth + 0.1 * torch.randn(3, 5, 1, 32)
    exact_inputs = torch.randn(3, 2, 1, 32)
    garbage_inputs = 1e3 * torch.randn(3, 2, 1, 32)
    first = score_rollouts(Rollouts(inputs=exact_inputs, predicted=predicted, truth=truth), settings())
    second = score_rollouts(Rollouts(inputs=garbage_inputs, predicted=predicted, truth=truth), settings())
    assert first == second
    expected = frame_curves(predicted, truth, settings())
    assert set(first["curves"]) == set(METRICS)  # every metric, drifts included (advection)
    for name, curve in expected.items():
        assert first["curves"][name] == pytest.approx([float(v) for v in curve]), name
        assert len(first["curves"][name]) == 5  # one value per predicted frame, none for inputs


@pytest.mark.parametrize("name", sorted(METRICS))
def test_each_metric_is_not_diluted_by_perfect_input_frames(name: str) -> None:
    """PDEBench's original loop scored the copied input frames too (zero error): dynaforge never does.

    Scoring the predicted frames alone must equal scoring [inputs, predicted] against [inputs, truth] only
    on the predicted frames, and differ from the diluted whole-trajectory value."""
    torch.manual_seed(1)
    inputs = torch.randn(4, 2, 1, 32)
    truth = torch.randn(4, 3, 1, 32)
    predicted = truth + 0.2 * torch.randn(4, 3, 1, 32)
    scores = score_rollouts(Rollouts(inputs=inputs, predicted=predicted, truth=truth), settings())
    whole_prediction = torch.cat([inputs, predicted], dim=1)
    whole_truth = torch.cat([inputs, truth], dim=1)
    whole = frame_curves(whole_prediction, whole_truth, settings())[name]
    assert scores["curves"][name] == pytest.approx([float(v) for v in whole[2:]], rel=1e-5, abs=1e-7)
    assert scores["means"][name] != pytest.approx(float(whole.mean()), rel=1e-3)


def test_one_step_scores_cover_predicted_frames_only() -> None:
    torch.manual_seed(2)
    truth = torch.randn(6, 2, 1, 16)
    predicted = truth + 0.1
    scores = score_predictions(Predictions(predicted=predicted, truth=truth), settings())
    assert scores["mass_drift"] == pytest.approx(0.1, rel=1e-5)
    assert scores["rmse"] == pytest.approx(0.1, rel=1e-5)


# ---- forward, backward, dtypes, odd shapes ----------------------------------------------------------

LENGTHS = {1: [1.0], 2: [1.0, 2.0], 3: [1.0, 1.0, 1.0]}


def fourier_band(band: str) -> Callable[[Tensor, Tensor], Tensor]:
    def metric(prediction: Tensor, truth: Tensor) -> Tensor:
        result = spectral.fourier_band_rmse_per_frame(
            prediction, truth, LENGTHS[prediction.ndim - 3], bands=(1, 2)
        )
        return result[band]

    return metric


def binned(key: str) -> Callable[[Tensor, Tensor], Tensor]:
    return lambda prediction, truth: spectral.binned_spectral_per_frame(prediction, truth)[key]


FUNCTIONS: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "rmse": metrics.rmse_per_frame,
    "nrmse": metrics.nrmse_per_frame,
    "crmse": metrics.crmse_per_frame,
    "brmse": metrics.brmse_per_frame,
    "max_error": metrics.max_error_per_frame,
    "vrmse": metrics.vrmse_per_frame,
    "frmse_low": fourier_band("low"),
    "frmse_mid": fourier_band("mid"),
    "frmse_high": fourier_band("high"),
    "spectral_mse_low": binned("mse_low"),
    "spectral_mse_high": binned("mse_high"),
    "spectral_nmse_high": binned("nmse_high"),
    "correlation": horizon.correlation_per_frame,
    "mass_drift": physics.mass_drift_per_frame,
    "energy_drift": physics.energy_drift_per_frame,
    "spectrum_error": physics.spectrum_error_per_frame,
}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2, 1, 17), (1, 1, 3, 5), (2, 3, 2, 7, 9), (2, 2, 1, 7, 6, 9)])
def test_forward_backward_finite(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    prediction = torch.randn(shape, dtype=torch.float32).to(dtype).requires_grad_(True)
    truth = torch.randn(shape, dtype=torch.float32).to(dtype)
    value = FUNCTIONS[name](prediction, truth)
    assert value.shape == (shape[1],) and value.dtype == torch.float32
    assert torch.isfinite(value).all()
    value.sum().backward()
    assert prediction.grad is not None and prediction.grad.dtype == dtype
    assert torch.isfinite(prediction.grad).all() and prediction.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_exact_prediction_and_zero_truth_stay_finite(name: str) -> None:
    torch.manual_seed(0)
    truth = torch.randn(2, 2, 1, 8, dtype=torch.float32)
    prediction = truth.clone().requires_grad_(True)
    value = FUNCTIONS[name](prediction, truth)
    value.sum().backward()
    assert torch.isfinite(value).all() and torch.isfinite(prediction.grad).all()
    zero = torch.zeros(2, 2, 1, 8, dtype=torch.float32)
    assert torch.isfinite(FUNCTIONS[name](zero + 1e-3, zero)).all()


def test_shape_mismatch_names_the_layout() -> None:
    with pytest.raises((ValueError, TypeError), match=r"differ in shape|Type-check"):
        metrics.rmse_per_frame(torch.zeros(1, 2, 1, 3), torch.zeros(1, 1, 1, 3))
