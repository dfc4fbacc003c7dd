"""Damaged datasets and unreadable source files: readers and `convert` refuse them before using them.

Each test damages one thing, runs the command a user would, and checks the rule for expected failures
(exit 2, one `error:` line naming the file or key and the fix, no traceback), that nothing was written
where the result would go, and that no good file changed.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import h5py
import numpy as np
import pytest

from dynaforge.store.the_well import write_well_file
from tests.conftest import CONFIGS, run_cli
from tests.faults.conftest import fails_cleanly, file_hashes, unchanged


def train(data: Path, run: Path) -> subprocess.CompletedProcess[str]:
    return run_cli("train", str(CONFIGS / "tiny.yaml"), "--data", str(data), "--out", str(run), check=False)


def edit_manifest(root: Path, edit: dict[str, object]) -> None:
    """Set `manifest[a][b]... = value` for each dotted key of `edit`, as a hand edit would."""
    manifest = json.loads((root / "manifest.json").read_text())
    for key, value in edit.items():
        *parents, last = key.split(".")
        node = manifest
        for parent in parents:
            node = node[parent]
        node[last] = value
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2))


@pytest.mark.parametrize("split", ["train", "test"])
def test_train_refuses_a_shard_whose_fields_bytes_were_flipped(
    data_copy: Path, tmp_path: Path, split: str
) -> None:
    """A damaged test shard too: a folder `inspect` calls invalid is never trained on."""
    shard = sorted((data_copy / split).glob("shard-*.h5"))[-1]
    with h5py.File(shard, "r") as h5:
        offset = h5["fields"].id.get_chunk_info(1).byte_offset  # sample 1's chunk
    data = bytearray(shard.read_bytes())
    for i in range(100, 104):
        data[offset + i] ^= 0x55  # the file keeps its size: only the checksum can tell
    shard.write_bytes(bytes(data))
    before = file_hashes(data_copy)
    run = tmp_path / "run"
    error = fails_cleanly(train(data_copy, run), str(shard), "SHA-256", "dynaforge generate")
    assert "dynaforge inspect" in error
    assert not run.exists()
    unchanged(before, data_copy)


def test_train_and_inspect_refuse_an_edited_std(data_copy: Path, tmp_path: Path) -> None:
    edit_manifest(data_copy, {"stats.std": [100.0]})
    before = file_hashes(data_copy)
    run = tmp_path / "run"
    fails_cleanly(
        train(data_copy, run), str(data_copy / "manifest.json"), "stats.std[0]", "dynaforge generate"
    )
    assert not run.exists()
    inspect = run_cli("inspect", str(data_copy), check=False)
    assert inspect.returncode == 2 and "stats.std[0] is 100.0" in inspect.stderr + inspect.stdout
    unchanged(before, data_copy)


def test_train_refuses_an_edited_sample_count(data_copy: Path, tmp_path: Path) -> None:
    edit_manifest(data_copy, {"splits.train.n_samples": 9})
    before = file_hashes(data_copy)
    run = tmp_path / "run"
    fails_cleanly(
        train(data_copy, run),
        str(data_copy / "manifest.json"),
        "splits.train.n_samples",
        "dynaforge generate",
    )
    assert not run.exists()
    unchanged(before, data_copy)


def well_file(path: Path, trajectories: int = 4) -> Path:
    rng = np.random.default_rng(0)
    write_well_file(
        path,
        {"t0_fields/pressure": rng.normal(size=(trajectories, 5, 8))},
        time=np.linspace(0, 0.4, 5),
        coords={"x": np.arange(8) / 8},
    )
    return path


def test_convert_refuses_a_complex_field(tmp_path: Path) -> None:
    source = well_file(tmp_path / "waves.hdf5")
    with h5py.File(source, "r+") as h5:
        group = h5["t0_fields"]
        attrs = dict(group["pressure"].attrs)
        values = group["pressure"][...]
        del group["pressure"]
        group.create_dataset("pressure", data=values * np.exp(1j * values).astype(np.complex64))
        group["pressure"].attrs.update(attrs)
    before = file_hashes(source)
    out = tmp_path / "converted"
    error = fails_cleanly(run_cli("convert", str(source), "--out", str(out), check=False), str(source))
    assert "t0_fields/pressure" in error and "complex" in error
    assert not out.exists()
    unchanged(before, source)


def test_convert_refuses_an_empty_train_split(tmp_path: Path) -> None:
    source = well_file(tmp_path / "one.hdf5", trajectories=1)
    before = file_hashes(source)
    out = tmp_path / "converted"
    fails_cleanly(run_cli("convert", str(source), "--out", str(out), check=False), str(source), "--splits")
    assert not out.exists()
    unchanged(before, source)
