"""PDE-Refiner (dynaforge.models.refiner, dynaforge.train.refiner): the loss is what it says, K = 0 is the
plain operator, inference makes K + 1 network calls, a seed fixes the result, and the stages train, chain
and resume on the tiny preset."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from torch import nn

from dynaforge.config import FNOConfig, UNetConfig, load_config
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.models.refiner import (
    Refiner,
    balanced,
    build_refiner,
    noise_levels,
    refined_rollout,
    refiner_loss,
    signal_levels,
)
from dynaforge.runs import load_checkpoint
from dynaforge.train.refiner import REFINER_STAGES, run_refiner_stages
from tests.conftest import CONFIGS

SHAPE = ModelShape(channels=1, history=2, horizon=1, spatial_dims=1)
MODEL = FNOConfig(width=8, modes=6, layers=2, projection=8)


def refiner(steps: int, seed: int = 0) -> Refiner:
    torch.manual_seed(seed)
    return build_refiner(MODEL, SHAPE, steps, 1e-3)


class Recorder(nn.Module):
    """Wraps a network: records the estimate frame and the step frame of every call."""

    def __init__(self, network: nn.Module) -> None:
        super().__init__()
        self.network, self.calls = network, []

    def forward(self, inputs: ModelInput):
        self.calls.append(inputs.frames[:, -2:].detach().clone())
        return self.network(inputs)


def test_noise_levels_are_the_release_ddpm_schedule() -> None:
    """The public release's DDPM scheduler: betas (variances) sigma_min ** (j / K) for j = K .. 0 over its
    timesteps 0 .. K, alpha_bar the cumulative product of 1 - beta; refinement step k is its timestep K - k:
    noise std sqrt(1 - alpha_bar), signal factor sqrt(alpha_bar). Computed here as the scheduler does."""
    steps, sigma_min = 3, 4e-7
    betas = torch.tensor([sigma_min ** (j / steps) for j in reversed(range(steps + 1))], dtype=torch.float64)
    alpha_bar = torch.cumprod(1.0 - betas, dim=0)
    timesteps = [steps - k for k in range(1, steps + 1)]
    assert noise_levels(steps, sigma_min) == pytest.approx(
        [float((1 - alpha_bar[t]).sqrt()) for t in timesteps], rel=1e-9
    )
    assert signal_levels(steps, sigma_min) == pytest.approx(
        [float(alpha_bar[t].sqrt()) for t in timesteps], rel=1e-12
    )
    # sigma_min is the smallest variance: standard deviations about 0.086, 0.0074, 6.3e-4 for KS
    assert noise_levels(steps, sigma_min) == pytest.approx([0.0862, 0.00740, 6.32e-4], rel=2e-3)
    assert noise_levels(0, 1e-6) == [] and signal_levels(0, 1e-6) == []


@pytest.mark.parametrize("prediction", ["noise", "v"])
def test_loss_is_change_mse_at_k0_and_noise_or_v_mse_above(prediction: str) -> None:
    model = build_refiner(MODEL, SHAPE, 3, 1e-3, change_scale=0.5, prediction=prediction)
    recorder = Recorder(model.network)
    model.network = recorder
    inputs = torch.randn(4, 2, 1, 32, dtype=torch.float32)
    target = torch.randn(4, 1, 1, 32, dtype=torch.float32)
    noise = torch.randn(4, 1, 1, 32, dtype=torch.float32)
    change = (target - inputs[:, -1:]) / 0.5
    k = torch.tensor([0, 1, 2, 3])
    loss = refiner_loss(model, inputs, target, k, noise)
    (estimate, step) = recorder.calls[0][:, :1], recorder.calls[0][:, 1:]
    assert len(recorder.calls) == 1  # one network call for the whole batch
    assert torch.equal(estimate[0], torch.zeros_like(estimate[0]))  # k = 0 sees no estimate
    for i, sigma, a in zip(
        (1, 2, 3), model.levels, model.signals, strict=True
    ):  # k > 0: a_k d + sigma_k noise
        torch.testing.assert_close(estimate[i], a * change[i] + sigma * noise[i])
    assert torch.allclose(step[:, 0, 0, 0], torch.tensor([0, 1 / 3, 2 / 3, 1.0]))
    # by hand: sample 0 against the change, the others against the noise (or v)
    with torch.no_grad():
        output = model.call(inputs, torch.cat([torch.zeros_like(target[:1]), estimate[1:]]), k)
    # k > 0: the noise, or v = a_k noise - sigma_k d
    wanted = [
        noise[i] if prediction == "noise" else a * noise[i] - sigma * change[i]
        for i, sigma, a in zip((1, 2, 3), model.levels, model.signals, strict=True)
    ]
    by_hand = torch.stack(
        [(output[0] - change[0]).square().mean()]
        + [(output[i] - wanted[i - 1]).square().mean() for i in (1, 2, 3)]
    ).mean()
    torch.testing.assert_close(loss, by_hand)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)


def test_prediction_is_last_frame_plus_scaled_change() -> None:
    model = build_refiner(MODEL, SHAPE, 0, 1e-3, change_scale=0.25)
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float32)
    with torch.no_grad():
        d = model.first_estimate(frames)
        torch.testing.assert_close(model(ModelInput(frames=frames)).frames, frames[:, -1:] + 0.25 * d)


def test_loss_in_bfloat16_and_odd_sizes_is_finite() -> None:
    model = refiner(2).to(torch.bfloat16)
    inputs = torch.randn(3, 2, 1, 17, dtype=torch.bfloat16)
    target = torch.randn(3, 1, 1, 17, dtype=torch.bfloat16)
    loss = refiner_loss(model, inputs, target, torch.tensor([0, 1, 2]), torch.randn_like(target))
    assert torch.isfinite(loss)


def test_k0_is_the_plain_operator() -> None:
    """K = 0: one call per step, the one-step MSE alone, and with the two extra input frames' weights at
    zero the network is the plain surrogate."""
    torch.manual_seed(0)
    plain = build_model(MODEL, SHAPE)  # residual: predicts the change from the last frame
    model = refiner(0)
    state = dict(plain.state_dict())
    lift = state["lift.weight"]  # (width, history * C, 1): two more input channels, zero weights
    state["lift.weight"] = torch.cat([lift, torch.zeros_like(lift[:, :2])], dim=1)
    model.network.load_state_dict(state)
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(
            model(ModelInput(frames=frames)).frames, plain(ModelInput(frames=frames)).frames
        )
        target = torch.randn(2, 1, 1, 32, dtype=torch.float32)
        k = torch.randint(0, 1, (2,))
        loss = refiner_loss(model, frames, target, k, torch.randn_like(target))
        torch.testing.assert_close(loss, (plain(ModelInput(frames=frames)).frames - target).square().mean())


@pytest.mark.parametrize("steps", [0, 1, 3])
def test_inference_makes_k_plus_one_calls(steps: int) -> None:
    model = refiner(steps)
    recorder = Recorder(model.network)
    model.network = recorder
    with torch.no_grad():
        refined_rollout(model, torch.randn(2, 2, 1, 32, dtype=torch.float32), 4)
    assert len(recorder.calls) == 4 * (steps + 1)
    fractions = [float(call[0, 1, 0, 0]) for call in recorder.calls[: steps + 1]]
    assert fractions == pytest.approx([k / max(steps, 1) for k in range(steps + 1)])


def test_deterministic_with_a_seed_and_draws_differ_without() -> None:
    model = refiner(3).eval()
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float32)
    with torch.inference_mode():
        a = refined_rollout(model, frames, 3, torch.Generator().manual_seed(5))
        b = refined_rollout(model, frames, 3, torch.Generator().manual_seed(5))
        c = refined_rollout(model, frames, 3, torch.Generator().manual_seed(6))
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_stages_train_chain_and_resume(tiny_data: Path, tmp_path: Path, one_thread: None) -> None:
    config = load_config(
        CONFIGS / "tiny.yaml",
        [
            "stages.refiner.epochs=2",
            "stages.refiner.steps=2",
            "stages.refiner.val_rollout=3",
            "stages.refiner_distill.epochs=1",
            "stages.val_windows=8",
        ],
    )
    run = tmp_path / "run"
    first = run_refiner_stages(config, tiny_data, run, stage="refiner", progress=False)
    assert first["stages"]["refiner"]["status"] == "done"
    assert math.isfinite(first["stages"]["refiner"]["best_val"])
    state = load_checkpoint(run / "refiner" / "checkpoints" / "best.pt")
    teacher = model_from_checkpoint(state)
    assert isinstance(teacher, Refiner) and teacher.steps == 2 and state["kind"] == "refiner"
    # `all` runs the student next, started from the refiner's weights; the done refiner is skipped
    status = run_refiner_stages(config, tiny_data, run, progress=False)
    assert list(status["stages"]) == list(REFINER_STAGES)
    student = model_from_checkpoint(load_checkpoint(run / "refiner_distill" / "checkpoints" / "best.pt"))
    assert isinstance(student, Refiner) and student.steps == 0
    frames = torch.zeros(2, 2, 1, 64, dtype=torch.float32)
    with torch.inference_mode():
        assert torch.isfinite(refined_rollout(student.eval(), frames, 2)).all()


def test_refiner_stage_resumes_a_running_stage(tiny_data: Path, tmp_path: Path, one_thread: None) -> None:
    """A stage left `running` (a killed process) resumes from its last checkpoint instead of starting over."""
    import json

    config = load_config(
        CONFIGS / "tiny.yaml",
        [
            "stages.refiner.epochs=1",
            "stages.refiner.steps=1",
            "stages.refiner.val_rollout=2",
            "stages.val_windows=4",
        ],
    )
    run = tmp_path / "run"
    run_refiner_stages(config, tiny_data, run, "refiner", progress=False)
    status = json.loads((run / "stages.json").read_text())
    status["stages"]["refiner"]["status"] = "running"  # as a killed process leaves it
    (run / "stages.json").write_text(json.dumps(status))
    last = run / "refiner" / "checkpoints" / "last.pt"
    step, stamp = load_checkpoint(last)["step"], last.stat().st_mtime_ns
    resumed = run_refiner_stages(config, tiny_data, run, "refiner", progress=False)
    assert resumed["stages"]["refiner"]["status"] == "done"
    # its complete last checkpoint was restored (the engine's resume path), not trained again from scratch
    assert load_checkpoint(last)["step"] == step and last.stat().st_mtime_ns == stamp


def test_the_student_is_a_one_call_refiner_started_from_the_teacher() -> None:
    teacher = refiner(3)
    student = build_refiner(MODEL, SHAPE, 0, 1e-3)
    student.load_state_dict(teacher.state_dict())
    assert student.steps == 0 and dataclasses.asdict(MODEL)["residual"] is True


def test_refinement_step_inverts_the_training_noise() -> None:
    """Step k with the true change as estimate and a network that predicts exactly the noise it was given
    returns the true change (the step undoes a_k d + sigma_k noise)."""
    model = build_refiner(MODEL, SHAPE, 3, 4e-7).eval()
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float64)
    change = torch.randn(2, 1, 1, 32, dtype=torch.float64)
    noise = torch.randn_like(change)
    for k in (1, 2, 3):
        model.call = lambda f, noisy, steps, k=k: (
            (  # type: ignore[method-assign]
                noisy - model.signals[k - 1] * change
            )
            / model.levels[k - 1]
        )
        torch.testing.assert_close(model.refine(frames, change, k, noise), change)


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_a_fresh_refiner_predicts_no_change_like_a_fresh_residual_operator(name: str) -> None:
    """The refiner's network starts with its output layer at zero, as the residual surrogate does (with a
    random one the K = 0 refiner trained measurably worse than the plain operator; docs/long_rollouts.md):
    its first prediction is the last frame, and K = 0 refiner and plain operator start from the same loss."""
    config = MODEL if name == "fno" else UNetConfig(channels=4, levels=2)
    torch.manual_seed(0)
    plain = build_model(config, SHAPE)
    model = build_refiner(config, SHAPE, 0, 4e-7, change_scale=0.3)
    refiner = build_refiner(config, SHAPE, 3, 4e-7, change_scale=0.3)
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float32)
    with torch.no_grad():
        torch.testing.assert_close(model(ModelInput(frames=frames)).frames, frames[:, -1:])
        assert torch.equal(refiner.first_estimate(frames), torch.zeros_like(frames[:, -1:]))
        torch.testing.assert_close(plain(ModelInput(frames=frames)).frames, frames[:, -1:])


def test_balanced_loss_keeps_the_value_and_evens_the_gradient_per_k() -> None:
    """`balance`: the same value as the plain mean; d/d(sample loss) = L / (G * L_k * n_k) for G groups of
    k (each k's relative change counts alike), against 1 / n for the plain mean."""
    per_sample = torch.tensor([1e-3, 3e-3, 0.5, 0.7, 0.9], dtype=torch.float64, requires_grad=True)
    k = torch.tensor([0, 0, 1, 1, 3])
    loss = balanced(per_sample, k)
    total = float(per_sample.detach().mean())
    assert float(loss.detach()) == pytest.approx(total, rel=1e-12)
    loss.backward()
    group_mean = {0: 2e-3, 1: 0.6, 3: 0.9}
    count = {0: 2, 1: 2, 3: 1}
    expected = [total / (3 * group_mean[int(v)] * count[int(v)]) for v in k]
    assert per_sample.grad.tolist() == pytest.approx(expected, rel=1e-9)
    # the k = 0 samples now carry most of the gradient (the plain mean gives each 1 / 5)
    assert per_sample.grad[0] > 100 * per_sample.grad[2]


def test_refiner_loss_balanced_has_the_plain_value() -> None:
    model = refiner(3)
    inputs = torch.randn(6, 2, 1, 32, dtype=torch.float32)
    target = torch.randn(6, 1, 1, 32, dtype=torch.float32)
    noise = torch.randn_like(target)
    k = torch.tensor([0, 1, 2, 3, 0, 2])
    with torch.no_grad():
        plain = refiner_loss(model, inputs, target, k, noise)
        even = refiner_loss(model, inputs, target, k, noise, balance=True)
    torch.testing.assert_close(even, plain)


def test_v_prediction_step_recovers_the_change_from_the_true_v() -> None:
    """v-prediction: a network that predicts exactly v = a_k noise - sigma_k d of the noised estimate it was
    given returns the true change (a_k x - sigma_k v = d since a_k ** 2 + sigma_k ** 2 = 1)."""
    model = build_refiner(MODEL, SHAPE, 3, 4e-7, prediction="v").eval()
    frames = torch.randn(2, 2, 1, 32, dtype=torch.float64)
    change = torch.randn(2, 1, 1, 32, dtype=torch.float64)
    noise = torch.randn_like(change)
    for k in (1, 2, 3):
        a, sigma = model.signals[k - 1], model.levels[k - 1]

        def true_v(f, noisy, steps, a=a, sigma=sigma):  # the noise that made `noisy` from the change
            added = (noisy - a * change) / sigma
            return a * added - sigma * change

        model.call = true_v  # type: ignore[method-assign]
        torch.testing.assert_close(model.refine(frames, change, k, noise), change)


def test_the_prediction_form_is_kept_in_the_checkpoint(
    tiny_data: Path, tmp_path: Path, one_thread: None
) -> None:
    config = load_config(
        CONFIGS / "tiny.yaml",
        [
            "model.name=fno",
            "stages.refiner.epochs=1",
            "stages.refiner.steps=2",
            "stages.refiner.prediction=v",
        ],
    )
    run_refiner_stages(config, tiny_data, tmp_path / "run", stage="refiner", progress=False)
    state = load_checkpoint(next((tmp_path / "run").rglob("last.pt")))
    assert state["refiner_prediction"] == "v"
    rebuilt = model_from_checkpoint(state)
    assert isinstance(rebuilt, Refiner) and rebuilt.prediction == "v"
    old = {k: v for k, v in state.items() if k != "refiner_prediction"}  # written before it was recorded
    assert model_from_checkpoint(old).prediction == "noise"
