"""`dynaforge convert`: a PDEBench or The Well file into a dataset folder of the store format, and (`export`,
`--to`) a dataset into theirs.

The folder holds the splits, arrays and train statistics that reading the file directly gives
(`dynaforge.store.interop`), in shards like a generated dataset's. There is no config.yaml (no dynaforge
config made the data); the manifest's `source` says where the data came from, and each shard carries it as
its `source` attribute, with a `source_index` dataset (each sample's index in the file). Seeds are 0.

Writes are atomic: every shard and record goes to a temporary file renamed into place, and the manifest,
written last, is what makes the folder a dataset. A rerun of the same conversion into a complete folder
does nothing; an interrupted one is redone. Shards are written by the store's one shard writer
(`dynaforge.store.writer.write_arrays_shard`), as generated ones are.

`export` hands a dataset to its format's sink (`ForeignFormat.write`, the registry `FORMATS`) and renames
the finished folder into place (docs/format.md, "Writing PDEBench and The Well").
"""

from __future__ import annotations

import json
import logging
import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm import tqdm

import dynaforge
from dynaforge.atomic import (
    TMP_SUFFIX,
    atomic_write_json,
    check_output_folder,
    remove_stale_temporaries,
)
from dynaforge.errors import OUT
from dynaforge.seeds import SPLITS
from dynaforge.store.foreign import SinkInput
from dynaforge.store.format import (
    AXIS_NAMES,
    FORMAT_VERSION,
    MANIFEST,
    DatasetError,
    ShardSpec,
    file_sha256,
    plan_shards,
)
from dynaforge.store.interop import DEFAULT_FRACTIONS, FORMATS, ForeignDataset
from dynaforge.store.reader import DatasetFolder
from dynaforge.store.to_xarray import axes_and_channels
from dynaforge.store.writer import ShardHeader, write_arrays_shard

log = logging.getLogger(__name__)

DEFAULT_SHARD_SIZE = 256
MARKER = ".conversion.json"
"""Written first: the identity of the conversion in progress, so that a rerun can tell it is the same."""


def convert(
    path: str | Path,
    out: str | Path,
    format: str | None = None,
    fractions: Sequence[float] = DEFAULT_FRACTIONS,
    shard_size: int = DEFAULT_SHARD_SIZE,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Convert foreign file `path` into dataset folder `out`; returns the manifest. `progress=None` shows a
    progress bar only on a terminal."""
    if shard_size < 1:
        raise DatasetError(f"--shard-size must be >= 1, got {shard_size}")
    dataset = ForeignDataset(path, format=format, fractions=fractions)
    root = Path(out)
    check_train_split(dataset, root)
    source = dataset.source() | {"sha256": file_sha256(dataset.root), "bytes": dataset.root.stat().st_size}
    identity = {"source": {k: source[k] for k in ("format", "layout", "name", "sha256", "fractions")}}
    existing = prepare_folder(root, identity)
    if existing is not None:
        log.info("%s already holds this conversion; nothing to do", root)
        return existing
    sizes = {split: dataset.split_size(split) for split in SPLITS}
    shards = plan_shards(sizes, shard_size)
    records = []
    disabled = None if progress is None else not progress
    with tqdm(total=sum(sizes.values()), unit="sample", disable=disabled, desc="convert") as bar:
        for shard in shards:
            records.append(write_shard(root, dataset, shard, source))
            bar.update(shard.size)
    manifest = {
        "format_version": FORMAT_VERSION,
        "dynaforge_version": dynaforge.__version__,
        "system": dataset.system,
        "identity": identity,
        "source": source,
        "splits": {
            split: {"n_samples": sizes[split], "n_shards": sum(1 for s in shards if s.split == split)}
            for split in SPLITS
        },
        "shape": dataset.manifest["shape"],
        "complete": True,
        "shards": [record | {"complete": True} for record in records],
        "stats": dataset.stats,
    }
    atomic_write_json(root / MANIFEST, manifest)
    (root / MARKER).unlink(missing_ok=True)
    return manifest


def check_train_split(dataset: ForeignDataset, out: Path) -> None:
    """Refuse, before anything is written, a conversion whose train split would be empty: the folder would
    have no normalisation statistics, and `dynaforge inspect` and every reader would refuse it."""
    if dataset.split_size("train") > 0:
        return
    if dataset.layout.n_samples == 0:
        raise DatasetError(f"{dataset.root} holds no samples; nothing was written")
    sizes = ", ".join(f"{split} {dataset.split_size(split)}" for split in SPLITS)
    fractions = ",".join(f"{f:g}" for f in dataset.fractions)
    raise DatasetError(
        f"{dataset.root}: --splits {fractions} leaves the train split of its {dataset.layout.n_samples} "
        f"sample(s) empty ({sizes}); nothing was written. Give train a share that holds a sample, e.g. "
        f"`dynaforge convert {dataset.root} --out {out} --splits 1,0,0`"
    )


def prepare_folder(root: Path, identity: dict[str, Any]) -> dict[str, Any] | None:
    """The manifest when `root` already holds this conversion; else make `root` ready (never overwriting
    anything that is not an earlier attempt at the same conversion)."""
    check_output_folder(root, (MANIFEST, *SPLITS), "a dataset folder", DatasetError)
    root.mkdir(parents=True, exist_ok=True)
    manifest_path, marker = root / MANIFEST, root / MARKER
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        if manifest.get("identity") == identity and manifest.get("complete"):
            return manifest
        raise DatasetError(f"{root} already holds another dataset; choose an empty or new {OUT} folder")
    if marker.exists():
        if json.loads(marker.read_text()) != identity:
            raise DatasetError(f"{root} holds an unfinished conversion of another file; choose another {OUT}")
    elif any(p for p in root.iterdir() if not p.name.startswith(".")):
        raise DatasetError(
            f"{root} is not empty and holds no dynaforge dataset; choose an empty or new {OUT}"
        )
    atomic_write_json(marker, identity)
    for split in SPLITS:
        remove_stale_temporaries(root / split)
    return None


def write_shard(
    root: Path, dataset: ForeignDataset, shard: ShardSpec, source: dict[str, Any]
) -> dict[str, Any]:
    """One shard of the store format from samples [shard.start, shard.stop) of a split, and its record
    (written by the store's one shard writer, `dynaforge.store.writer`)."""
    arrays = dataset.read_arrays(shard.split, shard.start, shard.stop)
    layout = dataset.layout
    header = ShardHeader(
        system=dataset.system,
        provenance={"source": json.dumps(source)},
        dt=float(layout.time[1] - layout.time[0]) if len(layout.time) > 1 else None,
        channel_names=tuple(layout.channel_names),
        axis_names=AXIS_NAMES[: len(layout.space)],
        param_names=tuple(layout.param_names),
    )
    source_index = dataset.source_indices(shard.split)[shard.start : shard.stop]
    return write_arrays_shard(root, shard, header, arrays, {"source_index": source_index})


# ---- the other way: a dataset into a foreign format (`dynaforge convert DIR --to the_well|pdebench`) ----


def export(path: str | Path, out: str | Path, to: str, progress: bool | None = None) -> tuple[list[str], str]:
    """Write dataset `path` (a folder, or a PDEBench / The Well file read with its default splits) into the
    new folder `out` in format `to` (`FORMATS`); returns what was written (relative to `out`) and how to
    read it back. The folder appears whole or not at all: it is written beside `out` and renamed into place.
    `progress=None` shows a progress bar only on a terminal."""
    if to not in FORMATS:
        raise DatasetError(
            f"--to {to!r} is not a format dynaforge writes; choose one of: {', '.join(FORMATS)}"
        )
    root = Path(out)
    check_output_folder(root, (), f"a new folder for `--to {to}`", DatasetError)
    folder = DatasetFolder(path)
    dataset = sink_input(folder)
    root.parent.mkdir(parents=True, exist_ok=True)
    partial = root.parent / f".{root.name}.{os.getpid()}{TMP_SUFFIX}"
    shutil.rmtree(partial, ignore_errors=True)  # a killed export's, by the same process id
    partial.mkdir()
    try:
        with tqdm(
            total=sum(dataset.split_sizes.values()),
            unit="sample",
            disable=None if progress is None else not progress,
            desc=f"convert --to {to}",
        ) as bar:
            written, how = FORMATS[to].write(dataset, partial, bar.update)
        move_into_place(partial, root)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
    return written, how.format(out=root)


def move_into_place(partial: Path, root: Path) -> None:
    """Rename the finished folder onto `root` (missing, or an empty folder)."""
    try:
        os.replace(partial, root)
    except OSError as error:
        raise DatasetError(
            f"{root} could not be replaced by the finished export ({error.strerror}); nothing was written. "
            f"Choose a new {OUT} folder"
        ) from None


def sink_input(folder: DatasetFolder) -> SinkInput:
    """What a sink needs of a dataset (names, sizes, statistics, boundaries), checked before anything is
    written."""
    shape = folder.manifest["shape"]
    sizes = {split: folder.split_size(split) for split in SPLITS}
    first = next(split for split in SPLITS if sizes[split])
    axes, channels = axes_and_channels(folder, first, len(shape["space"]))
    if not axes or not set(axes) <= set(AXIS_NAMES):
        raise DatasetError(
            f"{folder.root} ({folder.system}) is not on a spatial grid (its axes: {', '.join(axes) or 'none'}); "
            "The Well and PDEBench hold fields on x, y, z grids, so it cannot be written in their formats"
        )
    return SinkInput(
        system=folder.system,
        axis_names=axes,
        channel_names=channels,
        split_sizes=sizes,
        read_split=folder.read_split,
        stats=folder.stats,
        boundaries=folder.boundaries(axes),
    )
