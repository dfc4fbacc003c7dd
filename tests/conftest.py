"""Shared fixtures: tiny configs and a CLI runner. Nothing here touches the network."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "configs"


def run_cli(*args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run `dynaforge ARGS...` in a fresh interpreter, as a user would."""
    result = subprocess.run(
        [sys.executable, "-m", "dynaforge.cli", *args], capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"dynaforge {' '.join(args)} failed ({result.returncode}):\n{result.stdout}\n{result.stderr}"
        )
    return result


@pytest.fixture
def tiny_config_path() -> Path:
    return CONFIGS / "tiny.yaml"
