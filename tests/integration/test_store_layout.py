"""One layout until the disk, and one rule for "is this shard complete?" (issue 34).

A system's rows are channels first, float32, on the device that made them; the store alone writes them
channels last and reads them back, the same bytes. Resuming, rebuilding the manifest, reading and `inspect`
decide whether a shard is complete with `dynaforge.store.format.shard_problem` alone.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

import dynaforge
from dynaforge.config import load_config
from dynaforge.seeds import Rows
from dynaforge.store import DatasetError, DatasetFolder, validate_dataset
from dynaforge.store.format import (
    ShardSpec,
    plan_shards,
    read_record,
    shard_problem,
)
from dynaforge.store.layout import fields_from_disk, fields_to_disk
from dynaforge.store.writer import shard_is_complete, update_manifest
from dynaforge.systems import build_system

from ..conftest import CONFIGS, RANDOM_CNN_TINY

DEVICES = [
    "cpu",
    pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no GPU")),
]
SYSTEMS = {
    "burgers": (CONFIGS / "tiny.yaml", []),
    "darcy": (CONFIGS / "darcy.yaml", ["system.resolution=9", "system.refinement=2", "system.modes=8"]),
    "cavity": (CONFIGS / "cavity.yaml", ["system.resolution=16", "system.steps=4", "system.save_every=2"]),
    "cylinder": (
        CONFIGS / "cylinder.yaml",
        ["system.resolution=16", "system.spin_up=2", "system.steps=4", "system.save_every=2"],
    ),
    "nbody": (CONFIGS / "nbody_tiny.yaml", []),
    "random_cnn": (
        None,
        RANDOM_CNN_TINY,
    ),
}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_a_system_returns_channels_first_float32_on_its_device(name: str, device: str) -> None:
    path, overrides = SYSTEMS[name]
    config = load_config(path, overrides)
    system = build_system(config.system)
    n = system.rows_per_unit * 2
    rows = system.sample_rows(Rows("train", 0, n, config.dataset.seed), torch.device(device))
    assert isinstance(rows.fields, torch.Tensor)
    assert rows.fields.dtype == torch.float32 and rows.fields.device.type == device
    assert tuple(rows.fields.shape) == (n, config.system.n_frames, system.channels, *system.shape)
    stored = fields_to_disk(rows.fields)  # what the writer writes: channels last, on the host
    assert stored.shape == (n, config.system.n_frames, *system.shape, system.channels)
    assert torch.equal(fields_from_disk(stored), rows.fields.cpu())


def test_a_written_sample_reads_back_as_the_generated_tensor_bit_for_bit(tiny_data: Path) -> None:
    generated = dynaforge.simulate(CONFIGS / "tiny.yaml", split="train").fields  # (N, T, C, X)
    folder = DatasetFolder(tiny_data)
    assert torch.equal(folder.split_frames("train"), generated)
    reader = folder.trajectory_reader("train")
    for index in (0, 5, len(reader) - 1):  # across shards
        frames = reader.frames(index)
        assert frames.dtype == torch.float32 and frames.is_contiguous()
        assert torch.equal(frames, generated[index])
    assert torch.equal(folder.split_frames("train", 3), generated[:3])


@pytest.fixture
def copied(tiny_data: Path, tmp_path: Path) -> Path:
    root = tmp_path / "data"
    shutil.copytree(tiny_data, root)
    return root


def shard_of(root: Path, index: int = 1) -> tuple[dict, Path]:
    """The manifest entry of train shard `index` and its file."""
    manifest = json.loads((root / "manifest.json").read_text())
    record = next(r for r in manifest["shards"] if r["file"] == f"train/shard-{index:05d}.h5")
    return record, root / record["file"]


def test_one_rule_passes_a_complete_shard(copied: Path) -> None:
    record, _ = shard_of(copied)
    assert shard_problem(copied, record) is None
    assert shard_problem(copied, record, thorough=True) is None
    spec = next(s for s in plan(copied) if s.file == record["file"])
    assert shard_is_complete(copied, spec)
    assert validate_dataset(copied).ok


def test_one_rule_refuses_a_truncated_shard_everywhere(copied: Path) -> None:
    record, path = shard_of(copied)
    path.write_bytes(path.read_bytes()[:-100])
    for thorough in (False, True):
        assert "truncated" in (shard_problem(copied, record, thorough=thorough) or "")
    spec = next(s for s in plan(copied) if s.file == record["file"])
    assert not shard_is_complete(copied, spec)  # a rerun regenerates it
    with pytest.raises(DatasetError, match="truncated"):
        DatasetFolder(copied)
    assert any("truncated" in error for error in validate_dataset(copied).errors)
    config = load_config(copied / "config.yaml")
    manifest = update_manifest(copied, config, build_system(config.system))
    assert not manifest["complete"]
    assert [r["file"] for r in manifest["shards"] if not r["complete"]] == [record["file"]]


def test_one_rule_refuses_a_shard_with_a_flipped_byte_when_thorough(copied: Path) -> None:
    record, path = shard_of(copied)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size: only the checksum tells
    path.write_bytes(bytes(data))
    assert shard_problem(copied, record) is None  # the cheap check is a stat
    assert "SHA-256 differs" in (shard_problem(copied, record, thorough=True) or "")
    spec = next(s for s in plan(copied) if s.file == record["file"])
    assert not shard_is_complete(copied, spec)  # resuming checks thoroughly
    with pytest.raises(DatasetError, match="SHA-256"):
        DatasetFolder(copied).split_records("train")  # the first read of a shard checks thoroughly
    assert any("SHA-256 differs" in error for error in validate_dataset(copied).errors)
    assert not any("SHA-256" in error for error in validate_dataset(copied, checksums=False).errors)


def test_a_record_of_a_shard_holding_nan_is_never_complete(copied: Path) -> None:
    record, _ = shard_of(copied)
    stored = read_record(copied / record["file"].replace(".h5", ".json"))
    assert stored is not None
    stored["moments"]["max"] = [float("nan")]
    assert "NaN or Inf" in (shard_problem(copied, stored) or "")


def plan(root: Path) -> list[ShardSpec]:
    config = load_config(root / "config.yaml")
    return plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
