"""Generate a dataset folder: sharded, atomic, resumable, splittable across processes and machines.

Each shard is written to a temporary file and renamed when complete; then its completion record (with
the file's SHA-256 and the shard's statistics) is written, atomically too. A rerun skips every shard whose
record and file agree, removes temporaries, and redoes the rest. The manifest is rebuilt from the records.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np
import torch
from tqdm import tqdm

import dynaforge
from dynaforge.atomic import atomic_path, atomic_write_json, remove_stale_temporaries
from dynaforge.config import (
    Config,
    config_differences,
    config_to_dict,
    config_to_yaml,
    resolve_device,
    save_config,
)
from dynaforge.floating import flush_denormals
from dynaforge.machine import machine_record
from dynaforge.seeds import sample_rng, sample_seed
from dynaforge.store.format import (
    AXIS_NAMES,
    CONFIG,
    FORMAT_VERSION,
    MANIFEST,
    ShardSpec,
    file_sha256,
    plan_shards,
    sample_sha256,
)
from dynaforge.store.stats import ChannelMoments, SampleMoments
from dynaforge.systems import System, build_system

log = logging.getLogger(__name__)

DATA_SECTIONS = ("system", "dataset")
"""The config sections that determine a dataset's content."""
IGNORED_DATASET_KEYS = ("batch_size", "device")
"""Keys that change how a dataset is produced, not what it holds; a rerun may change them."""


class DatasetError(RuntimeError):
    """A dataset folder that cannot be used or extended as asked; the message says why and what to do."""


def identity_of(config: Config) -> dict[str, Any]:
    """The part of a config that determines a dataset's arrays."""
    data = {name: config_to_dict(getattr(config, name)) for name in DATA_SECTIONS}
    for key in IGNORED_DATASET_KEYS:
        data["dataset"].pop(key, None)
    return data


def worker_slot(shard_index: int | None, num_shards: int | None) -> tuple[int, int]:
    """This process's (index, count) among generators: explicit flags, else torchrun, else SLURM arrays."""
    if shard_index is not None or num_shards is not None:
        index, count = shard_index or 0, num_shards or 1
    elif "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        index, count = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    elif "SLURM_ARRAY_TASK_ID" in os.environ and "SLURM_ARRAY_TASK_COUNT" in os.environ:
        first = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        index, count = (
            int(os.environ["SLURM_ARRAY_TASK_ID"]) - first,
            int(os.environ["SLURM_ARRAY_TASK_COUNT"]),
        )
    else:
        index, count = 0, 1
    if count < 1 or not 0 <= index < count:
        raise DatasetError(
            f"shard index {index} is not in [0, {count}); pass --shard-index I --num-shards K with 0 <= I < K"
        )
    return index, count


def generate(
    config: Config,
    out: str | Path,
    shard_index: int | None = None,
    num_shards: int | None = None,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Generate (or finish generating) the dataset of `config` in `out`; returns the manifest.

    `progress=None` shows a progress bar only on a terminal.
    """
    root = Path(out)
    index, count = worker_slot(shard_index, num_shards)
    prepare_folder(root, config)
    shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
    mine = [shard for g, shard in enumerate(shards) if g % count == index]
    removed = [
        path for shard in mine for path in remove_stale_temporaries(root / shard.split, Path(shard.file).name)
    ]
    if removed:
        log.info("removed %d partial file(s) left by an interrupted run", len(removed))
    todo = [shard for shard in mine if not shard_is_complete(root, shard)]
    if len(todo) < len(mine):
        log.info(
            "resuming: %d of this worker's %d shards are already complete", len(mine) - len(todo), len(mine)
        )
    if todo:
        system = build_system(config.system)
        device = torch.device(resolve_device(config.dataset.device))
        total = sum(shard.size for shard in todo) * config.system.steps
        with tqdm(
            total=total, unit="sample-step", unit_scale=True, disable=_disabled(progress), desc="generate"
        ) as bar:
            for shard in todo:
                write_shard(root, shard, config, system, device, on_steps=bar.update)
    return update_manifest(root, config)


def prepare_folder(root: Path, config: Config) -> None:
    """Create the folder or check that it holds a dataset of the same config (nothing is overwritten)."""
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
                "  Use another --out folder, or pass the same config to resume."
            )
    elif any(root.glob("*/shard-*.h5")) and saved_config.exists():
        from dynaforge.config import load_config

        differences = config_differences(identity_of(load_config(saved_config)), identity_of(config))
        if differences:
            raise DatasetError(
                f"{root} holds shards generated with a different config ({'; '.join(differences[:5])}). "
                "Use another --out folder."
            )
    elif any(p for p in root.iterdir() if not p.name.startswith(".")) and not saved_config.exists():
        raise DatasetError(
            f"{root} is not empty and holds no dynaforge dataset; choose an empty or new --out folder"
        )
    if not saved_config.exists():
        save_config(config, saved_config)


def shard_is_complete(root: Path, shard: ShardSpec) -> bool:
    """True when the shard's record exists and its file matches the recorded size and checksum."""
    record_path, file_path = root / shard.record, root / shard.file
    if not record_path.exists() or not file_path.exists():
        return False
    try:
        record = json.loads(record_path.read_text())
    except json.JSONDecodeError:
        log.warning("record %s is damaged; regenerating the shard", record_path)
        return False
    if record.get("bytes") != file_path.stat().st_size or record.get("sha256") != file_sha256(file_path):
        log.warning("shard %s does not match its record (corrupt or modified); regenerating it", file_path)
        return False
    return True


def write_shard(
    root: Path,
    shard: ShardSpec,
    config: Config,
    system: System,
    device: torch.device,
    on_steps: Callable[[int], Any] | None = None,
) -> dict[str, Any]:
    """Generate one shard into a temporary file, rename it into place, then write its record."""
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
            if hasattr(system, "shard_attributes"):  # systems with their own metadata (random_cnn)
                split_size = config.dataset.split_sizes()[shard.split]
                h5.attrs.update(system.shard_attributes(shard.split, split_size, config.dataset.seed))
            for lo, hi in batches(shard.size, config.dataset.batch_size):
                with flush_denormals():  # subnormals cost ~100x (decaying fields); restored after each batch
                    rows = generate_rows(
                        system, config, shard.split, shard.start + lo, shard.start + hi, device, on_steps
                    )
                fields[lo:hi] = rows.fields
                params[lo:hi] = rows.params
                write_extras(h5, rows.extras, lo, hi, shard.size)
                moments = moments.extended(SampleMoments.of(rows.fields))
                hashes += [sample_sha256(f, p) for f, p in zip(rows.fields, rows.params, strict=True)]
            write_coordinates(h5, system, params[...])
            h5.create_dataset("time", data=rows.time)
        sha256 = file_sha256(tmp)
        size = tmp.stat().st_size
    merged = moments.merged()
    if not np.isfinite(merged.mean).all():
        log.warning(
            "shard %s holds non-finite values: the solver diverged (reduce dt or raise resolution)",
            shard.file,
        )
    record = {
        "file": shard.file,
        "split": shard.split,
        "index": shard.index,
        "start": shard.start,
        "stop": shard.stop,
        "bytes": size,
        "sha256": sha256,
        "moments": merged.to_dict(),
        "sample_moments": moments.to_dict(),
        "sample_sha256": hashes,
        "device": str(device),
        "machine": machine_record(device),
    }
    atomic_write_json(root / shard.record, record)
    return record


class GeneratedRows(NamedTuple):
    """Samples [start, stop) of a split as the store keeps them."""

    fields: np.ndarray
    """(rows, T, *space, C) float32, channels last."""
    params: np.ndarray
    """(rows, P) float64, columns `system.parameter_names`."""
    time: np.ndarray
    """(T,) float64."""
    extras: dict[str, np.ndarray]
    """Per-sample datasets a system adds (random_cnn: operator, realization, sobol, features, ...)."""


def generate_rows(
    system: System,
    config: Config,
    split: str,
    start: int,
    stop: int,
    device: torch.device,
    on_steps: Callable[[int], Any] | None = None,
) -> GeneratedRows:
    """Samples [start, stop) of `split`, from the config and the per-sample seeds alone (also `verify`)."""
    if hasattr(system, "generate_rows"):  # systems that draw their own samples (random_cnn)
        rows = system.generate_rows(split, start, stop, config.dataset.seed, device, on_steps)
        return GeneratedRows(rows.fields, rows.params, rows.time, rows.extras)
    seeds = [sample_seed(config.dataset.seed, split, i) for i in range(start, stop)]
    batch_params, initial = system.draw_samples([sample_rng(seed) for seed in seeds])
    rollout = system.rollout(initial.to(device), batch_params.to(device), on_step=on_steps)
    fields = channels_first_to_last(rollout.fields).cpu().numpy().astype(np.float32)
    return GeneratedRows(fields, batch_params.numpy(), rollout.time.numpy(), {})


def write_extras(h5: h5py.File, extras: dict[str, np.ndarray], lo: int, hi: int, size: int) -> None:
    """Per-sample datasets a system adds (random_cnn: operator, realization, sobol, features, ...)."""
    for name, values in extras.items():
        if name not in h5:
            h5.create_dataset(name, shape=(size, *values.shape[1:]), dtype=values.dtype)
        h5[name][lo:hi] = values


def write_shard_metadata(
    h5: h5py.File, shard: ShardSpec, config: Config, system: System, seeds: np.ndarray
) -> None:
    h5.attrs["format_version"] = FORMAT_VERSION
    h5.attrs["dynaforge_version"] = dynaforge.__version__
    h5.attrs["system"] = system.name
    h5.attrs["split"] = shard.split
    h5.attrs["start"] = shard.start
    h5.attrs["stop"] = shard.stop
    h5.attrs["config"] = config_to_yaml(config)
    h5.attrs["dt"] = config.system.dt * config.system.save_every
    h5.attrs["channel_names"] = list(channel_names(system))
    h5.attrs["axis_names"] = list(axis_names(system))
    h5.create_dataset("seeds", data=seeds)
    h5.create_dataset("index", data=np.arange(shard.start, shard.stop, dtype=np.int64))
    h5.create_dataset("param_names", data=np.asarray(system.parameter_names, dtype=h5py.string_dtype()))


def write_coordinates(h5: h5py.File, system: System, params: np.ndarray) -> None:
    """Coordinates per sample and axis, (N, n) under the axis's name: the system's own `coordinates(params)`
    when it has one (the N-body system's body index), else the grid x_j = j L / n (L per sample)."""
    for name, values in coordinates_of(system, params).items():
        h5.create_dataset(name, data=values)


def coordinates_of(system: System, params: np.ndarray) -> dict[str, np.ndarray]:
    own = getattr(system, "coordinates", None)
    if own is not None:
        return own(params)
    lengths = params[:, list(system.parameter_names).index("domain_length")]
    return {
        AXIS_NAMES[axis]: lengths[:, None] * (np.arange(n) / n)[None, :]
        for axis, n in enumerate(system.shape)
    }


def channel_names(system: System) -> tuple[str, ...]:
    """The system's `channel_names` if it names them, else u (one channel) or u0, u1, ..."""
    own = getattr(system, "channel_names", None)
    if own is not None:
        return tuple(own)
    return tuple(f"u{c}" if system.channels > 1 else "u" for c in range(system.channels))


def axis_names(system: System) -> tuple[str, ...]:
    """The system's `axis_names` if it names them, else x, y, z for its spatial axes."""
    own = getattr(system, "axis_names", None)
    return tuple(own) if own is not None else tuple(AXIS_NAMES[: system.ndim])


def update_manifest(root: Path, config: Config) -> dict[str, Any]:
    """Rebuild manifest.json from the completion records (under a file lock, written atomically)."""
    system = build_system(config.system)
    with _locked(root / ".manifest.lock"):
        shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
        records = {}
        for shard in shards:
            path = root / shard.record
            if path.exists() and (root / shard.file).exists():
                with contextlib.suppress(json.JSONDecodeError):
                    record = json.loads(path.read_text())
                    if record.get("bytes") == (root / shard.file).stat().st_size:
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
            "stats": train_statistics([records[s.file] for s in shards if s.file in records])
            if complete
            else None,
            "machines": machines,
        }
        atomic_write_json(root / MANIFEST, manifest)
    return manifest


def train_statistics(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Normalisation statistics from the train split only, `records` in shard order: merged from the
    samples' own moments in index order (the same bytes however the split was sharded), or shard by shard
    for records written before those existed."""
    train = [record for record in records if record["split"] == "train"]
    if train and all("sample_moments" in record for record in train):
        samples = SampleMoments.empty()
        for record in train:
            samples = samples.extended(SampleMoments(**record["sample_moments"]))
        moments = samples.merged()
    else:
        moments = ChannelMoments(0, [], [], [], [])
        for record in train:
            moments = moments.merge(ChannelMoments(**record["moments"]))
    return moments.summary() if moments.count else None


def batches(n: int, size: int) -> Iterator[tuple[int, int]]:
    for lo in range(0, n, size):
        yield lo, min(lo + size, n)


def channels_first_to_last(fields: torch.Tensor) -> torch.Tensor:
    """(batch, time, channels, *space) -> (batch, time, *space, channels), the stored layout."""
    return torch.movedim(fields, 2, -1)


def _disabled(progress: bool | None) -> bool | None:
    return None if progress is None else not progress


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)
