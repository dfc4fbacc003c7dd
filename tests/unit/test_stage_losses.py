"""The stages' losses and metrics: forward and backward, float32 and bfloat16, odd shapes, no NaN/Inf."""

import pytest
import torch

from dynaforge.config import FlowNetConfig
from dynaforge.metrics.ensemble import energy_score
from dynaforge.models import ModelShape, build_model
from dynaforge.models.flow import FlowInput, FlowOutput
from dynaforge.train.losses import flow_matching_loss, log_spectrum_loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("space", [(17,), (32,), (6, 9)])
def test_log_spectrum_loss(dtype: torch.dtype, space: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    truth = torch.randn(3, 2, 1, *space, dtype=torch.float32).to(dtype)
    prediction = truth.detach().clone().requires_grad_(True)
    loss = log_spectrum_loss(prediction, truth)
    assert loss.dtype == torch.float32 and float(loss.detach()) == pytest.approx(0.0, abs=1e-6)
    smoothed = (0.5 * truth).detach().requires_grad_(True)  # a quarter of the energy in every shell
    loss = log_spectrum_loss(smoothed, truth)
    assert float(loss.detach()) == pytest.approx(float(torch.log(torch.tensor(4.0))), rel=0.05)
    loss.backward()
    assert smoothed.grad is not None and torch.isfinite(smoothed.grad.float()).all()
    assert smoothed.grad.abs().sum() > 0


def test_log_spectrum_loss_is_finite_for_zero_fields() -> None:
    zeros = torch.zeros(2, 1, 1, 16, dtype=torch.float32, requires_grad=True)
    loss = log_spectrum_loss(zeros, torch.zeros(2, 1, 1, 16, dtype=torch.float32))
    loss.backward()
    assert torch.isfinite(loss) and torch.isfinite(zeros.grad).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("space", [(15,), (8, 6)])
def test_flow_matching_loss_forward_backward(dtype: torch.dtype, space: tuple[int, ...]) -> None:
    torch.manual_seed(0)
    model = build_model(
        FlowNetConfig(width=8, layers=1, condition_frames=1, parameters=2), ModelShape(2, 1, 1, len(space))
    )
    target = torch.randn(4, 2, *space, dtype=torch.float32)
    condition = torch.randn(4, 1, 2, *space, dtype=torch.float32)
    params = torch.randn(4, 2, dtype=torch.float32)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        loss = flow_matching_loss(model, target, condition, params)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_flow_matching_loss_is_zero_for_the_exact_velocity_of_a_point_target() -> None:
    """A point target x1 = c: the straight path's velocity is c - x0 = (c - x_t) / (1 - t)."""

    class Exact(torch.nn.Module):
        def forward(self, inputs: FlowInput) -> FlowOutput:
            t = inputs.time.view(-1, 1, 1)
            return FlowOutput(velocity=(2.0 - inputs.state) / (1 - t))

    target = torch.full((64, 1, 8), 2.0, dtype=torch.float64)
    loss = flow_matching_loss(
        Exact(), target, target[:, None, :, :0], torch.zeros(64, 0, dtype=torch.float64)
    )
    assert float(loss) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_energy_score_dtypes_and_gradient(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    samples = torch.randn(3, 2, 1, 11, dtype=torch.float32).to(dtype).requires_grad_(True)
    truth = torch.randn(2, 1, 11, dtype=torch.float32).to(dtype)
    score = energy_score(samples, truth)
    assert score.shape == (2,) and score.dtype == torch.float32 and torch.isfinite(score).all()
    score.sum().backward()
    assert torch.isfinite(samples.grad.float()).all()


def test_log_spectrum_loss_ignores_errors_far_below_the_energetic_shells() -> None:
    """Tiny noise in the near-empty dissipation range must not dominate (it stalled training when the floor
    was absolute): the loss stays small, while a real error in the energetic shells is large."""
    x = torch.linspace(0, 1, 65, dtype=torch.float32)[:-1]
    truth = torch.sin(2 * torch.pi * 3 * x).view(1, 1, 1, 64)
    noisy = truth + 1e-6 * torch.randn(
        1, 1, 1, 64, generator=torch.Generator().manual_seed(0), dtype=torch.float32
    )
    assert float(log_spectrum_loss(noisy, truth)) < 0.01
    assert float(log_spectrum_loss(0.5 * truth, truth)) > 0.01
