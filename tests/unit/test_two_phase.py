"""Two-phase (equilibrium propagation) training: the estimate against the exact gradient of the loss at the
relaxed state (implicit differentiation by autograd), its bias order in beta, snapshot/restore, resume
after a kill, and that training lowers the loss."""

from __future__ import annotations

import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from dynaforge.config import Config, ConfigError, load_config
from dynaforge.errors import RunError
from dynaforge.models.hopfield import HopfieldNet
from dynaforge.models.loading import energy_model_from_checkpoint
from dynaforge.runs import load_checkpoint
from dynaforge.train.engine import Engine
from dynaforge.train.log import read_metrics
from dynaforge.train.two_phase import (
    Clamp,
    CompiledRelax,
    Descent,
    RelaxState,
    Snapshot,
    TwoPhaseTask,
    compiled_chunk,
    cost,
    free_relaxation,
    relax,
    two_phase_engine,
)

pytestmark = pytest.mark.usefixtures("one_thread")

SMALL = [
    "train.device=cpu",
    "train.schedule.name=constant",
    "train.weight_decay=0",
    "twophase.model.inputs=3",
    "twophase.model.hidden=8",
    "twophase.model.outputs=2",
    "twophase.task.train_samples=16",
    "twophase.task.val_samples=8",
    "twophase.batch=8",
]
CONVERGED = [*SMALL, "twophase.dtype=float64", "twophase.free_steps=200", "twophase.nudged_steps=200"]
"""Relaxation to a true fixed point: about 0.6^200 of the initial distance remains."""


def trainer_for(tmp_path: Path, overrides: list[str], name: str = "run") -> Engine:
    return two_phase_engine(load_config(None, overrides), tmp_path / name)


def task_of(engine: Engine) -> TwoPhaseTask:
    assert isinstance(engine.task, TwoPhaseTask)
    return engine.task


def two_phase_estimate(engine: Engine, inputs: Tensor, targets: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
    return task_of(engine).gradient_estimate(inputs, targets)


def trained_parameters(engine: Engine) -> list[Tensor]:
    return [p for p in engine.model.parameters() if p.requires_grad]


class Killed(Exception):
    """Stands for SIGKILL in these in-process tests: raised right after an optimiser step, no checkpoint."""


def fit_until_killed(engine: Engine, step: int) -> None:
    count_step = engine.count_step

    def count_then_die() -> None:
        count_step()
        if engine.step >= step:
            raise Killed

    engine.count_step = count_then_die  # type: ignore[method-assign]
    with pytest.raises(Killed):
        engine.fit()


def flat(tensors: tuple[Tensor, ...] | list[Tensor]) -> Tensor:
    return torch.cat([t.reshape(-1) for t in tensors])


def loss_gradient_at_fixed_point(trainer: Engine, inputs: Tensor, targets: Tensor) -> Tensor:
    """dL/dtheta of L = mean_b C(s*_b) by implicit differentiation of dE/ds (s*) = 0, with autograd:
    dL/dtheta = -lambda^T d2E/(ds dtheta), H lambda = dL/ds, H = d2E/ds2 per sample."""
    model = trainer.model
    two_phase_estimate(trainer, inputs, targets)  # leaves the free fixed point in the snapshot
    units = task_of(trainer).snapshot.state.units.clone()
    units.requires_grad_(True)
    grad_s = torch.autograd.grad(model.energy(units, inputs).sum(), units, create_graph=True)[0]
    assert grad_s.abs().max() < 1e-12, "not at a fixed point"
    hessian = torch.stack(
        [torch.autograd.grad(grad_s[:, i].sum(), units, retain_graph=True)[0] for i in range(model.units)],
        dim=1,
    )  # (B, N, N)
    target_units = model.targets_to_units(targets)
    loss_by_units = torch.autograd.grad(cost(units, target_units, model.output_mask).mean(), units)[0]
    adjoint = torch.linalg.solve(hessian, loss_by_units.unsqueeze(-1)).squeeze(-1)
    gradients = torch.autograd.grad(grad_s, trained_parameters(trainer), grad_outputs=adjoint.detach())
    return -flat(gradients)


def cosine(a: Tensor, b: Tensor) -> float:
    return float(torch.nn.functional.cosine_similarity(a, b, dim=0))


def first_batch(trainer: Engine) -> tuple[Tensor, Tensor]:
    data = task_of(trainer).data
    return data.train_inputs[:8], data.train_targets[:8]


def test_closed_form_state_gradient_is_the_energy_gradient() -> None:
    config = load_config(None, CONVERGED).twophase.model
    torch.manual_seed(0)
    model = HopfieldNet(config, torch.float64)
    units = torch.randn(5, model.units, dtype=torch.float64, requires_grad=True)
    inputs = torch.randn(5, model.inputs, dtype=torch.float64)
    expected = torch.autograd.grad(model.energy(units, inputs).sum(), units)[0]
    torch.testing.assert_close(model.state_gradient(units, inputs), expected, rtol=1e-12, atol=1e-12)


def test_symmetric_estimate_is_the_gradient_of_the_loss_at_the_relaxed_state(tmp_path: Path) -> None:
    trainer = trainer_for(tmp_path, [*CONVERGED, "twophase.beta=0.001", "twophase.nudging=symmetric"])
    inputs, targets = first_batch(trainer)
    exact = loss_gradient_at_fixed_point(trainer, inputs, targets)
    estimate = flat(two_phase_estimate(trainer, inputs, targets)[0])
    similarity = cosine(estimate, exact)
    assert similarity > 0.99  # the criterion; a sign error gives -1
    assert similarity > 1 - 1e-8  # at a true fixed point and beta = 1e-3 it is far closer
    torch.testing.assert_close(estimate, exact, rtol=1e-5, atol=1e-9)


def test_one_sided_bias_is_first_order_and_symmetric_second_order(tmp_path: Path) -> None:
    betas = (0.2, 0.1, 0.05)
    errors: dict[str, list[float]] = {"one_sided": [], "symmetric": []}
    exact: Tensor | None = None
    for nudging in errors:
        for beta in betas:
            trainer = trainer_for(
                tmp_path,
                [*CONVERGED, f"twophase.beta={beta}", f"twophase.nudging={nudging}"],
                f"{nudging}{beta}",
            )
            inputs, targets = first_batch(trainer)
            if exact is None:
                exact = loss_gradient_at_fixed_point(trainer, inputs, targets)
            estimate = flat(two_phase_estimate(trainer, inputs, targets)[0])
            errors[nudging].append(float((estimate - exact).norm() / exact.norm()))
    one_sided, symmetric = errors["one_sided"], errors["symmetric"]
    for k in range(len(betas) - 1):  # halving beta: O(beta) halves, O(beta^2) quarters
        assert 1.7 < one_sided[k] / one_sided[k + 1] < 2.3, one_sided
        assert 3.4 < symmetric[k] / symmetric[k + 1] < 4.6, symmetric
        assert symmetric[k] < one_sided[k]


def test_snapshot_restores_state_and_buffers_bitwise() -> None:
    config = load_config(None, SMALL).twophase.model
    torch.manual_seed(0)
    model = HopfieldNet(config)
    model.register_buffer("memory", torch.randn(4, model.units, dtype=torch.float32))
    inputs = torch.randn(4, model.inputs, dtype=torch.float32)
    rest = model.initial_units(4)
    zero = torch.zeros((), dtype=torch.float32)
    clamp = Clamp(model.coupling(), model.drive(inputs), rest, model.output_mask)
    args = (clamp, zero, 7, Descent(step_size=0.5, momentum=0.6, activation="tanh"))
    with torch.no_grad():
        state = relax(RelaxState(rest, rest), *args)
    saved_state = RelaxState(*(t.clone() for t in state))
    saved_buffers = [b.clone() for b in model.buffers()]
    snapshot = Snapshot(state, model)
    snapshot.save(state, model)
    with torch.no_grad():
        moved = relax(state, *args)
        model.memory.add_(moved.units)  # the "memory" buffer changes while the nudged phase runs
        model.output_mask.mul_(2.0)
    assert not torch.equal(moved.units, saved_state.units)
    restored = snapshot.restore(model)
    for got, want in zip(restored, saved_state):
        assert torch.equal(got, want)
    for got, want in zip(model.buffers(), saved_buffers):
        assert torch.equal(got, want)
    assert saved_state.velocity.abs().sum() > 0  # momentum 0.6: the velocity is real state


def test_training_lowers_the_loss(tmp_path: Path) -> None:
    trainer = trainer_for(
        tmp_path, [*SMALL, "train.epochs=12", "train.lr=0.02", "twophase.task.train_samples=32"]
    )
    before = trainer.validate()
    summary = trainer.fit()
    assert summary.steps == 12 * 4
    assert summary.last_val_loss < 0.2 * before
    epochs = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert len(epochs) == 12 and epochs[-1]["train_loss"] < epochs[0]["train_loss"]
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists()
    # The checkpoint alone rebuilds the trained model, which predicts what training validated.
    model = energy_model_from_checkpoint(tmp_path / "run")
    s, data = task_of(trainer).settings, task_of(trainer).data
    with torch.inference_mode():
        units = free_relaxation(model, data.val_inputs, s.free_steps, s.step_size, s.momentum)
        target_units = model.targets_to_units(data.val_targets)
        assert float(cost(units, target_units, model.output_mask).mean()) == summary.last_val_loss


def test_resume_after_a_kill_gives_identical_weights(tmp_path: Path) -> None:
    # 32 inputs in batches of 8: 4 windows per epoch, 12 in all; last.pt every 3 windows and at epoch ends.
    overrides = [
        *SMALL,
        "train.epochs=3",
        "train.lr=0.02",
        "train.checkpoint_every=3",
        "twophase.task.train_samples=32",
    ]
    config = load_config(None, overrides)
    two_phase_engine(config, tmp_path / "whole").fit()
    fit_until_killed(two_phase_engine(config, tmp_path / "killed"), 7)  # killed after window 7; last.pt: 6
    assert load_checkpoint(tmp_path / "killed" / "checkpoints" / "last.pt")["step"] == 6
    summary = two_phase_engine(config, tmp_path / "killed", resume=True).fit()
    assert summary.steps == 12
    whole = load_checkpoint(tmp_path / "whole" / "checkpoints" / "last.pt")
    resumed = load_checkpoint(tmp_path / "killed" / "checkpoints" / "last.pt")
    assert resumed["complete"] and whole["complete"]
    for name, value in whole["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    for key, value in whole["optimizer"]["state"].items():
        for slot, tensor in value.items():
            assert torch.equal(resumed["optimizer"]["state"][key][slot], tensor)
    kinds = [r["kind"] for r in read_metrics(tmp_path / "killed" / "metrics.jsonl")]
    assert "resume" in kinds and kinds.count("epoch") == 3


def test_a_run_is_not_overwritten_nor_resumed_with_another_config(tmp_path: Path) -> None:
    overrides = [*SMALL, "train.epochs=1"]
    two_phase_engine(load_config(None, overrides), tmp_path / "run").fit()
    with pytest.raises(RunError, match=r"resume=True"):
        two_phase_engine(load_config(None, overrides), tmp_path / "run")
    with pytest.raises(RunError, match=r"twophase\.beta"):
        two_phase_engine(load_config(None, [*overrides, "twophase.beta=0.3"]), tmp_path / "run", resume=True)


def test_config_errors_name_the_key_and_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"twophase\.bta"):
        load_config(None, ["twophase.bta=0.1"])
    with pytest.raises(ConfigError, match="beta must be > 0"):
        load_config(None, ["twophase.beta=-0.1"])
    with pytest.raises(ConfigError, match=r"train\.precision=bf16"):
        two_phase_engine(load_config(None, ["train.precision=bf16"]), "unused")
    assert isinstance(load_config(None).twophase.beta, float) and Config().twophase.nudging == "symmetric"


def test_compiled_chunk_divides_both_phases() -> None:
    assert compiled_chunk(40, 20) == 10
    assert compiled_chunk(12, 8) == 4
    assert compiled_chunk(41, 20) == 1


@pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")
def test_compiled_relaxation_gives_the_eager_estimate(tmp_path: Path) -> None:
    # free 4, nudged 2: a compiled chunk of 2 steps. The aot_eager backend traces with dynamo and AOT
    # autograd as inductor does, without its code generation (tens of seconds here; the benchmark checks
    # inductor's windows against eager ones).
    overrides = [*SMALL, "twophase.free_steps=4", "twophase.nudged_steps=2"]
    eager = trainer_for(tmp_path, overrides, "eager")
    compiled = trainer_for(
        tmp_path, [*overrides, "train.compile.enabled=true", "train.compile.backend=aot_eager"], "compiled"
    )
    compiled.compile_with_fallback()
    relaxation = task_of(compiled).relax
    assert compiled.compiled and isinstance(relaxation, CompiledRelax) and relaxation.chunk == 2
    inputs, targets = first_batch(eager)
    for got, want in zip(
        two_phase_estimate(compiled, inputs, targets)[0], two_phase_estimate(eager, inputs, targets)[0]
    ):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_failed_compilation_falls_back_to_eager_and_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: object, **kwargs: object) -> object:
        def fail(*a: object, **k: object) -> None:
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(torch, "compile", broken)
    trainer = trainer_for(tmp_path, [*SMALL, "train.compile.enabled=true"])
    with caplog.at_level(logging.WARNING):
        trainer.compile_with_fallback()
    assert not trainer.compiled and task_of(trainer).relax is relax
    assert "torch.compile failed (RuntimeError: no compiler here); training runs eagerly" in caplog.text
    assert trainer.micro_step(first_batch(trainer))  # and the eager window still runs


def test_cuda_graph_capture_is_refused_on_the_cpu_with_a_reason(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.INFO):
        trainer = trainer_for(tmp_path, [*SMALL, "train.cuda_graph.enabled=true"])
    assert trainer.graph is None and not trainer.capturing
    assert "CUDA graph capture off: training runs on cpu" in caplog.text


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("batch", "hidden", "outputs"), [(1, 1, 1), (5, 7, 3)])
def test_cost_forward_and_backward(dtype: torch.dtype, batch: int, hidden: int, outputs: int) -> None:
    generator = torch.Generator().manual_seed(0)
    units = torch.randn(batch, hidden + outputs, generator=generator, dtype=torch.float32).to(dtype)
    targets = torch.randn(batch, outputs, generator=generator, dtype=torch.float32).to(dtype)
    target_units = torch.nn.functional.pad(targets, (hidden, 0))
    mask = (torch.arange(hidden + outputs, dtype=torch.int64) >= hidden).to(dtype)
    units.requires_grad_(True)
    value = cost(units, target_units, mask)
    expected = 0.5 * ((units[:, hidden:] - targets) ** 2).sum(-1)
    tolerance = {"rtol": 1e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(value, expected, **tolerance)
    (gradient,) = torch.autograd.grad(value.sum(), units)
    assert value.dtype == dtype and torch.isfinite(value).all() and torch.isfinite(gradient).all()
    assert torch.equal(gradient[:, :hidden], torch.zeros_like(gradient[:, :hidden]))  # hidden units: no force
    torch.testing.assert_close(gradient[:, hidden:], (units - target_units)[:, hidden:].detach(), **tolerance)


def test_a_teacher_without_a_fixed_point_is_refused_with_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"lower twophase\.task\.teacher_scale"):
        trainer_for(tmp_path, [*SMALL, "twophase.task.teacher_scale=40"])


class FakeWandbRun:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs, self.id, self.finished = kwargs, "fake123", False
        self.logged: list[tuple[dict[str, Any], int]] = []

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append((values, step))

    def finish(self) -> None:
        self.finished = True


def test_metrics_are_mirrored_to_wandb_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runs: list[FakeWandbRun] = []
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: runs.append(FakeWandbRun(**kwargs)) or runs[-1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: offline
    trainer = trainer_for(
        tmp_path, [*SMALL, "train.epochs=2", "train.log_every=1", "train.wandb.enabled=true"]
    )
    trainer.fit()
    (run,) = runs
    assert run.kwargs["mode"] == "offline" and run.finished
    assert [step for values, step in run.logged if "train/loss" in values] == [1, 2, 3, 4]
    logged_val = [values["epoch/val_loss"] for values, _ in run.logged if "epoch/val_loss" in values]
    assert logged_val == [
        r["val_loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"
    ]


@pytest.mark.parametrize("nudging", ["symmetric", "one_sided"])
def test_one_window_descends_the_batch_loss(tmp_path: Path, nudging: str) -> None:
    sgd = ["train.optimizer.name=sgd", "train.optimizer.momentum=0", "train.grad_clip=null", "train.lr=0.05"]
    trainer = trainer_for(tmp_path, [*CONVERGED, *sgd, f"twophase.nudging={nudging}", "twophase.beta=0.01"])
    inputs, targets = first_batch(trainer)
    before = float(two_phase_estimate(trainer, inputs, targets)[1])
    trainer.micro_step((inputs, targets))
    after = float(two_phase_estimate(trainer, inputs, targets)[1])
    assert after < before
