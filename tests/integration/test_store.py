"""The dataset store: determinism across sharding, resumption after SIGKILL, and detection of bad data."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

from dynaforge.config import Config, load_config
from dynaforge.generate import generate
from dynaforge.seeds import SPLITS, sample_seed
from dynaforge.store import DatasetError, DatasetFolder, validate_dataset

from ..conftest import CONFIGS, run_cli


def tiny(*overrides: str) -> Config:
    return load_config(CONFIGS / "tiny.yaml", list(overrides))


def read_all(root: Path) -> dict[str, dict[str, np.ndarray]]:
    folder = DatasetFolder(root)
    arrays = {}
    for split in SPLITS:
        data = folder.read_split(split)
        arrays[split] = {
            "fields": data.fields,
            "params": data.params,
            "seeds": data.seeds,
            "x": data.coords["x"],
        }
    return arrays


def assert_same_arrays(a: dict, b: dict) -> None:
    for split in SPLITS:
        for key in a[split]:
            np.testing.assert_array_equal(a[split][key], b[split][key], err_msg=f"{split}/{key}")


def test_generate_writes_a_valid_documented_layout(tmp_path: Path) -> None:
    manifest = generate(tiny(), tmp_path / "d", progress=False)
    assert manifest["complete"]
    result = validate_dataset(tmp_path / "d")
    assert result.ok, result.errors
    config = tiny().system
    with h5py.File(tmp_path / "d" / "train" / "shard-00000.h5", "r") as h5:
        assert h5["fields"].dtype == np.float32
        assert h5["fields"].shape == (4, config.n_frames, config.resolution, 1)
        assert [n.decode() for n in h5["param_names"][...]] == ["domain_length", "viscosity"]
        assert h5["time"].shape == (config.n_frames,)
        np.testing.assert_allclose(np.diff(h5["time"][...]), config.dt * config.save_every)
        assert h5.attrs["system"] == "burgers" and h5.attrs["format_version"] == 2
        assert "viscosity" in h5.attrs["config"]
        np.testing.assert_allclose(h5["x"][0], np.arange(config.resolution) / config.resolution)
        viscosity = h5["params"][:, 1]
        assert ((viscosity >= 0.01) & (viscosity <= 0.05)).all() and np.unique(viscosity).size == 4
    assert load_config(tmp_path / "d" / "config.yaml") == tiny()


def test_statistics_come_from_the_train_split_only(tmp_path: Path) -> None:
    generate(tiny(), tmp_path / "d", progress=False)
    folder = DatasetFolder(tmp_path / "d")
    train = folder.read_split("train").fields.astype(np.float64)
    np.testing.assert_allclose(folder.stats["mean"], [train.mean()], rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(folder.stats["std"], [train.std()], rtol=1e-10)
    everything = np.concatenate([folder.read_split(s).fields for s in SPLITS]).astype(np.float64)
    assert not np.isclose(folder.stats["std"][0], everything.std(), rtol=1e-6)


@pytest.mark.reproducibility
def test_one_shard_and_many_shards_give_identical_arrays(tmp_path: Path) -> None:
    generate(tiny("dataset.shard_size=16", "dataset.batch_size=16"), tmp_path / "one", progress=False)
    generate(tiny("dataset.shard_size=3", "dataset.batch_size=2"), tmp_path / "many", progress=False)
    assert len(list((tmp_path / "many" / "train").glob("*.h5"))) == 3
    assert_same_arrays(read_all(tmp_path / "one"), read_all(tmp_path / "many"))
    # the normalisation statistics too: merged sample by sample, not shard by shard
    assert DatasetFolder(tmp_path / "one").stats == DatasetFolder(tmp_path / "many").stats


@pytest.mark.reproducibility
def test_workers_split_the_shards_and_together_make_the_same_dataset(tmp_path: Path) -> None:
    config = tiny("dataset.shard_size=2")
    first = generate(config, tmp_path / "split", shard_index=0, num_shards=2, progress=False)
    assert not first["complete"]
    with pytest.raises(DatasetError, match="incomplete"):
        DatasetFolder(tmp_path / "split")
    generate(config, tmp_path / "split", shard_index=1, num_shards=2, progress=False)
    generate(config, tmp_path / "whole", progress=False)
    assert_same_arrays(read_all(tmp_path / "split"), read_all(tmp_path / "whole"))


def test_worker_slot_is_read_from_torchrun_and_slurm(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from dynaforge.generate.stage import worker_slot

    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert worker_slot(None, None) == (1, 3)
    monkeypatch.delenv("RANK")
    monkeypatch.delenv("WORLD_SIZE")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "5")
    monkeypatch.setenv("SLURM_ARRAY_TASK_MIN", "4")
    monkeypatch.setenv("SLURM_ARRAY_TASK_COUNT", "2")
    assert worker_slot(None, None) == (1, 2)
    assert worker_slot(0, 4) == (0, 4)
    with pytest.raises(DatasetError, match="--shard-index"):
        worker_slot(4, 4)


def test_splits_use_independent_seeds() -> None:
    seeds = {(split, i): sample_seed(0, split, i) for split in SPLITS for i in range(50)}
    assert len(set(seeds.values())) == len(seeds)
    assert sample_seed(0, "train", 3) == sample_seed(0, "train", 3)
    assert sample_seed(1, "train", 3) != sample_seed(0, "train", 3)


def test_rerun_skips_complete_shards_and_rewrites_nothing(tmp_path: Path) -> None:
    generate(tiny(), tmp_path / "d", progress=False)
    stamps = {p: p.stat().st_mtime_ns for p in (tmp_path / "d").rglob("shard-*.h5")}
    generate(tiny("dataset.batch_size=1"), tmp_path / "d", progress=False)  # batch size may change
    assert stamps == {p: p.stat().st_mtime_ns for p in (tmp_path / "d").rglob("shard-*.h5")}


def test_a_killed_generate_resumes_without_losing_or_duplicating_work(tmp_path: Path) -> None:
    overrides = [
        "system.resolution=128",
        "system.steps=400",
        "system.save_every=4",
        "dataset.n_train=16",
        "dataset.n_val=4",
        "dataset.n_test=4",
        "dataset.shard_size=2",
        "dataset.batch_size=2",
    ]
    killed = tmp_path / "killed"
    command = [
        sys.executable,
        "-m",
        "dynaforge.cli",
        "generate",
        str(CONFIGS / "tiny.yaml"),
        *overrides,
        "--out",
        str(killed),
        "--no-progress",
    ]
    process = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while len(list(killed.glob("train/shard-*.json"))) < 2:
        assert process.poll() is None, "generation finished before it could be killed; make the job larger"
        assert time.monotonic() < deadline, "no shard completed in time"
        time.sleep(0.02)
    os.kill(process.pid, signal.SIGKILL)
    process.wait()
    done_before = {
        p.with_suffix(".h5"): p.with_suffix(".h5").stat().st_mtime_ns
        for p in killed.glob("train/shard-*.json")
    }
    assert 2 <= len(done_before) < 12, "the kill must land mid-run"

    run_cli("generate", str(CONFIGS / "tiny.yaml"), *overrides, "--out", str(killed), "--no-progress")
    assert not list(killed.rglob("*.tmp")), "partial files must be cleaned up"
    for path, stamp in done_before.items():
        assert path.stat().st_mtime_ns == stamp, (
            f"{path} was completed before the kill and must not be redone"
        )
    reference = tmp_path / "reference"
    generate(load_config(CONFIGS / "tiny.yaml", overrides), reference, progress=False)
    assert_same_arrays(read_all(killed), read_all(reference))
    assert validate_dataset(killed).ok


def test_inspect_reports_a_corrupt_shard_and_generate_refuses_a_different_config(tmp_path: Path) -> None:
    root = tmp_path / "d"
    run_cli("generate", str(CONFIGS / "tiny.yaml"), "--out", str(root), "--no-progress")
    assert run_cli("inspect", str(root)).returncode == 0
    report = json.loads(run_cli("inspect", str(root), "--json").stdout)
    assert report["ok"] and report["splits"] == {"train": 8, "val": 4, "test": 4}

    shard = root / "train" / "shard-00001.h5"
    data = bytearray(shard.read_bytes())
    data[len(data) // 2] ^= 0xFF  # flip one byte inside the fields
    shard.write_bytes(bytes(data))
    result = run_cli("inspect", str(root), check=False)
    assert result.returncode != 0
    assert "train/shard-00001.h5: SHA-256 differs" in result.stderr

    before = {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".lock"}
    mismatch = run_cli(
        "generate", str(CONFIGS / "tiny.yaml"), "system.viscosity.high=0.06", "--out", str(root), check=False
    )
    assert mismatch.returncode == 2
    assert "different config" in mismatch.stderr and "viscosity" in mismatch.stderr
    assert before == {p: p.read_bytes() for p in root.rglob("*") if p.is_file() and p.suffix != ".lock"}


def test_truncated_shard_and_disagreeing_manifest_are_detected(tmp_path: Path) -> None:
    root = tmp_path / "d"
    generate(tiny(), root, progress=False)
    shard = root / "val" / "shard-00000.h5"
    shard.write_bytes(shard.read_bytes()[:1000])
    result = validate_dataset(root)
    assert not result.ok and any("truncated" in e for e in result.errors)
    with pytest.raises(DatasetError, match="truncated"):
        DatasetFolder(root).read_split("val")

    manifest = json.loads((root / "manifest.json").read_text())
    manifest["shards"][0]["file"] = "train/shard-00099.h5"
    (root / "manifest.json").write_text(json.dumps(manifest))
    assert any("missing" in e for e in validate_dataset(root).errors)

    (root / "manifest.json").write_text("{not json")
    assert not validate_dataset(root).ok
    assert run_cli("inspect", str(root), check=False).returncode != 0


def test_generate_repairs_a_corrupt_shard_from_its_seeds(tmp_path: Path) -> None:
    root = tmp_path / "d"
    generate(tiny(), root, progress=False)
    good = read_all(root)
    shard = root / "test" / "shard-00000.h5"
    data = bytearray(shard.read_bytes())
    data[-100] ^= 0xFF
    shard.write_bytes(bytes(data))
    generate(tiny(), root, progress=False)
    assert validate_dataset(root).ok
    assert_same_arrays(good, read_all(root))


def test_a_foreign_folder_is_never_written_into(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty"):
        generate(tiny(), tmp_path, progress=False)
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def test_the_first_samples_of_a_split_are_read_alone(tiny_data: Path) -> None:
    dataset = DatasetFolder(tiny_data)
    whole = dataset.read_split("train")
    assert len(dataset.split_records("train")) > 1  # the count below ends inside the second shard
    first = dataset.read_split("train", 5)
    for name in ("fields", "params", "seeds"):
        np.testing.assert_array_equal(getattr(first, name), getattr(whole, name)[:5])
    assert first.coords.keys() == whole.coords.keys()
    for axis, values in first.coords.items():
        np.testing.assert_array_equal(values, whole.coords[axis][:5])
    with pytest.raises(DatasetError, match="9 samples asked of split 'train'"):
        dataset.read_split("train", 9)


def test_a_reader_that_stops_early_gets_no_traceback(tiny_data: Path) -> None:
    """`dynaforge verify DIR --json | head -c 100`: the reader is gone before the output; the command ends
    quietly (the read end of the pipe is closed before it starts, so its first write fails for sure)."""
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(
            [sys.executable, "-c", "import sys; from dynaforge.cli import main; sys.exit(main())",
             "verify", str(tiny_data), "--samples", "all", "--json"],
            stdout=write, stderr=subprocess.PIPE, text=True, timeout=300,
        )  # fmt: skip
    finally:
        os.close(write)
    assert "Traceback" not in done.stderr and "error" not in done.stderr, done.stderr
    assert done.returncode == 0


@pytest.mark.reproducibility
def test_worker_processes_make_the_same_dataset_as_one_process(tmp_path: Path) -> None:
    """`generate --processes 2`: two spawned workers share the shards; the arrays are those of one process,
    and so is each sample's checksum in the manifest."""
    config = tiny("dataset.shard_size=4")
    two = generate(config, tmp_path / "two", progress=False, processes=2)
    one = generate(config, tmp_path / "one", progress=False)
    assert two["complete"] and one["complete"]
    assert_same_arrays(read_all(tmp_path / "two"), read_all(tmp_path / "one"))
    assert [s["sample_sha256"] for s in two["shards"]] == [s["sample_sha256"] for s in one["shards"]]
    with pytest.raises(DatasetError, match="cannot be one of 2 workers"):
        generate(config, tmp_path / "three", shard_index=0, num_shards=2, processes=2)
