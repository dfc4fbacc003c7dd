"""`dynaforge twophase train` end to end on the tiny preset: the run folder, refusing to clobber a run,
resuming a finished run, and resuming after the process is killed (SIGKILL) mid-run."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch

from dynaforge.cli import main
from dynaforge.runs import load_checkpoint
from dynaforge.train.log import read_metrics

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "two_phase_tiny.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_train_writes_a_run_folder_and_refuses_to_overwrite_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert main(["-q", "twophase", "train", TINY, "--out", str(run), "--threads", "1"]) == 0
    assert "3 epochs, 12 windows" in capsys.readouterr().out
    for name in ("config.yaml", "metrics.jsonl", "checkpoints/last.pt", "checkpoints/best.pt"):
        assert (run / name).exists(), name
    records = read_metrics(run / "metrics.jsonl")
    assert records[0]["kind"] == "header" and records[0]["trainer"] == "two_phase"
    assert [r["step"] for r in records if r["kind"] == "train"] == [2, 4, 6, 8, 10, 12]
    before = weights(run)
    assert main(["-q", "twophase", "train", TINY, "--out", str(run)]) == 2
    assert "--resume" in capsys.readouterr().err
    assert main(["-q", "twophase", "train", TINY, "--out", str(run), "--resume"]) == 0  # finished: no-op
    for name, value in weights(run).items():
        assert torch.equal(value, before[name])


# Python >= 3.12 warns when a process with threads forks; the child here only trains and exits.
@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_resume_after_sigkill_gives_the_weights_of_an_uninterrupted_run(tmp_path: Path) -> None:
    # 256 inputs in batches of 8: 32 windows per epoch, 96 in all; last.pt every 16 windows.
    longer = [
        "train.epochs=3",
        "train.checkpoint_every=16",
        "train.log_every=8",
        "twophase.task.train_samples=256",
    ]
    assert main(["-q", "twophase", "train", TINY, *longer, "--out", str(tmp_path / "whole")]) == 0
    killed = tmp_path / "killed"
    # A forked child (the interpreter already holds torch: no second start-up) runs the CLI and is killed
    # with SIGKILL as soon as its first checkpoint exists: no handler, no clean-up, like a lost node.
    child = os.fork()
    if child == 0:
        code = 1
        try:
            code = main(["-q", "twophase", "train", TINY, *longer, "--out", str(killed)])
        finally:
            os._exit(code)
    last = killed / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 60
    finished = False
    while not last.exists() and not finished and time.monotonic() < deadline:
        finished = os.waitpid(child, os.WNOHANG) != (0, 0)
        time.sleep(0.002)
    if finished:
        pytest.fail("the training child exited before it wrote a checkpoint")
    os.kill(child, signal.SIGKILL)
    _, status = os.waitpid(child, 0)
    if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0:
        pytest.skip("the run finished before it could be killed (machine too fast for this test)")
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL
    stopped_at = load_checkpoint(last)["step"]
    assert 0 < stopped_at < 96
    assert main(["-q", "twophase", "train", TINY, *longer, "--out", str(killed), "--resume"]) == 0
    whole = weights(tmp_path / "whole")
    for name, value in weights(killed).items():
        assert torch.equal(value, whole[name]), name
    resumes = [r for r in read_metrics(killed / "metrics.jsonl") if r["kind"] == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] == stopped_at
