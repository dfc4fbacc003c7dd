"""Every feature of the training engine works for every task it runs: one test per feature, each over the
four tasks (a surrogate on windows, the latent stack's operator stage, two-phase training, the N-body step
controller).

Each task is built by `engine_for` from a tiny preset and settings given without their section, which
`engine_for` puts where the task reads them (`train.*`, or `timestepper.train.*` for the controller).
DDP is not among the features here: it is covered for the tasks that support it in test_resume_ddp.py,
and the others refuse it (the last test).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.runs import load_checkpoint
from dynaforge.train import Engine, window_engine
from dynaforge.train.clip import WARMUP_STEPS
from dynaforge.train.log import read_metrics
from dynaforge.train.stages import OperatorTask, StageData, stage_train
from dynaforge.train.step_controller import controller_engine
from dynaforge.train.two_phase import two_phase_engine
from tests.conftest import CONFIGS

REPO = Path(__file__).resolve().parents[2]
TASKS = ["window", "stage", "two_phase", "controller"]
ACCUMULATION_TOLERANCE = 1e-6
"""Largest weight difference, relative to the weights' scale, between two accumulated half batches and one
full batch. Measured (Xeon-AMX, 1 and 2 threads): window 3.5e-10, stage 7.5e-9, two-phase 6.0e-8,
controller 6.9e-12 (float32 sums in another order); a wrong scale would show as differences of order 1."""
ACCUMULATION_TOLERANCE = 1e-6
"""Largest weight difference, relative to the weights' scale, between two accumulated half batches and one
full batch. Measured (Xeon-AMX, 1 and 2 threads): window 3.5e-10, stage 7.5e-9, two-phase 6.0e-8,
controller 6.9e-12 (float32 sums in another order); a wrong scale would show as differences of order 1."""


pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def stack_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dynaforge.generate import generate

    root = tmp_path_factory.mktemp("stack-data") / "data"
    generate(load_config(CONFIGS / "tiny-latent.yaml"), root, progress=False)
    return root


@pytest.fixture
def data(tiny_data: Path, stack_data: Path) -> dict[str, Path]:
    return {"window": tiny_data, "stage": stack_data}


def engine_for(
    task: str,
    out: Path,
    data: dict[str, Path],
    settings: list[str] = (),
    resume: bool = False,
    extra: list[str] = (),
) -> Engine:
    """The engine of `task` on its tiny preset into `out`; `settings` are `train` keys without the section,
    `extra` other overrides."""
    if task == "window":
        overrides = ["train.epochs=3", *(f"train.{s}" for s in settings), *extra]
        config = load_config(CONFIGS / "tiny.yaml", overrides)
        return window_engine(config, data["window"], out, progress=False, resume=resume)
    if task == "stage":
        overrides = [
            "stages.operator.epochs=2",
            "data.batch_size=8",
            *(f"train.{s}" for s in settings),
            *extra,
        ]
        base = load_config(CONFIGS / "tiny-latent.yaml", overrides)
        stage_data = StageData(data["stage"], base.data.stride)
        model = dataclasses.replace(base.model, parameters=stage_data.n_parameters, dt=stage_data.dt)
        operator = base.stages.operator
        train = stage_train(base, operator.epochs, operator.lr, operator.rollout_steps)
        config = dataclasses.replace(base, model=model, train=train)
        return Engine(config, OperatorTask(config, stage_data), out, progress=False, resume=resume)
    if task == "two_phase":
        config = load_config(CONFIGS / "two_phase_tiny.yaml", [*(f"train.{s}" for s in settings), *extra])
        return two_phase_engine(config, out, resume=resume)
    overrides = [
        "timestepper.steps=8",
        "timestepper.eval_every=4",
        *(f"timestepper.train.{s}" for s in settings),
        *extra,
    ]
    return controller_engine(
        load_config(CONFIGS / "nbody_tiny.yaml", overrides), out, resume=resume, progress=False
    )


def weights(path: Path, key: str = "model") -> dict[str, torch.Tensor]:
    return load_checkpoint(path)[key]


def assert_same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert torch.equal(a[name], b[name]), name


@pytest.mark.parametrize("task", TASKS)
def test_a_run_killed_with_sigkill_resumes_to_bitwise_identical_weights(
    task: str, data: dict[str, Path], tmp_path: Path
) -> None:
    kill_and_resume(task, data, tmp_path, ["checkpoint_every=2", "log_every=1"])


def test_relative_clipping_resumes_from_its_running_mean(data: dict[str, Path], tmp_path: Path) -> None:
    # Factor 1: every step above the running mean is cut, so a mean not restored would change the weights.
    settings = ["checkpoint_every=2", "log_every=1", "grad_clip=null", "grad_clip_relative=1", "epochs=8"]
    saved = kill_and_resume("window", data, tmp_path, settings)
    assert saved["grad_clip_relative"]["count"] > WARMUP_STEPS  # the limit already applied when killed


def kill_and_resume(task: str, data: dict[str, Path], tmp_path: Path, settings: list[str]) -> dict[str, Any]:
    """Train `task` straight, and again killed by SIGKILL halfway and resumed: the same weights and log.
    Returns the checkpoint the killed run left."""
    straight = engine_for(task, tmp_path / "straight", data, settings)
    steps = straight.fit().steps
    kill_at = steps // 2 + 1  # past a mid-run checkpoint, before the end
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from pathlib import Path
        import torch
        torch.set_num_threads(1)
        from dynaforge.train.engine import Engine
        from tests.integration.test_engine_tasks import engine_for

        count_step = Engine.count_step

        def count_then_die(self):
            count_step(self)
            if self.step == {kill_at}:
                os.kill(os.getpid(), signal.SIGKILL)

        Engine.count_step = count_then_die
        data = {{"window": Path(sys.argv[2]), "stage": Path(sys.argv[3])}}
        engine_for({task!r}, Path(sys.argv[1]), data, {settings!r}).fit()
        """
    )
    killed = tmp_path / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)}
    result = subprocess.run(
        [sys.executable, "-c", script, str(killed), str(data["window"]), str(data["stage"])],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
    )
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    saved = load_checkpoint(killed / "checkpoints" / "last.pt")
    assert 0 < saved["step"] < kill_at and not saved["complete"]
    summary = engine_for(task, killed, data, settings, resume=True).fit()
    assert summary.steps == steps
    assert_same(
        weights(killed / "checkpoints" / "last.pt"),
        weights(tmp_path / "straight" / "checkpoints" / "last.pt"),
    )
    logged = [
        (r["step"], r.get("loss")) for r in read_metrics(killed / "metrics.jsonl") if r["kind"] == "train"
    ]
    expected = [
        (r["step"], r.get("loss"))
        for r in read_metrics(tmp_path / "straight" / "metrics.jsonl")
        if r["kind"] == "train"
    ]
    assert logged == expected
    return saved


@pytest.mark.parametrize("task", TASKS)
def test_the_ema_weights_are_the_ones_validated_and_saved(
    task: str, data: dict[str, Path], tmp_path: Path
) -> None:
    engine = engine_for(task, tmp_path / "run", data, ["ema.decay=0.9"])
    summary = engine.fit()
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert_same(state["model"], state["ema"]["module"])
    assert any(not torch.equal(state["model"][k], state["train_model"][k]) for k in state["model"])
    assert float(state["ema"]["updates"]) == summary.steps
    # The recorded validation loss is that of the EMA weights.
    engine.model.load_state_dict(state["model"])
    engine.model.eval()
    with torch.inference_mode():
        assert engine.task.validate(engine.model) == pytest.approx(state["val_loss"], rel=1e-6)


HALF_BATCH = {
    "window": ["data.batch_size=8"],  # of 16
    "stage": ["data.batch_size=4"],  # of 8 (engine_for)
    "two_phase": ["twophase.batch=4"],  # of 8
    # of 4; the whole-run loss, whose batch is a mean over independent systems (the window loss carries
    # streams from step to step, so half batches would integrate other windows)
    "controller": ["timestepper.batch=2"],
}
FULL_BATCH = {"window": [], "stage": [], "two_phase": [], "controller": ["timestepper.batch=4"]}
CONTROLLER_RUN = ["timestepper.loss=run", "timestepper.horizon=0.5", "timestepper.run_steps=40"]


@pytest.mark.parametrize("task", TASKS)
def test_two_accumulated_half_batches_train_like_one_full_batch(
    task: str, data: dict[str, Path], tmp_path: Path
) -> None:
    # SGD without clipping: its update is proportional to the gradient, so a wrong scale (a sum instead of
    # a mean, a short last group divided by 2) shows, and rounding differences are not amplified as Adam's
    # normalisation amplifies them where a gradient is near zero.
    sgd = ["optimizer.name=sgd", "grad_clip=null"]
    run = CONTROLLER_RUN if task == "controller" else []
    full = engine_for(task, tmp_path / "full", data, sgd, extra=[*FULL_BATCH[task], *run])
    halves = engine_for(
        task, tmp_path / "halves", data, [*sgd, "accumulate=2"], extra=[*HALF_BATCH[task], *run]
    )
    micro = [halves.task.micro_batches(e) for e in range(halves.epoch_count)]
    assert full.fit().steps == halves.fit().steps == sum((m + 1) // 2 for m in micro) < sum(micro)
    a = weights(tmp_path / "full" / "checkpoints" / "last.pt")
    b = weights(tmp_path / "halves" / "checkpoints" / "last.pt")
    scale = max(float(t.abs().max()) for t in a.values())
    worst = max(float((a[k] - b[k]).abs().max()) for k in a)
    print(f"{task}: largest difference {worst / scale:.2e} of the weights' scale")
    assert worst <= ACCUMULATION_TOLERANCE * scale


@pytest.mark.parametrize("task", TASKS)
def test_a_failed_compilation_trains_eagerly_to_the_eager_weights(
    task: str,
    data: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    engine_for(task, tmp_path / "eager", data).fit()

    def broken(*args: Any, **kwargs: Any) -> Callable[..., Any]:
        def fail(*a: Any, **k: Any) -> Any:
            raise RuntimeError("no compiler here")

        return fail

    monkeypatch.setattr(torch, "compile", broken)
    with caplog.at_level(logging.INFO):
        engine = engine_for(task, tmp_path / "compiled", data, ["compile.enabled=true"])
        engine.fit()
    assert not engine.compiled
    assert "training runs eagerly" in caplog.text or "torch.compile is off" in caplog.text
    assert_same(
        weights(tmp_path / "compiled" / "checkpoints" / "last.pt"),
        weights(tmp_path / "eager" / "checkpoints" / "last.pt"),
    )


@pytest.mark.parametrize("task", TASKS)
def test_the_engine_reads_the_device_once_per_logging_window(
    task: str, data: dict[str, Path], tmp_path: Path
) -> None:
    from tests.integration.test_trainer_engine import SyncRecorder, record_step_path_syncs

    # Fused optimiser kernels for every task: torch's for-loop Adam (the controller's default) reads its step
    # count, a CPU tensor, with .item() in every step; not a device read, but the recorder cannot tell.
    engine = engine_for(task, tmp_path / "run", data, ["log_every=3", "optimizer.fused=true"])
    recorder = SyncRecorder()
    record_step_path_syncs(engine, recorder)
    # The task's own loss may read the device when its computation needs to (the controller's integrator
    # stops when its systems reach the horizon); the engine's part of the step must not.
    task_loss = engine.task.loss

    def loss_unrecorded(*args: Any) -> Any:
        inside, recorder.inside = recorder.inside, None
        try:
            return task_loss(*args)
        finally:
            recorder.inside = inside

    engine.task.loss = loss_unrecorded  # type: ignore[method-assign]
    reads = []
    read = engine.meter.read

    def counted(*args: Any, **kwargs: Any) -> Any:
        reads.append(1)
        return read(*args, **kwargs)

    engine.meter.read = counted  # type: ignore[method-assign]
    with recorder:
        summary = engine.fit()
    assert recorder.calls == []
    windows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert len(reads) == len(windows) and sum(r["steps"] for r in windows) == summary.steps
    assert all(r["steps"] <= 3 for r in windows)


@pytest.mark.parametrize("task", ["two_phase", "controller"])
def test_tasks_that_train_in_one_process_refuse_torchrun_with_the_fix(
    task: str, data: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynaforge.train import engine as engine_module
    from dynaforge.train.distributed import Cluster

    monkeypatch.setattr(
        engine_module,
        "join_cluster",
        lambda device: Cluster(rank=0, world_size=2, local_rank=0, owns_group=False),
    )
    with pytest.raises(ConfigError, match="without torchrun"):
        engine_for(task, tmp_path / "run", data)
