"""Read a dataset folder. Only shards the manifest lists as complete, with matching sizes, are read."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from dynaforge.config import Config, load_config
from dynaforge.store.format import AXIS_NAMES, CONFIG, FORMAT_VERSION, MANIFEST, SPLITS
from dynaforge.store.writer import DatasetError


class SplitArrays(NamedTuple):
    """All samples of one split, in global index order."""

    fields: np.ndarray  # (N, T, *space, C) float32, channels last
    params: np.ndarray  # (N, P) float64
    param_names: tuple[str, ...]
    seeds: np.ndarray  # (N,) uint64
    time: np.ndarray  # (T,) float64
    coords: dict[str, np.ndarray]  # axis name -> (N, n)


class DatasetFolder:
    """A complete, trusted dataset folder (see docs/format.md)."""

    def __init__(self, root: str | Path) -> None:
        self.root = Path(root)
        self.manifest = read_manifest(self.root)
        if not self.manifest.get("complete"):
            done = sum(1 for s in self.manifest["shards"] if s.get("complete"))
            raise DatasetError(
                f"{self.root} is incomplete ({done} of {len(self.manifest['shards'])} shards done); "
                f"finish it with `dynaforge generate {self.root / CONFIG} --out {self.root}`"
            )

    @property
    def config(self) -> Config:
        return load_config(self.root / CONFIG)

    @property
    def stats(self) -> dict[str, Any]:
        return self.manifest["stats"]

    @property
    def system(self) -> str:
        return self.manifest["system"]

    def split_size(self, split: str) -> int:
        return int(self.manifest["splits"][split]["n_samples"])

    def shard_paths(self, split: str) -> list[Path]:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
        paths = []
        for record in sorted(
            (s for s in self.manifest["shards"] if s["split"] == split), key=lambda s: s["start"]
        ):
            path = self.root / record["file"]
            if not path.exists():
                raise DatasetError(
                    f"{path} is listed in the manifest but missing; run `dynaforge inspect {self.root}`"
                )
            if path.stat().st_size != record["bytes"]:
                raise DatasetError(
                    f"{path} has {path.stat().st_size} bytes but the manifest records {record['bytes']}: "
                    f"truncated or modified; run `dynaforge inspect {self.root}` and regenerate"
                )
            paths.append(path)
        return paths

    def read_split(self, split: str) -> SplitArrays:
        parts: dict[str, list[np.ndarray]] = {"fields": [], "params": [], "seeds": []}
        coords: dict[str, list[np.ndarray]] = {}
        time, names = None, None
        for path in self.shard_paths(split):
            with h5py.File(path, "r") as h5:
                for key in parts:
                    parts[key].append(h5[key][...])
                for axis in [str(a) for a in h5.attrs.get("axis_names", AXIS_NAMES)]:
                    if axis in h5:
                        coords.setdefault(axis, []).append(h5[axis][...])
                time = h5["time"][...]
                names = tuple(n.decode() if isinstance(n, bytes) else str(n) for n in h5["param_names"][...])
        if time is None:
            raise DatasetError(f"split {split!r} of {self.root} has no samples")
        return SplitArrays(
            fields=np.concatenate(parts["fields"]),
            params=np.concatenate(parts["params"]),
            param_names=names,
            seeds=np.concatenate(parts["seeds"]),
            time=time,
            coords={axis: np.concatenate(v) for axis, v in coords.items()},
        )


def read_manifest(root: Path) -> dict[str, Any]:
    path = root / MANIFEST
    if not root.is_dir():
        raise DatasetError(
            f"{root} is not a folder; generate one with `dynaforge generate CONFIG --out {root}`"
        )
    if not path.exists():
        raise DatasetError(
            f"{path} is missing: {root} is not a dynaforge dataset or its generation never finished a shard"
        )
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError as error:
        raise DatasetError(
            f"{path} is not valid JSON ({error}); rerun `dynaforge generate` with the same config to rebuild it"
        ) from None
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise DatasetError(
            f"{path} has format version {version}; this dynaforge reads version {FORMAT_VERSION}"
        )
    return manifest
