"""Flow-matching samplers and the stack's inference: exact transport at the expected order, zero velocity
leaves the noise, the distillation target is the teacher's sample, predictor-corrector scheduling, the
energy score and the spread-error correlation."""

import math

import pytest
import torch
from torch import Tensor, nn

from dynaforge.config import FlowNetConfig
from dynaforge.metrics.ensemble import energy_score, spread_error_correlation
from dynaforge.models import ModelInput, ModelOutput, ModelShape, build_model
from dynaforge.models.flow import FlowInput, FlowOutput, flow_velocity, integrate_flow, sample
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import (
    Corrector,
    conditioned_rollout,
    ensemble_rollout,
    predictor_corrector_rollout,
)
from dynaforge.train.stages import distillation_target, rollout_residual


def gaussian_transport_velocity(mean: float, std: float):
    """The marginal velocity of the straight path from N(0, 1) to N(mean, std^2): x_t is N(t mean,
    sigma_t^2) with sigma_t^2 = (1 - t)^2 + t^2 std^2; the flow maps x0 to mean + std x0 exactly."""

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        t = t.view(-1, *(1,) * (x.ndim - 1))
        variance = (1 - t) ** 2 + t**2 * std**2
        derivative = (-(1 - t) + t * std**2) / variance  # sigma_t' / sigma_t
        return mean + (x - t * mean) * derivative

    return velocity


@pytest.mark.parametrize("method,order", [("euler", 1), ("heun", 2)])
def test_sampler_converges_to_exact_transport_at_its_order(method: str, order: int) -> None:
    noise = torch.linspace(-2.5, 2.5, 11, dtype=torch.float64).reshape(11, 1, 1)
    exact = 0.7 + 0.3 * noise
    velocity = gaussian_transport_velocity(mean=0.7, std=0.3)
    errors = [
        float((integrate_flow(velocity, noise, steps, method) - exact).abs().max()) for steps in (16, 32, 64)
    ]
    rates = [math.log2(errors[i] / errors[i + 1]) for i in range(2)]
    assert all(abs(rate - order) < 0.15 for rate in rates), (errors, rates)
    assert errors[0] / errors[-1] > 0.8 * 4**order  # two halvings of the step


def test_time_dependent_linear_field_matches_its_closed_form() -> None:
    noise = torch.randn(4, 1, 8, dtype=torch.float64)

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        return (1 + t.view(-1, 1, 1)) * x  # x(1) = x(0) exp(3/2)

    result = integrate_flow(velocity, noise, 400, "heun")
    assert torch.allclose(result, noise * math.exp(1.5), rtol=1e-5)


def zero_velocity_net(scale: float = 1.0) -> nn.Module:
    torch.manual_seed(0)
    model = build_model(FlowNetConfig(width=8, layers=2, scale=scale), ModelShape(1, 1, 1))
    nn.init.zeros_(model.project.weight)
    nn.init.zeros_(model.project.bias)
    return model


def test_zero_velocity_sampler_returns_its_noise() -> None:
    model = zero_velocity_net(scale=0.25)
    noise = torch.randn(3, 1, 16, dtype=torch.float32)
    condition = torch.randn(3, 2, 1, 16, dtype=torch.float32)
    params = torch.zeros(3, 0, dtype=torch.float32)
    for steps, method in [(1, "euler"), (8, "euler"), (4, "heun")]:
        assert torch.equal(sample(model, noise, condition, params, steps, method), noise * 0.25)


def test_distillation_target_is_the_teacher_sample_of_the_same_noise() -> None:
    torch.manual_seed(1)
    teacher_model = build_model(FlowNetConfig(width=8, layers=2), ModelShape(1, 1, 1))
    for parameter in teacher_model.parameters():
        parameter.data.add_(0.1 * torch.randn_like(parameter))
    teacher = Corrector(teacher_model, steps=6, method="euler")
    noise = torch.randn(2, 1, 16, dtype=torch.float32)
    condition = torch.randn(2, 2, 1, 16, dtype=torch.float32)
    params = torch.zeros(2, 0, dtype=torch.float32)
    target = distillation_target(teacher, noise, condition, params)
    expected = integrate_flow(flow_velocity(teacher_model, condition, params), noise, 6, "euler")
    assert torch.equal(target, expected)
    assert target.abs().mean() > 0.1  # not zero, and not the noise itself
    assert not torch.allclose(target, noise, atol=1e-3)


class ShiftOperator(nn.Module):
    """A fake operator: adds 1 to the last frame."""

    def forward(self, inputs: ModelInput) -> ModelOutput:
        return ModelOutput(frames=inputs.frames[:, -1:] + 1)


class ConstantVelocity(nn.Module):
    """A fake flow model whose velocity is 2 everywhere: every sample is noise + 2."""

    def __init__(self) -> None:
        super().__init__()
        self.config = FlowNetConfig(scale=1.0)

    def forward(self, inputs: FlowInput) -> FlowOutput:
        return FlowOutput(velocity=torch.full_like(inputs.state, 2.0))


def fake_conditions(batch: int) -> Conditions:
    return Conditions(
        dt=torch.ones(batch, dtype=torch.float32), params=torch.zeros(batch, 0, dtype=torch.float32)
    )


def test_predictor_corrector_corrects_every_k_steps() -> None:
    frames = torch.zeros(2, 1, 1, 8, dtype=torch.float32)
    corrector = Corrector(ConstantVelocity(), steps=3)
    alone = predictor_corrector_rollout(ShiftOperator(), None, frames, fake_conditions(2), 6)
    assert torch.equal(alone, conditioned_rollout(ShiftOperator(), frames, None, 6))
    generator = torch.Generator().manual_seed(0)
    corrected = predictor_corrector_rollout(
        ShiftOperator(), corrector, frames, fake_conditions(2), 6, every=3, generator=generator
    )
    replay = torch.Generator().manual_seed(0)
    noise = [torch.randn(2, 1, 8, generator=replay, dtype=torch.float32) for _ in range(2)]
    # steps 1, 2 add 1 each; step 3 adds 1 + (noise + 2); steps 4, 5 add 1; step 6 adds 1 + (noise + 2)
    assert torch.allclose(corrected[:, 1], torch.full_like(corrected[:, 1], 2.0))
    assert torch.allclose(corrected[:, 2], 5.0 + noise[0])
    assert torch.allclose(corrected[:, 5], 10.0 + noise[0] + noise[1])


def test_drift_threshold_triggers_the_corrector() -> None:
    frames = torch.ones(1, 1, 1, 8, dtype=torch.float32)
    corrector = Corrector(ConstantVelocity(), steps=1)
    generator = torch.Generator().manual_seed(0)
    # every=100 never fires; energy goes 1 -> 4 at the first step (drift 3 > 0.5): corrected at once
    result = predictor_corrector_rollout(
        ShiftOperator(),
        corrector,
        frames,
        fake_conditions(1),
        1,
        every=100,
        drift_threshold=0.5,
        generator=generator,
    )
    noise = torch.randn(1, 1, 8, generator=torch.Generator().manual_seed(0), dtype=torch.float32)
    assert torch.allclose(result[:, 0], 4.0 + noise)


def test_ensemble_members_differ_and_spread_is_their_std() -> None:
    frames = torch.zeros(2, 1, 1, 8, dtype=torch.float32)
    ensemble = ensemble_rollout(
        ShiftOperator(), Corrector(ConstantVelocity(), steps=2), frames, fake_conditions(2), 3, members=4
    )
    assert ensemble.members.shape == (4, 2, 3, 1, 8)
    assert not torch.allclose(ensemble.members[0], ensemble.members[1])
    assert torch.allclose(ensemble.spread, ensemble.members.std(dim=0))


def test_energy_score_values() -> None:
    truth = torch.zeros(3, 1, 10, dtype=torch.float32)
    same = torch.stack([truth + 0.5, truth + 0.5])
    assert torch.allclose(energy_score(same, truth), torch.full((3,), 0.5))
    assert torch.allclose(energy_score(torch.stack([truth, truth]), truth), torch.zeros(3))
    spread = torch.stack([truth + 0.5, truth - 0.5])  # right spread around the truth: ES = 0.5 - 0.5
    assert torch.allclose(energy_score(spread, truth), torch.zeros(3), atol=1e-7)


def test_spread_error_correlation() -> None:
    truth = torch.zeros(4, 5, 1, 8, dtype=torch.float32)
    scales = torch.rand(4, 5, 1, 1, dtype=torch.float32) + 0.1
    error = scales * torch.ones(4, 5, 1, 8, dtype=torch.float32)
    assert spread_error_correlation(scales.expand_as(error), truth + error, truth) == pytest.approx(
        1.0, abs=1e-5
    )
    assert spread_error_correlation(1.0 / scales.expand_as(error), truth + error, truth) < 0


def test_corrector_with_draws_averages_residual_samples() -> None:
    corrector = Corrector(ConstantVelocity(), steps=2, draws=4)
    prediction = torch.zeros(3, 1, 8, dtype=torch.float32)
    noise = torch.randn(4, 3, 1, 8, dtype=torch.float32)
    params = torch.zeros(3, 0, dtype=torch.float32)
    residual = corrector.residual(prediction, prediction, params, noise)
    assert torch.allclose(residual, noise.mean(dim=0) + 2.0, atol=1e-6)
    single = Corrector(ConstantVelocity(), steps=2).residual(prediction, prediction, params, noise[0])
    assert torch.allclose(single, noise[0] + 2.0)


class ScaleOperator(nn.Module):
    """A fake operator: the next frame is 0.5 * last + 0.25 * the one before (uses both history frames)."""

    def forward(self, inputs: ModelInput) -> ModelOutput:
        return ModelOutput(frames=0.5 * inputs.frames[:, -1:] + 0.25 * inputs.frames[:, -2:-1])


@pytest.mark.parametrize("interval", [1, 3])
def test_rollout_residual_is_truth_minus_the_k_step_rollout(interval: int) -> None:
    torch.manual_seed(2)
    inputs = torch.randn(2, 2, 1, 8, dtype=torch.float32)
    targets = torch.randn(2, interval, 1, 8, dtype=torch.float32)
    batch = (inputs, targets, torch.zeros(2, 0, dtype=torch.float32), torch.ones(2, dtype=torch.float32))
    # the rollout by hand: x_{n+1} = 0.5 x_n + 0.25 x_{n-1} from the two true frames
    frames = [inputs[:, 0], inputs[:, 1]]
    for _ in range(interval):
        frames.append(0.5 * frames[-1] + 0.25 * frames[-2])
    example = rollout_residual(ScaleOperator(), batch, interval)
    assert torch.allclose(example.prediction, frames[-1])
    assert torch.allclose(example.previous, frames[-2])  # the last input frame when interval = 1
    assert torch.equal(example.truth, targets[:, interval - 1])
    assert torch.allclose(example.truth - example.prediction, targets[:, -1] - frames[-1])
    assert torch.equal(example.condition, torch.stack([example.prediction, example.previous], dim=1))
    with pytest.raises(ValueError, match="target frames"):
        rollout_residual(ScaleOperator(), (inputs, targets[:, :0], *batch[2:]), interval)


def test_temperature_scales_the_noise_and_zero_is_refused() -> None:
    prediction = torch.zeros(3, 1, 8, dtype=torch.float32)
    noise = torch.randn(3, 1, 8, dtype=torch.float32)
    params = torch.zeros(3, 0, dtype=torch.float32)
    cold = Corrector(ConstantVelocity(), steps=2, temperature=0.25).residual(
        prediction, prediction, params, noise
    )
    assert torch.allclose(cold, 0.25 * noise + 2.0)
    with pytest.raises(ValueError, match="temperature"):
        Corrector(ConstantVelocity(), steps=2, temperature=0.0)


def test_rollout_defaults_to_the_correctors_interval() -> None:
    frames = torch.zeros(2, 1, 1, 8, dtype=torch.float32)
    corrector = Corrector(ConstantVelocity(), steps=1, interval=3)
    own = predictor_corrector_rollout(
        ShiftOperator(), corrector, frames, fake_conditions(2), 6, generator=torch.Generator().manual_seed(0)
    )
    explicit = predictor_corrector_rollout(
        ShiftOperator(),
        corrector,
        frames,
        fake_conditions(2),
        6,
        every=3,
        generator=torch.Generator().manual_seed(0),
    )
    assert torch.equal(own, explicit)
    assert torch.allclose(own[:, 1], torch.full_like(own[:, 1], 2.0))  # uncorrected until step 3


def test_distillation_loss_spectral_term_charges_a_smoothed_student() -> None:
    from dynaforge.config import ConfigError, DistillStageConfig
    from dynaforge.train.losses import distillation_loss, log_spectrum_loss

    x = torch.linspace(0, 2 * math.pi, 65, dtype=torch.float32)[:-1]
    target = (torch.sin(2 * x) + 0.3 * torch.sin(17 * x)).expand(4, 1, 64)
    smoothed = torch.sin(2 * x).expand(4, 1, 64)  # the small scale lost
    mse = float(((smoothed - target) ** 2).mean())
    assert float(distillation_loss(smoothed, target)) == pytest.approx(mse)
    with_spectrum = float(distillation_loss(smoothed, target, spectral_weight=0.5))
    spectral = float(log_spectrum_loss(smoothed[:, None], target[:, None]))
    assert with_spectrum == pytest.approx(mse + 0.5 * spectral, rel=1e-6)
    assert spectral > 0.1  # the lost shell is charged
    assert float(distillation_loss(target, target, spectral_weight=0.5)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ConfigError, match="spectral_weight"):
        DistillStageConfig(spectral_weight=-1.0)
