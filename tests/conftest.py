"""Shared fixtures: tiny configs and a CLI runner. Nothing here touches the network."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"
RANDOM_CNN_TINY = [
    "system.name=random_cnn",
    "system.resolution=16",
    "system.steps=4",
    "system.space.depth.high=2",
    "system.space.width_cap.choices={'32': 1.0}",
    "system.compile=false",
]
"""Overrides that make random CNN operators small enough for a test (no preset of their own)."""


def run_cli(
    *args: str, check: bool = True, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run `dynaforge ARGS...` in a fresh interpreter, as a user would; `env` adds environment variables."""
    result = subprocess.run(
        [sys.executable, "-m", "dynaforge.cli", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"dynaforge {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture
def tiny_config_path() -> Path:
    return CONFIGS / "tiny.yaml"


@pytest.fixture
def one_thread() -> Iterator[None]:
    """Torch on one thread for the test: on a loaded machine two spin-waiting OpenMP threads run small
    models 10-30x slower. Results do not depend on it; the previous count is restored."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def tiny_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The dataset of configs/tiny.yaml (8 train, 4 val, 4 test trajectories of 11 frames on 64 points)."""
    from dynaforge.config import load_config
    from dynaforge.generate import generate

    root = tmp_path_factory.mktemp("tiny-data") / "data"
    generate(load_config(CONFIGS / "tiny.yaml"), root, progress=False)
    return root
