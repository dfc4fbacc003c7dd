"""Names and layout of the dataset format (specified in docs/format.md; the seed rule is `dynaforge.seeds`).

A dataset folder:

    manifest.json             what was asked, which shards are complete (with checksums), statistics
    config.yaml               the resolved config that generated it
    train/shard-00000.h5      HDF5 shards, one per `dataset.shard_size` samples of a split
    train/shard-00000.json    the completion record of that shard, written atomically after it
    val/...  test/...

On disk `fields` are channels last, (N, T, *space, C); everywhere else in dynaforge a trajectory is channels
first, (N, T, C, *space), on the device that made it. `fields_to_disk` and `fields_from_disk` are the only
conversions between the two. Whether a shard is complete is decided by one rule, `shard_problem`.
"""

from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.errors import DatasetError as DatasetError  # the store's error, importable here
from dynaforge.seeds import SPLITS

FORMAT_VERSION = 2
"""Version 2 adds the labels of `dynaforge.store.labels` (dimension scales, units, long names) to version 1."""
READABLE_VERSIONS = (1, 2)
"""Format versions readers accept: a version-1 folder holds the same arrays, without the labels."""
MANIFEST = "manifest.json"
CONFIG = "config.yaml"
AXIS_NAMES = ("x", "y", "z")


class ShardSpec(NamedTuple):
    """One shard of one split: global sample indices [start, stop) of that split."""

    split: str
    index: int
    start: int
    stop: int

    @property
    def name(self) -> str:
        return f"{self.split}/shard-{self.index:05d}"

    @property
    def file(self) -> str:
        return f"{self.name}.h5"

    @property
    def record(self) -> str:
        return f"{self.name}.json"

    @property
    def size(self) -> int:
        return self.stop - self.start


def plan_shards(split_sizes: dict[str, int], shard_size: int) -> list[ShardSpec]:
    """Every shard of the dataset, in a fixed order (train, val, test; by index within a split)."""
    shards = []
    for split in SPLITS:
        n = split_sizes.get(split, 0)
        for i in range(math.ceil(n / shard_size)):
            shards.append(ShardSpec(split, i, i * shard_size, min((i + 1) * shard_size, n)))
    return shards


def channels_first_to_last(fields: Tensor, lead: int = 2) -> Tensor:
    """(*lead, C, *space) -> (*lead, *space, C), the stored layout; `lead` leading axes (2: samples and
    time; 1: time alone). A view, no copy."""
    return torch.movedim(fields, lead, -1)


def channels_last_to_first(fields: Tensor, lead: int = 2) -> Tensor:
    """(*lead, *space, C) -> (*lead, C, *space), the layout of everything outside the store. A view."""
    return torch.movedim(fields, -1, lead)


def fields_to_disk(fields: Float[Tensor, "samples time channels *space"]) -> np.ndarray:
    """A system's trajectories (N, T, C, *space), on any device, as the store writes them: a C-ordered
    float32 numpy array (N, T, *space, C) on the host. The values are the same bytes."""
    host = fields.detach().to(device="cpu", dtype=torch.float32)  # one transfer, of contiguous memory
    return np.ascontiguousarray(channels_first_to_last(host).numpy())


def fields_from_disk(fields: np.ndarray, lead: int = 2) -> Tensor:
    """Stored fields (*lead, *space, C) as the float32 tensor (*lead, C, *space) on the host, the same bytes
    (`lead` as in `channels_first_to_last`: 2 for (N, T, ...), 1 for one trajectory (T, ...))."""
    values = torch.from_numpy(np.asarray(fields, dtype=np.float32))
    return channels_last_to_first(values, lead).contiguous()


def sample_sha256(fields: np.ndarray, params: np.ndarray) -> str:
    """The content hash of one stored sample: SHA-256 of its `fields` as stored (float32, little-endian,
    C order, (T, *space, C)) followed by its `params` (float64, little-endian)."""
    digest = hashlib.sha256()
    digest.update(np.ascontiguousarray(fields, dtype="<f4").tobytes())
    digest.update(np.ascontiguousarray(params, dtype="<f8").tobytes())
    return digest.hexdigest()


def file_sha256(path: str | Path, chunk_bytes: int = 1 << 22) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(chunk_bytes):
            digest.update(chunk)
    return digest.hexdigest()


class SplitArrays(NamedTuple):
    """All samples of one split, in global index order."""

    fields: np.ndarray  # (N, T, *space, C) float32, channels last
    params: np.ndarray  # (N, P) float64
    param_names: tuple[str, ...]
    seeds: np.ndarray  # (N,) uint64
    time: np.ndarray  # (T,) float64
    coords: dict[str, np.ndarray]  # axis name -> (N, n)


def shard_record(shard: ShardSpec, written: Path, moments: dict[str, Any]) -> dict[str, Any]:
    """What every shard's JSON record holds (docs/format.md): where the shard sits in its split, the size and
    SHA-256 of the file `written`, and its channel moments; writers add their own keys."""
    return {
        "file": shard.file,
        "split": shard.split,
        "index": shard.index,
        "start": shard.start,
        "stop": shard.stop,
        "bytes": written.stat().st_size,
        "sha256": file_sha256(written),
        "moments": moments,
    }


def read_record(path: Path) -> dict[str, Any] | None:
    """A shard's completion record (`shard.record`), or None where there is none or it is not valid JSON."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        return None


def record_is_finite(record: dict[str, Any]) -> bool:
    """Whether a shard record's moments are all finite (a shard holding NaN or Inf is never complete)."""
    moments = record.get("moments", {})
    return all(math.isfinite(v) for key in ("mean", "m2", "min", "max") for v in moments.get(key, []))


def shard_problem(root: Path, record: dict[str, Any], thorough: bool = False) -> str | None:
    """Why the shard `record` describes is not complete, or None when it is: the one rule of the store.

    `record` is a shard's completion record (`shard.record`) or its manifest entry (which adds `complete`).
    A shard is complete when its record does not say otherwise (`complete` false: generation unfinished),
    its file exists with the size the record gives, the record's moments are finite, and, when `thorough`,
    the file's SHA-256 is the record's. Without `thorough` the check is a `stat` (what opening a folder or
    rebuilding a manifest affords for every shard); with it, one pass over the file's bytes (what resuming
    a generation, the first read of a shard and `inspect` do).
    """
    path = root / record["file"]
    if not record.get("complete", True):
        return f"{path} is not complete in {root / MANIFEST} (generation unfinished)"
    if not path.is_file():
        return f"{path} is listed in {root / MANIFEST} but missing"
    size = path.stat().st_size
    if size != record.get("bytes"):
        return f"{path} has {size} bytes but its record says {record.get('bytes')} (truncated or modified)"
    if not record_is_finite(record):
        return f"{path} holds NaN or Inf (its record's moments)"
    if thorough and file_sha256(path) != record.get("sha256"):
        return (
            f"{path}: SHA-256 differs from the one its record holds (the file was modified or damaged after "
            "it was written)"
        )
    return None
