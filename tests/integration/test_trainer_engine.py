"""The trainer's step on the tiny Burgers dataset: accumulation, non-finite steps, host syncs, compile
fallback, EMA checkpoints, bf16, per-epoch schedules, profiling, Weights & Biases."""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.overrides import TorchFunctionMode

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.errors import RunError
from dynaforge.models import model_from_checkpoint
from dynaforge.runs import load_checkpoint
from dynaforge.train import Engine, train, window_engine
from dynaforge.train.engine import TrainingDiverged
from dynaforge.train.log import read_metrics
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"

pytestmark = pytest.mark.usefixtures("one_thread")


def final_weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_four_micro_batches_accumulate_to_one_batch_four_times_larger(
    tiny_data: Path, tmp_path: Path
) -> None:
    # SGD without clipping: its update is proportional to the gradient, so a wrong scale (sum instead of
    # mean, a short last group divided by 4) would show. 72 windows: 4 groups of 4 x 4 and a last group of
    # 2 x 4 against batches of 16 and a last one of 8. Only the order of float32 sums differs (~1e-7 rel).
    common = ["train.optimizer.name=sgd", "train.grad_clip=null", "train.epochs=2"]
    one = train(
        load_config(TINY, [*common, "data.batch_size=16"]), tiny_data, tmp_path / "one", progress=False
    )
    four = train(
        load_config(TINY, [*common, "data.batch_size=4", "train.accumulate=4"]),
        tiny_data,
        tmp_path / "four",
        progress=False,
    )
    assert one.steps == four.steps == 10
    for name, value in final_weights(tmp_path / "one").items():
        torch.testing.assert_close(final_weights(tmp_path / "four")[name], value, rtol=1e-5, atol=1e-7)
    assert four.last_val_loss == pytest.approx(one.last_val_loss, rel=1e-5)


def poison_losses(trainer: Engine, bad_steps: set[int]) -> list[dict[str, torch.Tensor]]:
    """Make the training loss NaN at the given optimiser steps (1-based); returns weights after each step."""
    loss_fn, count_step = trainer.task.loss_fn, trainer.count_step
    snapshots: list[dict[str, torch.Tensor]] = [{k: v.clone() for k, v in trainer.model.state_dict().items()}]

    def poisoned(predicted: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        loss = loss_fn(predicted, targets)
        if torch.is_grad_enabled() and trainer.step + 1 in bad_steps:
            return loss * float("nan")
        return loss

    def counted() -> None:
        count_step()
        snapshots.append({k: v.clone() for k, v in trainer.model.state_dict().items()})

    trainer.task.loss_fn = poisoned  # type: ignore[attr-defined]
    trainer.count_step = counted  # type: ignore[method-assign]
    return snapshots


@pytest.mark.parametrize("optimizer", ["adamw", "muon"])
def test_non_finite_steps_are_skipped_and_counted(tiny_data: Path, tmp_path: Path, optimizer: str) -> None:
    config = load_config(TINY, ["train.epochs=1", "train.log_every=1", f"train.optimizer.name={optimizer}"])
    trainer = window_engine(config, tiny_data, tmp_path / "run", progress=False)
    snapshots = poison_losses(trainer, bad_steps={2, 3})
    summary = trainer.fit()
    assert summary.skipped_steps == 2 and summary.steps == 5
    for step in (2, 3):  # a skipped step leaves every weight as it was
        assert all(torch.equal(snapshots[step][k], snapshots[step - 1][k]) for k in snapshots[step])
    assert any(not torch.equal(snapshots[4][k], snapshots[3][k]) for k in snapshots[4])
    windows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    assert [w["skipped"] for w in windows] == [0, 1, 1, 0, 0]
    assert all(torch.isfinite(v).all() for v in final_weights(tmp_path / "run").values())


def test_too_many_bad_steps_in_a_row_stop_with_a_clear_message(tiny_data: Path, tmp_path: Path) -> None:
    config = load_config(TINY, ["train.epochs=1", "train.log_every=1", "train.max_bad_steps=3"])
    trainer = window_engine(config, tiny_data, tmp_path / "run", progress=False)
    poison_losses(trainer, bad_steps={2, 3, 4, 5})
    with pytest.raises(TrainingDiverged, match=r"3 optimiser steps in a row .* train\.max_bad_steps=3"):
        trainer.fit()
    assert issubclass(TrainingDiverged, RunError)  # the CLI prints it as one line


SYNCING = {
    "item",
    "tolist",
    "numpy",
    "cpu",
    "__bool__",
    "__float__",
    "__int__",
    "__index__",
    "nonzero",
    "masked_select",
    "unique",
}
"""Tensor reads that wait for the device (host copies, Python conversions, data-dependent shapes)."""
STEP_PATH = ("forward_loss", "backward", "clip_gradients", "optimizer_step", "update_ema", "schedule_step")


class SyncRecorder(TorchFunctionMode):
    """Records tensor-to-host reads made while `inside` names a method of the step path."""

    def __init__(self) -> None:
        super().__init__()
        self.inside: str | None = None
        self.calls: list[tuple[str, str]] = []

    def __torch_function__(
        self,
        func: Any,
        types: tuple[type, ...],
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
    ) -> Any:
        name = getattr(func, "__name__", "")
        if self.inside is not None and name in SYNCING:
            self.calls.append((self.inside, name))
        return func(*args, **(kwargs or {}))


def record_step_path_syncs(trainer: Engine, recorder: SyncRecorder) -> None:
    for name in STEP_PATH:
        method = getattr(trainer, name)

        def wrapped(*args: Any, _method: Any = method, _name: str = name, **kwargs: Any) -> Any:
            recorder.inside = _name
            try:
                return _method(*args, **kwargs)
            finally:
                recorder.inside = None

        setattr(trainer, name, wrapped)


@pytest.mark.parametrize(
    "overrides",
    [
        ["train.optimizer.name=adamw", "train.ema.decay=0.9", "train.precision=bf16"],
        ["train.optimizer.name=muon", "train.accumulate=2", "train.schedule.name=plateau"],
        ["train.optimizer.name=sgd", "train.grad_clip=null", "train.optimizer.fused=false"],
    ],
)
def test_the_step_path_reads_nothing_back_to_the_host(
    tiny_data: Path, tmp_path: Path, overrides: list[str]
) -> None:
    config = load_config(TINY, ["train.epochs=2", "train.log_every=3", *overrides])
    trainer = window_engine(config, tiny_data, tmp_path / "run", progress=False)
    recorder = SyncRecorder()
    record_step_path_syncs(trainer, recorder)
    with recorder:
        trainer.fit()
    assert recorder.calls == []


def test_the_sync_recorder_catches_an_item_in_the_step(tiny_data: Path, tmp_path: Path) -> None:
    """The control of the test above: one `.item()` slipped into the step is caught."""
    trainer = window_engine(
        load_config(TINY, ["train.epochs=1"]), tiny_data, tmp_path / "run", progress=False
    )
    clip = trainer.clip_gradients

    def clip_and_peek() -> torch.Tensor:
        norm = clip()
        norm.item()
        return norm

    trainer.clip_gradients = clip_and_peek  # type: ignore[method-assign]
    recorder = SyncRecorder()
    record_step_path_syncs(trainer, recorder)
    with recorder:
        trainer.fit()
    assert recorder.calls == [("clip_gradients", "item")] * 5


def test_compile_failure_falls_back_to_eager_with_a_log_line(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    class Broken(torch.nn.Module):
        def forward(self, *args: Any, **kwargs: Any) -> Any:
            raise RuntimeError("inductor: no C++ compiler")

    monkeypatch.setattr("dynaforge.train.window.compile_model", lambda model, config: Broken())
    config = load_config(TINY, ["train.epochs=1", "train.compile.enabled=true"])
    with caplog.at_level(logging.WARNING):
        summary = train(config, tiny_data, tmp_path / "compiled", progress=False)
    assert (
        "torch.compile failed (RuntimeError: inductor: no C++ compiler); training runs eagerly" in caplog.text
    )
    eager = train(load_config(TINY, ["train.epochs=1"]), tiny_data, tmp_path / "eager", progress=False)
    assert summary.last_val_loss == eager.last_val_loss  # the trial step left no trace


def test_compiled_training_saves_plain_keys_and_matches_eager(tiny_data: Path, tmp_path: Path) -> None:
    # In a fresh interpreter: under pytest, jaxtyping's runtime checks wrap the models' forwards, and
    # dynamo cannot trace through them (a compile failure the test above shows is caught).
    run = tmp_path / "compiled"
    overrides = ["train.epochs=1", "train.compile.enabled=true", "train.compile.backend=eager"]
    one_thread = {"OMP_NUM_THREADS": "1"}  # as in this process (the `one_thread` fixture): same float sums
    args = ["train", str(TINY), *overrides, "--data", str(tiny_data), "--out", str(run), "--no-progress"]
    result = run_cli(*args, env=one_thread)
    assert "model compiled (mode default, backend eager)" in result.stderr
    raw = torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]
    assert raw and not any(k.startswith(("_orig_mod.", "module.")) for k in raw)
    train(load_config(TINY, ["train.epochs=1"]), tiny_data, tmp_path / "eager", progress=False)
    for name, value in final_weights(tmp_path / "eager").items():
        torch.testing.assert_close(raw[name], value, rtol=1e-5, atol=1e-6)


def test_ema_weights_are_what_checkpoints_evaluate(tiny_data: Path, tmp_path: Path) -> None:
    config = load_config(TINY, ["train.epochs=2", "train.ema.decay=0.8"])
    summary = train(config, tiny_data, tmp_path / "run", progress=False)
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "best.pt")
    assert set(state["model"]) == set(state["train_model"]) == set(state["ema"]["module"])
    assert all(torch.equal(state["model"][k], v) for k, v in state["ema"]["module"].items())
    assert any(not torch.equal(state["model"][k], v) for k, v in state["train_model"].items())
    model = model_from_checkpoint(state)  # what `dynaforge evaluate` loads: the EMA weights
    assert all(torch.equal(model.state_dict()[k], v) for k, v in state["ema"]["module"].items())
    assert state["ema"]["updates"].item() == summary.steps == 10
    raw = train(
        load_config(TINY, ["train.epochs=2", "train.ema.decay=0.8", "train.ema.evaluate=false"]),
        tiny_data,
        tmp_path / "raw",
        progress=False,
    )
    assert raw.last_val_loss != summary.last_val_loss  # validation used the trained weights this time
    assert "train_model" not in load_checkpoint(tmp_path / "raw" / "checkpoints" / "last.pt")


def test_bf16_training_learns_like_fp32(tiny_data: Path, tmp_path: Path) -> None:
    fp32 = train(load_config(TINY, []), tiny_data, tmp_path / "fp32", progress=False)
    bf16 = train(load_config(TINY, ["train.precision=bf16"]), tiny_data, tmp_path / "bf16", progress=False)
    epochs = [
        r["val_loss"] for r in read_metrics(tmp_path / "bf16" / "metrics.jsonl") if r["kind"] == "epoch"
    ]
    assert epochs[-1] < 0.5 * epochs[0]
    assert bf16.last_val_loss == pytest.approx(fp32.last_val_loss, rel=0.2)
    assert bf16.last_val_loss != fp32.last_val_loss  # it did run in another precision


def test_per_epoch_schedule_holds_the_lr_through_each_epoch(tiny_data: Path, tmp_path: Path) -> None:
    overrides = [
        "train.epochs=4",
        "train.log_every=1",
        "train.schedule.name=step",
        "train.schedule.interval=epoch",
        "train.schedule.warmup_fraction=0.5",
        "train.schedule.gamma=0.1",
    ]
    train(load_config(TINY, overrides), tiny_data, tmp_path / "run", progress=False)
    windows = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "train"]
    per_epoch = [sorted({w["lr"] for w in windows if w["epoch"] == e}) for e in (1, 2, 3, 4)]
    assert per_epoch == [
        [pytest.approx(0.005)],
        [pytest.approx(0.01)],
        [pytest.approx(0.01)],
        [pytest.approx(0.001)],
    ]


def test_profile_writes_a_chrome_trace_and_an_operator_table(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    assert (
        main(
            [
                "-q",
                "train",
                str(TINY),
                "train.epochs=1",
                "--data",
                str(tiny_data),
                "--out",
                str(run),
                "--profile",
                "2",
                "--no-progress",
            ]
        )
        == 0
    )
    trace = json.loads((run / "profile" / "trace.json").read_text())
    names = {event.get("name", "") for event in trace["traceEvents"]}
    # the spectral layers' mode mixing (a bmm whichever transform, fft or dft, reaches the modes)
    assert "aten::bmm" in names and "Optimizer.step#AdamW.step" in names
    table = (run / "profile" / "operators.txt").read_text()
    assert "Top 30 operators over 2 optimiser steps" in table and "aten::" in table
    assert load_checkpoint(run / "checkpoints" / "last.pt")["complete"]  # training went on


class FakeRun:
    def __init__(self, **kwargs: Any) -> None:
        self.kwargs = kwargs
        self.id = kwargs.get("id") or "fake123"
        self.logged: list[tuple[dict[str, Any], int]] = []
        self.finished = False

    def log(self, values: dict[str, Any], step: int) -> None:
        self.logged.append((values, step))

    def finish(self) -> None:
        self.finished = True


@pytest.fixture
def fake_wandb(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> list[FakeRun]:
    runs: list[FakeRun] = []
    module = types.ModuleType("wandb")
    module.init = lambda **kwargs: runs.append(FakeRun(**kwargs)) or runs[-1]  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "wandb", module)
    monkeypatch.delenv("WANDB_API_KEY", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.netrc: no key configured
    return runs


def test_wandb_runs_offline_without_a_key_and_mirrors_the_log(
    tiny_data: Path, tmp_path: Path, fake_wandb: list[FakeRun]
) -> None:
    config = load_config(TINY, ["train.epochs=2", "train.wandb.enabled=true", "train.wandb.group=study1"])
    train(config, tiny_data, tmp_path / "run", progress=False)
    (run,) = fake_wandb
    assert run.kwargs["mode"] == "offline" and run.kwargs["group"] == "study1" and run.kwargs["name"] == "run"
    assert run.kwargs["config"]["train"]["wandb"]["enabled"] is True and run.finished
    steps = [step for values, step in run.logged if "train/loss" in values]
    assert steps == [5, 10]
    assert [values["epoch/val_loss"] for values, _ in run.logged if "epoch/val_loss" in values] == [
        r["val_loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"
    ]
    assert json.loads((tmp_path / "run" / "wandb.json").read_text()) == {"id": "fake123"}
    config_online = load_config(
        TINY, ["train.epochs=1", "train.wandb.enabled=true", "train.wandb.mode=online"]
    )
    train(config_online, tiny_data, tmp_path / "online", progress=False)
    assert fake_wandb[-1].kwargs["mode"] == "online"


def test_wandb_is_never_needed_unless_asked_for(
    tiny_data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` fails as when it is not installed
    train(load_config(TINY, ["train.epochs=1"]), tiny_data, tmp_path / "plain", progress=False)
    with pytest.raises(RunError, match=r"pip install 'dynaforge\[wandb\]'"):
        train(
            load_config(TINY, ["train.epochs=1", "train.wandb.enabled=true"]),
            tiny_data,
            tmp_path / "w",
            progress=False,
        )


def test_normalize_none_trains_on_physical_fields_and_saves_an_identity_normalizer(
    tiny_data: Path, tmp_path: Path
) -> None:
    scaled = window_engine(load_config(TINY, ["train.epochs=1"]), tiny_data, tmp_path / "a", progress=False)
    physical = window_engine(
        load_config(TINY, ["train.epochs=1", "data.normalize=none"]),
        tiny_data,
        tmp_path / "b",
        progress=False,
    )
    stats = scaled.task.normalizer.to_dict()
    assert stats["std"] != [1.0] or stats["mean"] != [0.0]  # the tiny data is not already normalised
    channels = scaled.task.normalizer.channels
    assert physical.task.normalizer.to_dict() == {"mean": [0.0] * channels, "std": [1.0] * channels}
    physical.fit()
    saved = load_checkpoint(tmp_path / "b" / "checkpoints" / "last.pt")["normalization"]
    assert saved == {"mean": [0.0] * channels, "std": [1.0] * channels}
