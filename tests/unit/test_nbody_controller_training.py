"""Training of the learned step controller: a killed and resumed run ends where an uninterrupted one does."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.models.step_controller import load_learned_controller
from dynaforge.train.log import read_metrics
from dynaforge.train.nbody_controller import train_controller

TINY = Path(__file__).resolve().parents[2] / "configs" / "nbody_tiny.yaml"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def weights(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "checkpoints" / "last.pt", weights_only=True)["model"]


def test_resumed_run_matches_an_uninterrupted_one(tmp_path: Path) -> None:
    # 4 Adam steps then 2 L-BFGS iterations; the interrupted run stops after step 3 (mid-episode, between
    # checkpoints at 2 and 4), so the resume restarts from step 2 and must replay steps 3-6 exactly.
    config = load_config(TINY, ["timestepper.lbfgs_steps=2"])
    train_controller(config, tmp_path / "straight")
    train_controller(config, tmp_path / "killed", stop_after=3)
    metrics_before = (tmp_path / "killed" / "metrics.jsonl").read_text().splitlines()
    assert max(json.loads(line).get("step", 0) for line in metrics_before) == 3
    train_controller(config, tmp_path / "killed", resume=True)
    straight, resumed = weights(tmp_path / "straight"), weights(tmp_path / "killed")
    assert straight.keys() == resumed.keys()
    for name in straight:
        assert torch.equal(straight[name], resumed[name]), name
    lines = [r for r in read_metrics(tmp_path / "killed" / "metrics.jsonl") if r["kind"] != "resume"]
    expected = read_metrics(tmp_path / "straight" / "metrics.jsonl")
    assert [(m["step"], m.get("loss")) for m in lines[1:]] == [
        (m["step"], m.get("loss")) for m in expected[1:]
    ]
    assert lines[0]["kind"] == "header" and "torch" in lines[0]


def test_checkpoint_holds_what_inference_and_provenance_need(tmp_path: Path) -> None:
    config = load_config(TINY)
    train_controller(config, tmp_path / "run")
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    assert checkpoint["model_config"]["history"] == 0
    assert checkpoint["config"]["timestepper"]["steps"] == 4
    assert checkpoint["training_systems"]["kepler/initial_positions"].shape == (8, 2, 3)
    assert checkpoint["training_systems"]["cluster3/initial_positions"].shape == (2, 3, 3)
    controller = load_learned_controller(tmp_path / "run")
    assert not controller.net.training
    with pytest.raises(ConfigError, match="--resume"):
        train_controller(config, tmp_path / "run")
    with pytest.raises(ConfigError, match="config differs"):
        train_controller(load_config(TINY, ["timestepper.lr=0.1"]), tmp_path / "run", resume=True)
