"""Faults of runs and checkpoints: damaged or unsafe checkpoints, Ctrl-C during training, a run and data that
do not belong together, and evaluation on other data (issue 21)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dynaforge.runs import load_checkpoint, run_folder
from tests.conftest import CONFIGS, run_cli
from tests.faults.conftest import fails_cleanly, file_hashes, unchanged

TINY = str(CONFIGS / "tiny.yaml")


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("verb", ["evaluate", "export"])
def test_a_truncated_best_checkpoint_is_named_with_the_fix(run_copy: Path, verb: str) -> None:
    best = run_folder(run_copy).best
    truncate(best)
    before = file_hashes(run_copy)
    extra = ["--out", str(run_copy.parent / "model.onnx")] if verb == "export" else []
    line = fails_cleanly(run_cli(verb, str(run_copy), *extra, check=False), "best.pt", "--checkpoint last")
    assert "truncated or corrupt" in line
    unchanged(before, run_copy)
    if verb == "evaluate":  # the fix it names works
        run_cli(verb, str(run_copy), "--checkpoint", "last")


@pytest.mark.parametrize("content", [b"\x08\x08\x12\x07pytorch onnx bytes", b"# README\n"])
def test_a_checkpoint_overwritten_by_another_file_is_named_as_such(run_copy: Path, content: bytes) -> None:
    """Issue 39: ONNX bytes written over best.pt made evaluate say "refused for safety"."""
    run_folder(run_copy).best.write_bytes(content)
    line = fails_cleanly(run_cli("evaluate", str(run_copy), check=False), "best.pt", "--checkpoint last")
    assert "not a PyTorch checkpoint" in line
    assert "safety" not in line


def test_a_checkpoint_carrying_a_pickle_payload_is_refused_for_safety(run_copy: Path, tmp_path: Path) -> None:
    marker = tmp_path / "payload-ran"
    payload = (
        "import os, torch\n"
        "class Payload:\n"
        f"    def __reduce__(self): return (os.system, ('touch {marker}',))\n"
        f"torch.save({{'format_version': 1, 'model': Payload()}}, {str(run_folder(run_copy).best)!r})\n"
    )
    subprocess.run([sys.executable, "-c", payload], check=True)
    line = fails_cleanly(run_cli("evaluate", str(run_copy), check=False), "best.pt", "refused for safety")
    assert "weights_only" not in line
    assert not marker.exists(), "the payload ran"


def test_resume_falls_back_from_a_damaged_last_checkpoint_to_best(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    args = ["train", TINY, "train.epochs=3", "--data", str(tiny_data), "--out", str(run)]
    run_cli(*args)
    folder = run_folder(run)
    best_epoch = load_checkpoint(folder.best)["epoch"]
    truncate(folder.last)
    result = run_cli(*args, "--resume", check=False)
    assert result.returncode == 0, result.stderr
    assert "last.pt cannot be read" in result.stderr and "resuming from" in result.stderr
    assert f"best.pt instead (epoch {best_epoch}" in result.stderr
    state = load_checkpoint(folder.last)
    assert state["complete"] and state["epoch"] == 3


def test_resume_with_both_checkpoints_damaged_names_both(run_copy: Path, tiny_data: Path) -> None:
    folder = run_folder(run_copy)
    truncate(folder.last)
    truncate(folder.best)
    before = file_hashes(run_copy)
    args = ["train", TINY, "train.epochs=2", "--data", str(tiny_data), "--out", str(run_copy), "--resume"]
    line = fails_cleanly(run_cli(*args, check=False), "last.pt", "best.pt", "new --out")
    assert line.startswith("error: neither checkpoint")
    unchanged(before, run_copy)


def test_ctrl_c_stops_training_at_a_safe_point_and_says_how_to_resume(
    tiny_data: Path, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = ["train", TINY, "train.epochs=400", "--data", str(tiny_data), "--out", str(run), "--no-progress"]
    process = subprocess.Popen(
        [sys.executable, "-m", "dynaforge.cli", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    last = run_folder(run).last
    deadline = time.monotonic() + 120
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, "training ended before it could be interrupted"
    process.send_signal(signal.SIGINT)
    stdout, stderr = process.communicate(timeout=120)
    result = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    line = fails_cleanly(result, "last.pt", "--resume")
    assert line.startswith("error: interrupted at step")
    state = load_checkpoint(last)
    assert not state["complete"]
    step = int(line.split("interrupted at step ")[1].split(";")[0])
    assert state["step"] == step


def test_a_config_of_another_system_is_refused_on_generated_data(tiny_data: Path, tmp_path: Path) -> None:
    run = tmp_path / "run"
    before = file_hashes(tiny_data)
    result = run_cli(
        "train", str(CONFIGS / "ns2d-tiny.yaml"), "--data", str(tiny_data), "--out", str(run), check=False
    )
    line = fails_cleanly(result, str(tiny_data))
    assert "system.name: burgers (data) != navier_stokes (config)" in result.stderr, line
    assert "system.ndim: 1 (data) != 2 (config)" in result.stderr
    assert not (run / "config.yaml").exists()
    unchanged(before, tiny_data)


def test_evaluating_on_other_data_writes_its_own_folder(
    run_copy: Path, data_copy: Path, tmp_path: Path
) -> None:
    other = tmp_path / "other-seed"
    run_cli("generate", TINY, "dataset.seed=7", "--out", str(other), "--no-progress")
    run_cli("evaluate", str(run_copy))
    own = file_hashes(run_folder(run_copy).eval)
    run_cli("evaluate", str(run_copy), "--data", str(other))
    unchanged(own, run_folder(run_copy).eval)
    assert (run_copy / "eval-other-seed" / "metrics.json").is_file()
    # A copy of the run's own data, elsewhere, is still its own data: RUN/eval, no new folder.
    run_cli("evaluate", str(run_copy), "--data", str(data_copy))
    assert not (run_copy / f"eval-{data_copy.name}").exists()


def test_evaluating_on_data_of_another_grid_is_refused(run_copy: Path, tmp_path: Path) -> None:
    other = tmp_path / "coarse"
    run_cli("generate", TINY, "system.resolution=32", "--out", str(other), "--no-progress")
    before = file_hashes(run_copy)
    result = run_cli("evaluate", str(run_copy), "--data", str(other), check=False)
    fails_cleanly(result, str(run_copy))
    assert f"space: (32,) ({other}) != (64,) (trained on)" in result.stderr
    unchanged(before, run_copy)
