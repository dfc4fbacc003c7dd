"""Fault injection: each test damages one thing on disk or in a config, runs the command a user would, and
asserts the one rule for expected failures (exit status 2, one `error:` line naming the file, key or fix,
no traceback) and that no good file on disk changed."""

from __future__ import annotations

import hashlib
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_cli


def fails_cleanly(result: subprocess.CompletedProcess[str], *names: str) -> str:
    """Assert the rule for an expected failure; returns the error line. `names` must all appear in it."""
    output = result.stdout + result.stderr
    assert result.returncode == 2, f"exit status {result.returncode}, expected 2:\n{output}"
    assert "Traceback" not in output, f"a traceback for an expected failure:\n{output}"
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, f"expected one `error:` line, got {len(errors)}:\n{output}"
    for name in names:
        assert name in errors[0], f"{name!r} is not named in: {errors[0]}"
    return errors[0]


def file_hashes(root: Path) -> dict[str, str]:
    """SHA-256 of every file below `root` (or of `root` itself), by relative path."""
    paths = [root] if root.is_file() else sorted(p for p in root.rglob("*") if p.is_file())
    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest() for p in paths}


def unchanged(before: dict[str, str], root: Path) -> None:
    """Every file hashed in `before` is still there with the same bytes (new files are allowed)."""
    after = file_hashes(root)
    changed = sorted(name for name, digest in before.items() if after.get(name) != digest)
    assert not changed, f"good files changed or vanished: {changed}"


@pytest.fixture(scope="session")
def tiny_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """configs/tiny.yaml trained for 2 epochs on `tiny_data` (best.pt and last.pt)."""
    run = tmp_path_factory.mktemp("faults-run") / "run"
    run_cli(
        "train", str(CONFIGS / "tiny.yaml"), "train.epochs=2", "--data", str(tiny_data), "--out", str(run)
    )
    return run


@pytest.fixture
def data_copy(tiny_data: Path, tmp_path: Path) -> Path:
    """A copy of the tiny dataset that a test may damage."""
    return Path(shutil.copytree(tiny_data, tmp_path / "data"))


@pytest.fixture
def run_copy(tiny_run: Path, tmp_path: Path) -> Path:
    """A copy of the tiny run that a test may damage."""
    return Path(shutil.copytree(tiny_run, tmp_path / "run"))
