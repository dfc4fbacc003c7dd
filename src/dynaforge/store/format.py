"""Names and layout of the dataset format (specified in docs/format.md; the seed rule is `dynaforge.seeds`).

A dataset folder:

    manifest.json             what was asked, which shards are complete (with checksums), statistics
    config.yaml               the resolved config that generated it
    train/shard-00000.h5      HDF5 shards, one per `dataset.shard_size` samples of a split
    train/shard-00000.json    the completion record of that shard, written atomically after it
    val/...  test/...

On disk `fields` are channels last, (N, T, *space, C) (`dynaforge.store.layout` converts). Whether a shard
is complete is decided by one rule, `shard_problem`. This module imports no PyTorch: the torch-free ONNX
rollout reads shards with it.
"""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from dynaforge.errors import DatasetError as DatasetError  # the store's error, importable here
from dynaforge.seeds import SPLITS

FORMAT_VERSION = 2
"""Version 2 adds the labels of `dynaforge.store.labels` (dimension scales, units, long names) to version 1."""
READABLE_VERSIONS = (1, 2)
"""Format versions readers accept: a version-1 folder holds the same arrays, without the labels."""
MANIFEST = "manifest.json"
CONFIG = "config.yaml"
AXIS_NAMES = ("x", "y", "z")
OBSTACLE_CHANNEL = "obstacle"
"""The channel name of a per-sample obstacle mask (1 inside the obstacle, 0 in the fluid; the cylinder's):
surrogates hold it from their input instead of predicting it, and metrics average over the fluid cells."""


BOUNDARY_TYPES = "boundary_types"
"""Shard attribute of a walled system: one boundary type per spatial axis, in The Well's words (`WALL`: a
Dirichlet or Neumann side, a no-slip wall; `OPEN`: inflow or outflow; `PERIODIC`). A shard without it is
periodic on every axis; each sample's boundary values are its parameters (`left_value`, `lid_speed`, ...)."""


BOUNDARY_SIDES = ("left", "right", "bottom", "top")
BOUNDARY_VALUES = ("value", "amplitude", "frequency")
FLOW_BOUNDARY_PARAMETERS = ("lid_speed", "inflow_peak")


def is_boundary_parameter(name: str) -> bool:
    """Whether parameter `name` is a boundary value: `<side>_value`, `<side>_amplitude`,
    `<side>_frequency` of a walled system's side, the cavity's `lid_speed` or the cylinder's `inflow_peak`."""
    side, _, what = name.partition("_")
    return (side in BOUNDARY_SIDES and what in BOUNDARY_VALUES) or name in FLOW_BOUNDARY_PARAMETERS


def parameter_columns(names: Sequence[str], chosen: Sequence[str]) -> list[int]:
    """The columns of the parameters `chosen` among a split's parameter `names` (the boundary channels)."""
    missing = [name for name in chosen if name not in names]
    if missing:
        raise DatasetError(
            f"the model is given the boundary parameters {list(chosen)} as channels, the data has no "
            f"{missing} (its parameters: {list(names)}); use data of the system it was trained on"
        )
    return [list(names).index(name) for name in chosen]


def parameter_values(
    params: np.ndarray, names: Sequence[str], chosen: Sequence[str], zero_missing: Sequence[str] = ()
) -> np.ndarray:
    """The columns of `params` (N, P) (named `names`) of the parameters `chosen`, (N, len(chosen)) float64;
    a parameter among `zero_missing` that the data does not have is 0 for every sample (a coefficient
    channel, `data.parameter_channels`: a system without that coefficient), any other is an error."""
    parameter_columns(names, [name for name in chosen if name not in zero_missing])
    values = np.zeros((params.shape[0], len(chosen)), dtype=np.float64)
    for column, name in enumerate(chosen):
        if name in names:
            values[:, column] = params[:, list(names).index(name)]
    return values


def append_parameter_channels(
    fields: np.ndarray,
    params: np.ndarray,
    names: Sequence[str],
    chosen: Sequence[str],
    axis: int,
    zero_missing: Sequence[str] = (),
) -> np.ndarray:
    """`fields` (samples first) with the parameters `chosen` (columns of `params` (N, P), named `names`)
    appended along the channel `axis` as constant channels: each sample's value everywhere, in the fields'
    dtype (the boundary channels, `data.boundary_channels`, and the coefficient channels,
    `data.parameter_channels`, which are 0 where the data lacks them: `zero_missing`)."""
    values = parameter_values(params, names, chosen, zero_missing).astype(fields.dtype)
    axis %= fields.ndim
    view = [1] * fields.ndim
    view[0], view[axis] = values.shape
    full = list(fields.shape)
    full[axis] = values.shape[1]
    return np.concatenate([fields, np.broadcast_to(values.reshape(view), full)], axis=axis)


def held_channels(names: tuple[str, ...] | list[str]) -> tuple[int, ...]:
    """The positions of the channels a surrogate is given but does not predict (`OBSTACLE_CHANNEL`)."""
    return tuple(i for i, name in enumerate(names) if name == OBSTACLE_CHANNEL)


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
        return f"{path} is missing although its record lists it (deleted or moved)"
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
