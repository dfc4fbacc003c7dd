"""Training of the learned step controller: a killed and resumed run ends where an uninterrupted one does."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.errors import RunError
from dynaforge.models.loading import load_learned_controller
from dynaforge.train.engine import Engine
from dynaforge.train.log import read_metrics
from dynaforge.train.step_controller import train_controller

TINY = Path(__file__).resolve().parents[2] / "configs" / "nbody_tiny.yaml"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


class Killed(Exception):
    """Stands for a kill after an optimiser step."""


def test_resumed_run_matches_an_uninterrupted_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # 6 steps of the window loss in epochs of 2; the interrupted run stops after step 3 (mid-episode and
    # mid-epoch, between checkpoints at 2 and 4), so the resume restarts from step 2, with the streams and
    # generator of that step, and must replay steps 3-6 exactly.
    config = load_config(TINY, ["timestepper.steps=6"])
    train_controller(config, tmp_path / "straight")
    count_step = Engine.count_step

    def count_then_stop(engine: Engine) -> None:
        count_step(engine)
        if engine.step == 3:
            raise Killed

    monkeypatch.setattr(Engine, "count_step", count_then_stop)
    with pytest.raises(Killed):
        train_controller(config, tmp_path / "killed")
    monkeypatch.setattr(Engine, "count_step", count_step)
    metrics_before = read_metrics(tmp_path / "killed" / "metrics.jsonl")
    assert max(r.get("step", 0) for r in metrics_before) == 2  # step 3 was taken, not yet logged
    assert torch.load(tmp_path / "killed" / "checkpoints" / "last.pt", weights_only=True)["step"] == 2
    train_controller(config, tmp_path / "killed", resume=True)
    straight, resumed = weights(tmp_path / "straight"), weights(tmp_path / "killed")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    lines = [r for r in read_metrics(tmp_path / "killed" / "metrics.jsonl") if r["kind"] != "resume"]
    expected = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert [(m["step"], m.get("loss"), m.get("val_loss")) for m in lines[1:]] == [
        (m["step"], m.get("loss"), m.get("val_loss")) for m in expected[1:]
    ]
    assert lines[0]["kind"] == "header" and "torch" in lines[0]


def test_checkpoint_holds_what_inference_and_provenance_need(tmp_path: Path) -> None:
    config = load_config(TINY)
    train_controller(config, tmp_path / "run")
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    assert checkpoint["kind"] == "nbody_step_controller"
    assert checkpoint["model_config"]["history"] == 0
    assert checkpoint["config"]["timestepper"]["steps"] == 4
    assert checkpoint["training_systems"]["kepler/initial_positions"].shape == (8, 2, 3)
    assert checkpoint["training_systems"]["cluster3/initial_positions"].shape == (2, 3, 3)
    controller = load_learned_controller(tmp_path / "run")
    assert not controller.net.training
    epochs = [r for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert [r["step"] for r in epochs] == [2, 4]  # validation every timestepper.eval_every steps
    assert {"val_kepler_max_error", "val_cluster3_mean_log_step"} <= epochs[-1].keys()
    with pytest.raises(RunError, match=r"resume=True"):
        train_controller(config, tmp_path / "run")
    with pytest.raises(RunError, match="different config"):
        train_controller(load_config(TINY, ["timestepper.train.lr=0.1"]), tmp_path / "run", resume=True)


def test_configs_written_before_timestepper_train_load_unchanged() -> None:
    # `timestepper.lr`, `.log_every`, ... became `timestepper.train.*`; old files and overrides still load.
    old = load_config(TINY, ["timestepper.lr=0.02", "timestepper.seed=3"])
    new = load_config(TINY, ["timestepper.train.lr=0.02", "timestepper.train.seed=3"])
    assert old == new and old.timestepper.train.lr == 0.02
    with pytest.raises(ConfigError, match="both set"):
        load_config(TINY, ["timestepper.lr=0.02", "timestepper.train.lr=0.01"])
    with pytest.raises(ConfigError, match="lbfgs_steps"):
        load_config(TINY, ["timestepper.lbfgs_steps=2"])
    assert load_config(TINY, ["timestepper.lbfgs_steps=0"]) == load_config(TINY)
