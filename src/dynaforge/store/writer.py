"""Write a dataset folder: sharded, atomic, resumable, shared by several writers (docs/format.md).

Each shard is written to a temporary file and renamed when complete; then its completion record (with
the file's SHA-256, per-sample hashes and statistics) is written, atomically too. A rerun skips every shard
whose record and file agree, removes temporaries, and redoes the rest. The manifest is rebuilt from the
records under a file lock. The writer knows a system only through the `System` contract
(`dynaforge.systems.base`): it asks it for rows and names; `dynaforge.generate` runs it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np
import torch

import dynaforge
from dynaforge.atomic import atomic_path, atomic_write_json, check_output_folder
from dynaforge.config import (
    Config,
    config_differences,
    config_to_dict,
    config_to_yaml,
    field_check,
    load_config,
    save_config,
)
from dynaforge.errors import OUT
from dynaforge.floating import flush_denormals
from dynaforge.machine import machine_record
from dynaforge.seeds import SPLITS, Rows, sample_seed
from dynaforge.store.format import (
    CONFIG,
    FORMAT_VERSION,
    MANIFEST,
    DatasetError,
    ShardSpec,
    SplitArrays,
    plan_shards,
    read_record,
    sample_sha256,
    shard_problem,
    shard_record,
)
from dynaforge.store.labels import label_shard
from dynaforge.store.layout import fields_to_disk
from dynaforge.store.stats import ChannelMoments, SampleMoments, records_to_statistics
from dynaforge.systems import build_system
from dynaforge.systems.base import SampleRows, System

log = logging.getLogger(__name__)

IGNORED_DATASET_KEYS = ("batch_size", "device")
"""Keys that change how a dataset is produced, not what it holds; a rerun may change them."""


def identity_of(config: Config) -> dict[str, Any]:
    """The part of a config that determines a dataset's arrays: the dataset section less the keys that only
    change how it is produced, and the system's own account of its config on the generation device
    (`System.config_identity`: a random CNN's `precision: auto` is written as the precision it resolves
    to there, so a dataset begun with float32 convolutions is not resumed with bfloat16 ones on a machine
    of another kind, and `verify` regenerates with the precision recorded)."""
    data = {"dataset": config_to_dict(config.dataset)}
    for key in IGNORED_DATASET_KEYS:
        data["dataset"].pop(key, None)
    return {"system": build_system(config.system).config_identity(config.dataset.device), **data}


def prepare_folder(root: Path, config: Config) -> None:
    """Create the folder or check that it holds a dataset of the same config (nothing is overwritten)."""
    check_output_folder(root, (CONFIG, MANIFEST, *SPLITS), "a dataset folder", DatasetError)
    root.mkdir(parents=True, exist_ok=True)
    saved_config = root / CONFIG
    manifest_path = root / MANIFEST
    if manifest_path.exists():
        try:
            manifest = json.loads(manifest_path.read_text())
        except json.JSONDecodeError as error:
            raise DatasetError(
                f"{manifest_path} is not valid JSON ({error}); it was not written by dynaforge or was damaged. "
                "Move the folder aside or delete manifest.json to rebuild it from the shard records."
            ) from None
        differences = config_differences(manifest.get("identity", {}), identity_of(config))
        if differences:
            raise DatasetError(
                f"{root} already holds a dataset generated with a different config; refusing to mix them.\n"
                "  Differences (existing != requested):\n    " + "\n    ".join(differences[:20]) + "\n"
                f"  Use another {OUT} folder, or pass the same config to resume."
            )
    elif saved_config.exists():  # an interrupted first generation: its config, perhaps shards
        differences = config_differences(identity_of(load_config(saved_config)), identity_of(config))
        if differences:
            raise DatasetError(
                f"{root} holds the start of a dataset of a different config ({'; '.join(differences[:5])}). "
                f"Use another {OUT} folder."
            )
    elif any(p for p in root.iterdir() if not p.name.startswith(".")) and not saved_config.exists():
        raise DatasetError(
            f"{root} is not empty and holds no dynaforge dataset; choose an empty or new {OUT} folder"
        )
    if not saved_config.exists():
        save_config(config, saved_config)


def shard_is_complete(root: Path, shard: ShardSpec) -> bool:
    """Whether a rerun may keep the shard: its record exists and `shard_problem` finds nothing, checksum
    included (a shard modified or damaged since it was written is regenerated)."""
    record = read_record(root / shard.record)
    if record is None:
        if (root / shard.record).exists():
            log.warning("record %s is damaged; regenerating the shard", root / shard.record)
        return False
    problem = shard_problem(root, record | {"file": shard.file}, thorough=True)
    if problem is not None:
        log.warning("%s; regenerating the shard", problem)
    return problem is None


def write_shard(
    root: Path,
    shard: ShardSpec,
    config: Config,
    system: System,
    device: torch.device,
    on_steps: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """Write one shard (the system's rows, `dataset.batch_size` at a time) into a temporary file, rename it
    into place, then write its record."""
    seeds = np.asarray(
        [sample_seed(config.dataset.seed, shard.split, i) for i in range(shard.start, shard.stop)],
        dtype=np.uint64,
    )
    n_frames = config.system.n_frames
    space = system.shape
    channels = system.channels
    moments = SampleMoments.empty()
    hashes: list[str] = []
    final = root / shard.file
    with atomic_path(final) as tmp:
        with h5py.File(tmp, "w") as h5:
            write_shard_metadata(h5, shard, config, system, seeds)
            fields = h5.create_dataset(
                "fields",
                shape=(shard.size, n_frames, *space, channels),
                dtype=np.float32,
                chunks=(1, n_frames, *space, channels),
            )
            params = h5.create_dataset(
                "params", shape=(shard.size, len(system.parameter_names)), dtype=np.float64
            )
            split_size = config.dataset.split_sizes()[shard.split]
            h5.attrs.update(system.shard_attributes(shard.split, split_size, config.dataset.seed))
            for lo, hi in batches(shard.size, config.dataset.batch_size):
                with flush_denormals():  # subnormals cost ~100x (decaying fields); restored after each batch
                    wanted = Rows(shard.split, shard.start + lo, shard.start + hi, config.dataset.seed)
                    rows = system.sample_rows(wanted, device, on_steps)
                check_finite(rows, wanted, system.parameter_names, config)
                stored = fields_to_disk(rows.fields)  # (rows, T, *space, C) float32, the disk layout
                fields[lo:hi] = stored
                params[lo:hi] = rows.params
                write_extras(h5, rows.extras, lo, hi, shard.size)
                moments = moments.extended(SampleMoments.of(stored))
                hashes += [sample_sha256(f, p) for f, p in zip(stored, rows.params, strict=True)]
            write_coordinates(h5, system, params[...])
            h5.create_dataset("time", data=rows.time)
            label_shard(h5, system.name, tuple(system.axis_names), tuple(system.channel_names))
        written = shard_record(shard, tmp, moments.merged().to_dict())
    record = {
        **written,
        "sample_moments": moments.to_dict(),
        "sample_sha256": hashes,
        "device": str(device),
        "machine": machine_record(device),
    }
    atomic_write_json(root / shard.record, record)
    return record


def check_finite(rows: SampleRows, wanted: Rows, names: tuple[str, ...], config: Config) -> None:
    """Stop generation at the first sample of a batch holding NaN or Inf, before anything of its shard is
    kept: a `DatasetError` naming the sample, its parameters and the likely cause."""
    finite = torch.isfinite(rows.fields.flatten(1)).all(dim=1).cpu().numpy()
    finite &= np.isfinite(rows.params).all(axis=1)
    if finite.all():
        return
    row = int(np.flatnonzero(~finite)[0])
    params = dict(zip(names, rows.params[row].tolist(), strict=True))
    shown = ", ".join(f"{name}={value:.6g}" for name, value in params.items())
    raise DatasetError(
        f"sample {row + wanted.start} of the {wanted.split} split holds NaN or Inf (parameters: {shown or 'none'}): "
        f"{non_finite_cause(config, params)}; nothing of its shard was kept"
    )


def non_finite_cause(config: Config, params: dict[str, float]) -> str:
    """The likely reason a sample with these parameters diverged, and the fix: a parameter outside the
    physical range its config field declares, else what the system says (`System.divergence_cause`)."""
    for name, value in params.items():
        check = field_check(type(config.system), name)
        if check is not None and not check.allows(value):
            return (
                f"system.{name}={value:.6g} is outside its physical range ({name} must be {check.describe()})"
            )
    return build_system(config.system).divergence_cause()


def write_extras(h5: h5py.File, extras: dict[str, np.ndarray], lo: int, hi: int, size: int) -> None:
    """Per-sample datasets a system adds (random_cnn: operator, realization, sobol, features, ...)."""
    for name, values in extras.items():
        if name not in h5:
            h5.create_dataset(name, shape=(size, *values.shape[1:]), dtype=values.dtype)
        h5[name][lo:hi] = values


def write_shard_metadata(
    h5: h5py.File, shard: ShardSpec, config: Config, system: System, seeds: np.ndarray
) -> None:
    header = ShardHeader(
        system=system.name,
        provenance={"config": config_to_yaml(config)},
        dt=config.system.dt * config.system.save_every,
        channel_names=tuple(system.channel_names),
        axis_names=tuple(system.axis_names),
        param_names=tuple(system.parameter_names),
    )
    write_shard_header(h5, shard, header, seeds)


class ShardHeader(NamedTuple):
    """What every shard says about itself besides its arrays (docs/format.md), generated or converted."""

    system: str
    provenance: dict[str, str]
    """Where the data came from: `config` (the generating config's YAML) or `source` (a conversion's, JSON)."""
    dt: float | None
    """Time between stored frames; None when there is one frame."""
    channel_names: tuple[str, ...]
    axis_names: tuple[str, ...]
    param_names: tuple[str, ...]


def write_shard_header(h5: h5py.File, shard: ShardSpec, header: ShardHeader, seeds: np.ndarray) -> None:
    """The attributes and the `seeds`, `index` and `param_names` datasets of one shard (one writer for
    generation and conversion)."""
    h5.attrs["format_version"] = FORMAT_VERSION
    h5.attrs["dynaforge_version"] = dynaforge.__version__
    h5.attrs["system"] = header.system
    h5.attrs["split"] = shard.split
    h5.attrs["start"] = shard.start
    h5.attrs["stop"] = shard.stop
    h5.attrs.update(header.provenance)
    if header.dt is not None:
        h5.attrs["dt"] = header.dt
    h5.attrs["channel_names"] = list(header.channel_names)
    h5.attrs["axis_names"] = list(header.axis_names)
    h5.create_dataset("seeds", data=seeds)
    h5.create_dataset("index", data=np.arange(shard.start, shard.stop, dtype=np.int64))
    h5.create_dataset("param_names", data=np.asarray(header.param_names, dtype=h5py.string_dtype()))


def write_arrays_shard(
    root: Path, shard: ShardSpec, header: ShardHeader, arrays: SplitArrays, extras: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Write one shard from arrays already in memory (a conversion's), atomically, then its record;
    `extras` are further per-sample datasets (a conversion's `source_index`)."""
    final = root / shard.file
    with atomic_path(final) as tmp:
        with h5py.File(tmp, "w") as h5:
            write_shard_header(h5, shard, header, arrays.seeds)
            fields = arrays.fields
            h5.create_dataset("fields", data=fields, chunks=(1, *fields.shape[1:]))
            h5.create_dataset("params", data=arrays.params)
            write_extras(h5, extras, 0, shard.size, shard.size)
            h5.create_dataset("time", data=arrays.time)
            for axis, coords in arrays.coords.items():
                h5.create_dataset(axis, data=coords)
            label_shard(h5, header.system, header.axis_names, header.channel_names)
        record = shard_record(shard, tmp, ChannelMoments.of(fields).to_dict())
    atomic_write_json(root / shard.record, record)
    return record


def write_coordinates(h5: h5py.File, system: System, params: np.ndarray) -> None:
    """Coordinates per sample and axis, (N, n) under the axis's name (`System.coordinates`)."""
    for name, values in system.coordinates(params).items():
        h5.create_dataset(name, data=values)


def update_manifest(root: Path, config: Config, system: System) -> dict[str, Any]:
    """Rebuild manifest.json from the completion records (under a file lock, written atomically)."""
    with _locked(root / ".manifest.lock"):
        shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
        records = {}
        for shard in shards:
            record = read_record(root / shard.record)
            if record is not None and shard_problem(root, record | {"file": shard.file}) is None:
                records[shard.file] = record
        complete = len(records) == len(shards)
        machines = []
        for record in records.values():
            machine = record.get("machine")
            if machine is not None and machine not in machines:
                machines.append(machine)
        manifest = {
            "format_version": FORMAT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "system": config.system.name,
            "identity": identity_of(config),
            "splits": {
                split: {"n_samples": n, "n_shards": sum(1 for s in shards if s.split == split)}
                for split, n in config.dataset.split_sizes().items()
            },
            "shape": {
                "frames": config.system.n_frames,
                "space": list(system.shape),
                "channels": system.channels,
            },
            "complete": complete,
            "shards": [
                records.get(s.file, {"file": s.file, "split": s.split, "complete": False})
                | {"complete": s.file in records}
                for s in shards
            ],
            "stats": records_to_statistics([records[s.file] for s in shards if s.file in records])
            if complete
            else None,
            "machines": machines,
        }
        atomic_write_json(root / MANIFEST, manifest)
    return manifest


def batches(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(lo + size, n)


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
