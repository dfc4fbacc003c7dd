"""The staged latent stack end to end on the tiny preset: stages chain through their checkpoints, every
checkpoint carries its config, stages.json records progress, a rerun skips done stages, and a run killed
with SIGKILL in the middle of a stage resumes that stage from its last checkpoint."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from dynaforge.config import load_config
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import load_stack, predictor_corrector_rollout
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.runs import load_checkpoint
from dynaforge.train.stages import DEFAULT_STAGES, STAGES, run_stages
from tests.conftest import CONFIGS

FAST = [
    "stages.operator.epochs=1",
    "stages.diffusion_residual.epochs=1",
    "stages.consistency_distill.epochs=1",
    "stages.steady_prior.epochs=1",
]
MODEL_OF_STAGE = {
    "operator": "latent",
    "diffusion_residual": "flow",
    "consistency_distill": "flow",
    "steady_prior": "flow",
}


@pytest.fixture(scope="module")
def stack_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from dynaforge.generate import generate

    root = tmp_path_factory.mktemp("stack-data") / "data"
    generate(load_config(CONFIGS / "tiny-latent.yaml"), root, progress=False)
    return root


def test_stages_chain_record_status_and_skip_when_done(
    stack_data: Path, tmp_path: Path, one_thread: None
) -> None:
    config = load_config(
        CONFIGS / "tiny-latent.yaml",
        [*FAST, "stages.diffusion_residual.interval=2", "stages.consistency_distill.temperature=0.5"],
    )
    status = run_stages(config, stack_data, tmp_path / "run", progress=False)
    # stage=all: the default stages; the steady prior is opt-in
    assert list(status["stages"]) == list(DEFAULT_STAGES) == [s for s in STAGES if s != "steady_prior"]
    assert not (tmp_path / "run" / "steady_prior").exists()
    status = run_stages(config, stack_data, tmp_path / "run", stage="steady_prior", progress=False)
    assert list(status["stages"]) == list(STAGES)
    assert all(record["status"] == "done" for record in status["stages"].values())
    assert json.loads((tmp_path / "run" / "stages.json").read_text()) == status
    for name, model_name in MODEL_OF_STAGE.items():
        state = load_checkpoint(tmp_path / "run" / name / "checkpoints" / "best.pt")
        assert state["config"]["model"]["name"] == model_name  # the model's config travels with its weights
        model_from_checkpoint(state)  # rebuilt from the checkpoint alone
    corrector = load_checkpoint(tmp_path / "run" / "diffusion_residual" / "checkpoints" / "best.pt")
    assert corrector["config"]["model"]["scale"] > 0 and corrector["config"]["model"]["condition_frames"] == 2
    student = load_checkpoint(tmp_path / "run" / "consistency_distill" / "checkpoints" / "best.pt")
    assert student["sampler_steps"] == 1 and corrector["sampler_steps"] == 4
    assert corrector["interval"] == 2 and student["interval"] == 2  # trained on 2-step rollout residuals
    # the stack runs: operator + student corrector every 2 steps
    stack = load_stack(tmp_path / "run")
    assert stack.corrector is not None and stack.corrector.interval == 2
    assert student["temperature"] == 0.5 and stack.student is not None and stack.student.temperature == 0.5
    frames = torch.zeros(2, 2, 1, 64, dtype=torch.float32)
    conditions = Conditions(
        dt=torch.full((2,), stack.dt, dtype=torch.float32),
        params=torch.zeros(2, len(stack.parameters.mean), dtype=torch.float32),
    )
    with torch.inference_mode():
        rollout = predictor_corrector_rollout(stack.operator, stack.student, frames, conditions, 3, every=2)
    assert rollout.shape == (2, 3, 1, 64) and torch.isfinite(rollout).all()
    # a rerun skips every stage: no checkpoint is rewritten
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*.pt")}
    run_stages(config, stack_data, tmp_path / "run", progress=False)
    assert {p: p.stat().st_mtime_ns for p in (tmp_path / "run").rglob("*.pt")} == stamps


def test_rerun_with_another_config_is_refused(stack_data: Path, tmp_path: Path, one_thread: None) -> None:
    from dynaforge.errors import RunError

    config = load_config(CONFIGS / "tiny-latent.yaml", FAST)
    run_stages(config, stack_data, tmp_path / "run", stage="operator", progress=False)
    other = load_config(CONFIGS / "tiny-latent.yaml", [*FAST, "stages.operator.lr=0.1"])
    with pytest.raises(RunError, match=r"stages\.operator\.lr"):
        run_stages(other, stack_data, tmp_path / "run", progress=False)


@pytest.mark.slow
def test_sigkill_mid_stage_then_rerun_resumes_that_stage(
    stack_data: Path, tmp_path: Path, one_thread: None
) -> None:
    run = tmp_path / "run"
    overrides = [*FAST, "stages.diffusion_residual.epochs=12", "train.checkpoint_every=2"]
    config = load_config(CONFIGS / "tiny-latent.yaml", overrides)
    run_stages(config, stack_data, run, stage="operator", progress=False)  # in process: quicker
    command = [
        sys.executable, "-m", "dynaforge.cli", "-q", "train", str(CONFIGS / "tiny-latent.yaml"), "stage=all",
        *overrides, "--data", str(stack_data), "--out", str(run), "--no-progress",
    ]  # fmt: skip
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    errors = tmp_path / "stderr.txt"
    with errors.open("wb") as stderr:
        process = subprocess.Popen(command, env=env, stdout=subprocess.DEVNULL, stderr=stderr)
    last = run / "diffusion_residual" / "checkpoints" / "last.pt"
    deadline = time.monotonic() + 120
    while not last.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert process.poll() is None, errors.read_text()
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    status = json.loads((run / "stages.json").read_text())
    assert status["stages"]["operator"]["status"] == "done"
    assert status["stages"]["diffusion_residual"]["status"] == "running"
    operator_log = (run / "operator" / "metrics.jsonl").read_text()
    run_stages(config, stack_data, run, progress=False)  # the rerun, in process
    status = json.loads((run / "stages.json").read_text())
    assert all(record["status"] == "done" for record in status["stages"].values())
    assert (run / "operator" / "metrics.jsonl").read_text() == operator_log  # skipped, not retrained
    records = [
        json.loads(line) for line in (run / "diffusion_residual" / "metrics.jsonl").read_text().splitlines()
    ]
    resumes = [r for r in records if r.get("kind") == "resume"]
    assert len(resumes) == 1 and resumes[0]["step"] > 0  # resumed from where it was killed, not from scratch
    assert max(r["epoch"] for r in records if r.get("kind") == "epoch") == 12


def test_a_multi_frame_horizon_is_refused_with_the_fix(stack_data: Path, tmp_path: Path) -> None:
    from dynaforge.config import ConfigError

    config = load_config(CONFIGS / "tiny-latent.yaml", [*FAST, "data.horizon=2"])
    with pytest.raises(ConfigError, match=r"set data\.horizon=1.*stages\.diffusion_residual\.interval"):
        run_stages(config, stack_data, tmp_path / "run", progress=False)
    assert not (tmp_path / "run").exists()  # refused before anything is written
