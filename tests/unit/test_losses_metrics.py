"""Every loss and metric: hand-computed values, forward and backward, float32 and bfloat16, odd shapes."""

import math

import pytest
import torch

from dynaforge.metrics.fields import nrmse, nrmse_per_frame, relative_l2_per_frame
from dynaforge.train.losses import LOSSES, mse_loss, relative_l2_loss


def test_relative_l2_by_hand() -> None:
    truth = torch.zeros(2, 1, 1, 4, dtype=torch.float32)
    truth[0, 0, 0] = torch.tensor([3.0, 4.0, 0.0, 0.0])  # norm 5
    truth[1, 0, 0] = torch.tensor([1.0, 0.0, 0.0, 0.0])  # norm 1
    prediction = truth.clone()
    prediction[0, 0, 0, 0] += 1.0  # error norm 1 -> 0.2
    prediction[1, 0, 0, 1] += 0.5  # error norm 0.5 -> 0.5
    torch.testing.assert_close(relative_l2_per_frame(prediction, truth), torch.tensor([[0.2], [0.5]]))
    torch.testing.assert_close(nrmse(prediction, truth), torch.tensor(0.35))
    torch.testing.assert_close(nrmse_per_frame(prediction, truth), torch.tensor([0.35]))


def test_nrmse_is_per_frame_not_pooled() -> None:
    truth = torch.ones(1, 2, 1, 3, dtype=torch.float32)
    truth[:, 1] = 100.0
    prediction = truth + 1.0  # the same absolute error, very different relative errors
    torch.testing.assert_close(nrmse_per_frame(prediction, truth), torch.tensor([1.0, 0.01]))


def test_mse_by_hand() -> None:
    prediction = torch.tensor([[[[1.0, 2.0, 3.0]]]])
    target = torch.tensor([[[[1.0, 0.0, 0.0]]]])
    torch.testing.assert_close(mse_loss(prediction, target), torch.tensor(13.0 / 3.0))


def test_shape_mismatch_is_an_error() -> None:
    # The shape check, or jaxtyping's runtime check when it is on (under pytest) and fires first.
    with pytest.raises((ValueError, TypeError), match=r"differ in shape|Type-check"):
        relative_l2_per_frame(torch.zeros(1, 2, 1, 3), torch.zeros(1, 1, 1, 3))


FUNCTIONS = {**LOSSES, "nrmse": nrmse}


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(3, 2, 1, 17), (1, 1, 3, 5), (2, 3, 2, 7, 9)])
def test_forward_backward_finite(name: str, dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    prediction = torch.randn(shape, dtype=torch.float32).to(dtype).requires_grad_(True)
    target = torch.randn(shape, dtype=torch.float32).to(dtype)
    value = FUNCTIONS[name](prediction, target)
    assert value.ndim == 0 and value.dtype == torch.float32 and torch.isfinite(value) and value > 0
    value.backward()
    assert prediction.grad is not None and prediction.grad.dtype == dtype
    assert torch.isfinite(prediction.grad).all() and prediction.grad.abs().sum() > 0


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_exact_prediction_and_zero_truth_stay_finite(name: str) -> None:
    truth = torch.randn(2, 1, 1, 8, dtype=torch.float32)
    prediction = truth.clone().requires_grad_(True)
    value = FUNCTIONS[name](prediction, truth)
    value.backward()
    assert value == 0 and torch.isfinite(prediction.grad).all()
    zero = torch.zeros(2, 1, 1, 8, dtype=torch.float32)
    assert torch.isfinite(FUNCTIONS[name](zero + 1e-3, zero))


def test_relative_l2_loss_matches_the_metric() -> None:
    prediction, target = torch.randn(4, 2, 1, 9), torch.randn(4, 2, 1, 9)
    assert math.isclose(float(relative_l2_loss(prediction, target)), float(nrmse(prediction, target)))
