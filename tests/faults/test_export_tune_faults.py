"""Faults of the export and tune rooms: damaged, modified and foreign .onnx files, a rollout asked for more
than the data holds, and a tune process killed mid-trial."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.conftest import CONFIGS, run_cli
from tests.faults.conftest import fails_cleanly, file_hashes, unchanged

onnx = pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
REEXPORT = "`dynaforge export RUN --out NEW.onnx`"
"""The advice for a bad model file: export into a new file, never over the file named (it may be evidence)."""


@pytest.fixture(scope="module")
def exported(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny run exported once for the module; tests damage copies of it."""
    out = tmp_path_factory.mktemp("faults-export") / "model.onnx"
    run_cli("-q", "export", str(tiny_run), "--out", str(out), env=ONE_THREAD)
    return out


@pytest.fixture
def onnx_copy(exported: Path, tmp_path: Path) -> Path:
    return Path(shutil.copy(exported, tmp_path / "model.onnx"))


def rollout(model: Path, data: Path, *options: str) -> subprocess.CompletedProcess[str]:
    return run_cli(
        "-q", "rollout", "--onnx", str(model), "--data", str(data), *options, check=False, env=ONE_THREAD
    )


def refused(model: Path, data: Path, *names: str) -> str:
    """Roll `model` out on `data`: it must fail cleanly naming `names`, and change no file."""
    model_before, data_before = file_hashes(model), file_hashes(data)
    line = fails_cleanly(rollout(model, data), *names)
    unchanged(model_before, model)
    unchanged(data_before, data)
    return line


def test_a_truncated_onnx_is_refused_as_damaged(onnx_copy: Path, tiny_data: Path) -> None:
    content = onnx_copy.read_bytes()
    onnx_copy.write_bytes(content[: len(content) // 2])
    refused(onnx_copy, tiny_data, str(onnx_copy), "is damaged", REEXPORT)


def test_a_zeroed_onnx_is_refused_as_damaged(onnx_copy: Path, tiny_data: Path) -> None:
    onnx_copy.write_bytes(bytes(onnx_copy.stat().st_size))
    refused(onnx_copy, tiny_data, str(onnx_copy), "is damaged", REEXPORT)


def test_an_onnx_with_flipped_weight_bytes_is_refused_as_modified(onnx_copy: Path, tiny_data: Path) -> None:
    content = bytearray(onnx_copy.read_bytes())
    largest = max(onnx.load_from_string(bytes(content)).graph.initializer, key=lambda t: len(t.raw_data))
    start = content.find(largest.raw_data) + len(largest.raw_data) // 2
    content[start : start + 4] = bytes(b ^ 0xFF for b in content[start : start + 4])
    onnx_copy.write_bytes(content)
    onnx.checker.check_model(str(onnx_copy))  # still a valid model: only the weights changed
    refused(onnx_copy, tiny_data, str(onnx_copy), "was modified after export", REEXPORT)


def test_a_foreign_onnx_is_refused(tmp_path: Path, tiny_data: Path) -> None:
    # A model of the same signature written by someone else: no dynaforge metadata.
    frames = onnx.helper.make_tensor_value_info("frames", onnx.TensorProto.FLOAT, ["batch", 2, 1, 64])
    next_frames = onnx.helper.make_tensor_value_info(
        "next_frames", onnx.TensorProto.FLOAT, ["batch", 2, 1, 64]
    )
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Identity", ["frames"], ["next_frames"])], "foreign", [frames], [next_frames]
    )
    model = tmp_path / "foreign.onnx"
    onnx.save_model(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 20)]), model)
    refused(model, tiny_data, str(model), "was not written by `dynaforge export`")


def test_rollout_frames_and_samples_beyond_the_data_are_refused(
    exported: Path, tiny_data: Path, tiny_run: Path
) -> None:
    frames = json.loads((tiny_data / "manifest.json").read_text())["shape"]["frames"]
    history = yaml.safe_load((tiny_run / "config.yaml").read_text())["data"]["history"]
    available = frames - history
    fails_cleanly(
        rollout(exported, tiny_data, "--frames", "500"),
        "--frames 500",
        f"holds {frames} frames",
        f"leaving {available} to predict",
        f"--frames {available} or fewer",
    )
    fails_cleanly(rollout(exported, tiny_data, "--samples", "50"), "--samples 50", "--samples 4 or fewer")
    done = rollout(exported, tiny_data, "--frames", str(available), "--samples", "4")
    assert done.returncode == 0, done.stderr
    assert f"4 trajectories of test, {available} predicted frames" in done.stdout


def test_a_killed_tune_trial_is_retried_at_once(tmp_path: Path, tiny_data: Path) -> None:
    optuna = pytest.importorskip("optuna")
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["train"].update(epochs=2, device="cpu")
    config["tune"] = {
        "space": {"train.lr": {"kind": "log_uniform", "low": 1.0e-3, "high": 3.0e-2}},
        "sampler": "random",
        "pruner": {"name": "none"},
        # An hour: the heartbeat cannot be what fails the killed trial within this test.
        "heartbeat": 3600,
        "retries": 1,
        "plots": False,
    }
    (tmp_path / "kill.yaml").write_text(yaml.safe_dump(config))
    study = tmp_path / "study"
    args = [
        "-q",
        "tune",
        str(tmp_path / "kill.yaml"),
        "--trials",
        "2",
        "--out",
        str(study),
        "--data",
        str(tiny_data),
    ]
    process = subprocess.Popen(
        [sys.executable, "-m", "dynaforge.cli", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **ONE_THREAD},
    )
    # The trial's run folder appears when its training starts, after it recorded its process; two epochs
    # are left to run when the kill lands.
    deadline = time.monotonic() + 120
    while not (study / "trials" / "0000").exists():
        assert process.poll() is None, f"tune exited ({process.returncode}) before trial 0 started"
        assert time.monotonic() < deadline, "trial 0 did not start within 120 s"
        time.sleep(0.02)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=30)

    storage = f"sqlite:///{study / 'study.db'}"
    (killed,) = optuna.load_study(study_name="kill", storage=storage).trials
    assert killed.state == optuna.trial.TrialState.RUNNING, "trial 0 finished before the kill landed"
    assert killed.user_attrs["process"]["pid"] == process.pid

    run_cli(*args, env=ONE_THREAD)
    trials = optuna.load_study(study_name="kill", storage=storage).trials
    states = [t.state for t in trials]
    assert states[0] == optuna.trial.TrialState.FAIL  # failed at the rerun's start, not by a heartbeat
    assert states.count(optuna.trial.TrialState.COMPLETE) == 2 and len(trials) == 3
    (retry,) = [t for t in trials if t.system_attrs.get("failed_trial") == 0]
    assert retry.params == killed.params
    assert retry.user_attrs["run"] == "trials/0000" and retry.state == optuna.trial.TrialState.COMPLETE
    assert retry.user_attrs["process"]["pid"] not in (process.pid, None)


def test_rollout_refuses_a_damaged_shard(exported: Path, data_copy: Path) -> None:
    """rollout reads the dataset without PyTorch, and checks each shard's SHA-256 as the store's readers do."""
    shard = sorted((data_copy / "test").glob("shard-*.h5"))[0]
    content = bytearray(shard.read_bytes())
    content[-100] ^= 0xFF  # same size: only the checksum can tell
    shard.write_bytes(bytes(content))
    refused(exported, data_copy, str(shard), "SHA-256", "dynaforge inspect")
