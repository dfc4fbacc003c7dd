"""The SLURM examples in scripts/slurm/, rendered: each runs under bash with the variables SLURM sets and
stand-ins for srun, scontrol, torchrun and dynaforge that record the command they would run."""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parents[2] / "scripts" / "slurm"

RECORDER = """#!/bin/bash
echo "$(basename "$0") $*" >> "$RECORD"
"""
SRUN = """#!/bin/bash
echo "srun $*" >> "$RECORD"
while [[ "$1" == --* ]]; do shift; done
exec "$@"
"""
SCONTROL = """#!/bin/bash
printf 'gpu-node07\\ngpu-node08\\n'
seq 9 20000 | sed 's/^/gpu-node/'  # a long list: a reader that stops early would kill this with SIGPIPE
"""


def render(script: str, args: list[str], env: dict[str, str], tmp_path: Path) -> list[list[str]]:
    """Run scripts/slurm/`script` with fake cluster commands; the commands it ran, split into words."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name, body in {
        "srun": SRUN,
        "scontrol": SCONTROL,
        "torchrun": RECORDER,
        "dynaforge": RECORDER,
    }.items():
        (bin_dir / name).write_text(body)
        (bin_dir / name).chmod(0o755)
    record = tmp_path / "record.txt"
    record.unlink(missing_ok=True)
    full_env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "RECORD": str(record), "HOME": str(tmp_path), **env}
    result = subprocess.run(
        ["bash", str(SCRIPTS / script), *args], env=full_env, capture_output=True, text=True, timeout=30
    )
    assert result.returncode == 0, result.stderr
    return [shlex.split(line) for line in record.read_text().splitlines()]


def sbatch_options(script: str) -> dict[str, str]:
    lines = (SCRIPTS / script).read_text().splitlines()
    options = [line.split(maxsplit=1)[1] for line in lines if line.startswith("#SBATCH")]
    pairs = [option.lstrip("-").split("=", 1) for option in options]
    return {pair[0]: pair[1] if len(pair) == 2 else "" for pair in pairs}  # a flag (--requeue) maps to ""


@pytest.mark.parametrize("script", ["generate.sbatch", "train.sbatch"])
def test_scripts_are_valid_bash_with_sbatch_headers(script: str) -> None:
    path = SCRIPTS / script
    assert path.read_text().startswith("#!/bin/bash\n") and os.access(path, os.X_OK)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    options = sbatch_options(script)
    assert {"job-name", "time", "output"} <= set(options)


def test_generate_array_task_writes_its_share_of_the_shards(tmp_path: Path) -> None:
    env = {"SLURM_ARRAY_TASK_ID": "13", "SLURM_ARRAY_TASK_MIN": "10", "SLURM_ARRAY_TASK_COUNT": "6"}
    env["SLURM_CPUS_PER_TASK"] = "4"
    commands = render(
        "generate.sbatch", ["configs/ns2d.yaml", "/scratch/ns2d", "dataset.n_train=4096"], env, tmp_path
    )
    assert commands == [
        [
            "dynaforge", "generate", "configs/ns2d.yaml", "dataset.n_train=4096", "--out", "/scratch/ns2d",
            "--shard-index", "3", "--num-shards", "6", "--no-progress",
        ]
    ]  # fmt: skip
    assert "array" in sbatch_options("generate.sbatch")


def test_train_job_starts_one_torchrun_per_node_with_a_shared_rendezvous(tmp_path: Path) -> None:
    env = {
        "SLURM_JOB_ID": "4242",
        "SLURM_JOB_NUM_NODES": "2",
        "SLURM_JOB_NODELIST": "gpu-node[07-08]",
        "SLURM_GPUS_ON_NODE": "4",
        "SLURM_CPUS_PER_TASK": "32",
    }
    args = ["configs/quickstart.yaml", "/scratch/data", "/scratch/runs/fno", "train.preset=fast"]
    srun, torchrun = render("train.sbatch", args, env, tmp_path)
    assert srun[:2] == ["srun", "--kill-on-bad-exit=1"]
    assert torchrun == [
        "torchrun", "--nnodes=2", "--nproc-per-node=4", "--rdzv-id=4242", "--rdzv-backend=c10d",
        "--rdzv-endpoint=gpu-node07:29500", "-m", "dynaforge.cli", "train", "configs/quickstart.yaml",
        "train.preset=fast", "--data", "/scratch/data", "--out", "/scratch/runs/fno", "--resume", "--no-progress",
    ]  # fmt: skip
    options = sbatch_options("train.sbatch")
    assert options["ntasks-per-node"] == "1" and options["requeue"] == ""


def test_scripts_say_how_to_call_them_when_arguments_are_missing(tmp_path: Path) -> None:
    result = subprocess.run(
        ["bash", str(SCRIPTS / "train.sbatch"), "only-a-config.yaml"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode != 0 and "usage: sbatch --nodes=N scripts/slurm/train.sbatch" in result.stderr
