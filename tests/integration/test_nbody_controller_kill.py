"""Controller training killed with SIGKILL mid-run and resumed ends exactly where an uninterrupted run does."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

from dynaforge.config import load_config
from dynaforge.train.log import read_metrics
from dynaforge.train.step_controller import train_controller

TINY = Path(__file__).resolve().parents[2] / "configs" / "nbody_tiny.yaml"
OVERRIDES = ["timestepper.steps=16", "timestepper.train.checkpoint_every=2", "timestepper.eval_every=4"]


def test_sigkilled_training_resumes_to_the_uninterrupted_result(tmp_path: Path) -> None:
    killed = tmp_path / "killed"
    command = [sys.executable, "-m", "dynaforge.cli", "-q", "nbody", "train", str(TINY), *OVERRIDES]
    command += ["--out", str(killed), "--threads", "1"]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    last = killed / "checkpoints" / "last.pt"
    while not last.exists():
        assert process.poll() is None, "training ended before it could be killed"
        assert time.monotonic() < deadline, "no checkpoint written in time"
        time.sleep(0.005)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    saved = torch.load(last, weights_only=True)
    assert saved["step"] < 16 and not saved["complete"], "the kill must land mid-run"

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        config = load_config(TINY, OVERRIDES)
        train_controller(config, killed, resume=True)
        train_controller(config, tmp_path / "straight")
    finally:
        torch.set_num_threads(previous)

    resumed = torch.load(last, weights_only=True)
    straight = torch.load(tmp_path / "straight" / "checkpoints" / "last.pt", weights_only=True)
    assert resumed["complete"] and resumed["step"] == straight["step"] == 16
    for name, value in straight["model"].items():
        assert torch.equal(resumed["model"][name], value), name
    assert resumed["best_val_loss"] == straight["best_val_loss"]
    logged = [r for r in read_metrics(killed / "metrics.jsonl") if r["kind"] in ("train", "epoch")]
    expected = [r for r in read_metrics(tmp_path / "straight" / "metrics.jsonl") if r["kind"] != "header"]
    assert [(r["step"], r.get("loss"), r.get("val_loss")) for r in logged] == [
        (r["step"], r.get("loss"), r.get("val_loss")) for r in expected
    ]
    kinds = [r["kind"] for r in read_metrics(killed / "metrics.jsonl")]
    assert kinds[0] == "header" and kinds.count("resume") == 1
