"""`dynaforge generate --processes N`: worker processes of one machine write the same bytes as one process,
and `--processes auto` (the CLI's default) follows the rule `auto_processes` states."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dynaforge.config import load_config
from dynaforge.errors import DatasetError
from dynaforge.generate import generate, verify_dataset
from dynaforge.generate.stage import AUTO_MIN_WORK, auto_processes, parse_processes

from ..conftest import CONFIGS, run_cli
from .test_reproducibility import dataset_arrays

OVERRIDES = [
    "system.resolution=64",
    "system.steps=20",
    "dataset.n_train=9",
    "dataset.n_val=4",
    "dataset.n_test=3",
    "dataset.shard_size=3",
    "dataset.batch_size=2",
]
"""Burgers 1D (tiny.yaml) in 6 shards of at most 3 samples, batches of 2: two workers take 3 shards each."""


def test_two_processes_write_the_bytes_of_one(tmp_path: Path) -> None:
    one, two = tmp_path / "one", tmp_path / "two"
    generate(load_config(CONFIGS / "tiny.yaml", OVERRIDES), one, progress=False, processes=1)
    result = run_cli(
        "generate", str(CONFIGS / "tiny.yaml"), *OVERRIDES, "--out", str(two), "--processes", "2"
    )
    assert "6/6 shards, complete" in result.stdout
    assert len(list((two / "train").glob("shard-*.h5"))) == 3
    first, second = dataset_arrays(one), dataset_arrays(two)
    assert first.keys() == second.keys()
    for key, values in first.items():
        assert values.dtype == second[key].dtype and np.array_equal(values, second[key]), key
        if values.dtype != object:  # strings compare by value above
            assert values.tobytes() == second[key].tobytes(), key
    checked = verify_dataset(two, samples=None)
    assert len(checked.checks) == 16 and checked.ok


def test_auto_takes_processes_for_a_large_1d_dataset_only() -> None:
    big = [f"dataset.n_train={AUTO_MIN_WORK // (20 * 64) + 1}", "dataset.shard_size=64"]
    config = load_config(CONFIGS / "tiny.yaml", big)
    assert auto_processes(config, shards=40, threads=2, workers=1)[0] == 2
    assert auto_processes(config, shards=40, threads=8, workers=1)[0] == 8
    assert auto_processes(config, shards=3, threads=8, workers=1)[0] == 3  # no more processes than shards
    assert auto_processes(config, shards=40, threads=1, workers=1)[0] == 1
    assert auto_processes(config, shards=40, threads=2, workers=4)[0] == 1  # already one of 4 workers
    small = load_config(CONFIGS / "tiny.yaml")
    assert auto_processes(small, shards=4, threads=2, workers=1) == (
        1,
        f"a small dataset ({16 * 20 * 64:.3g} grid-point steps < {AUTO_MIN_WORK:.3g})",
    )
    ns = load_config(CONFIGS / "ns2d-tiny.yaml", ["dataset.n_train=100000"])
    count, why = auto_processes(ns, shards=40, threads=2, workers=1)
    assert count == 1 and "not a 1D periodic PDE" in why


@pytest.mark.parametrize("value", ["0", "-1", "two", "1.5", ""])
def test_a_bad_processes_value_is_named(value: str) -> None:
    with pytest.raises(DatasetError, match="--processes must be 'auto' or a whole number"):
        parse_processes(value)


def test_the_cli_says_one_error_line_for_a_bad_processes_value(tmp_path: Path) -> None:
    result = run_cli(
        "generate", str(CONFIGS / "tiny.yaml"), "--out", str(tmp_path / "d"), "--processes", "0", check=False
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: --processes must be 'auto' or a whole number of at least 1, not '0'"
    ]
    assert parse_processes("auto") == "auto" and parse_processes("3") == 3 and parse_processes(2) == 2


def test_the_generate_command_loads_no_scipy_stats_or_fft() -> None:
    """Every `generate` command, and each worker it spawns, pays its imports once: scipy.stats and scipy.fft
    (1.3 s of a 4.5 s start-up on the AMD EPYC, for the random CNN's Sobol points and Darcy's DCT only) are
    imported where those systems use them, not by the generate stage."""
    code = (
        "import sys, dynaforge.cli.commands, dynaforge.generate; "
        "print(sorted(m for m in sys.modules if m.startswith(('scipy.stats', 'scipy.fft', 'scipy.special'))))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"
