"""Check a dataset folder against its specification (docs/format.md) and summarise it."""

from __future__ import annotations

from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from dynaforge.store.format import AXIS_NAMES, CONFIG, DatasetError, shard_problem
from dynaforge.store.labels import unlabelled_dimensions
from dynaforge.store.reader import manifest_problems, read_manifest

REQUIRED = ("fields", "params", "param_names", "seeds", "index", "time")
REQUIRED_ATTRS = ("format_version", "dynaforge_version", "system", "split", "config")


class Validation(NamedTuple):
    ok: bool
    errors: list[str]
    warnings: list[str]
    summary: dict[str, Any]


def validate_dataset(root: str | Path, checksums: bool = True) -> Validation:
    """Every problem found (not only the first), and a summary of what the folder holds."""
    root = Path(root)
    errors: list[str] = []
    warnings: list[str] = []
    try:
        manifest = read_manifest(root)
    except DatasetError as error:
        return Validation(False, [str(error)], [], {})
    converted = "source" in manifest  # converted from a PDEBench or The Well file: no dynaforge config
    if not converted and not (root / CONFIG).exists():
        errors.append(f"{root / CONFIG} is missing")
    shape = manifest["shape"]
    listed = set()
    param_ranges: dict[str, list[float]] = {}
    for record in manifest["shards"]:
        listed.add(record["file"])
        path = root / record["file"]
        if problem := shard_problem(root, record, thorough=checksums):
            errors.append(problem)
            continue
        try:
            check_shard(path, record, shape, param_ranges)
        except (OSError, KeyError, ValueError) as error:
            errors.append(f"{record['file']}: {error}")
    if manifest.get("complete"):
        errors.extend(manifest_problems(root, manifest))  # what readers refuse: counts, statistics
    for path in sorted(root.glob("*/shard-*.h5")):
        if str(path.relative_to(root)) not in listed:
            warnings.append(f"{path.relative_to(root)}: not listed in the manifest (ignored by readers)")
    if (
        manifest.get("complete")
        and not manifest.get("stats")
        and not manifest["splits"]["train"]["n_samples"]
    ):
        errors.append("manifest is complete but holds no normalisation statistics (empty train split)")
    summary = {
        "root": str(root),
        "system": manifest["system"],
        "format_version": manifest["format_version"],
        "complete": bool(manifest.get("complete")),
        "splits": {split: manifest["splits"][split]["n_samples"] for split in manifest["splits"]},
        "frames": shape["frames"],
        "space": shape["space"],
        "channels": shape["channels"],
        "parameters": {name: {"min": lo, "max": hi} for name, (lo, hi) in param_ranges.items()},
        "stats": manifest.get("stats"),
        "bytes": sum(r.get("bytes", 0) for r in manifest["shards"]),
    }
    if converted:
        summary["source"] = {k: manifest["source"].get(k) for k in ("format", "layout", "file", "fractions")}
    return Validation(not errors, errors, warnings, summary)


def check_shard(
    path: Path, record: dict[str, Any], shape: dict[str, Any], param_ranges: dict[str, list[float]]
) -> int:
    """Structure, shapes, dtypes and finiteness of one shard; returns its sample count."""
    with h5py.File(path, "r") as h5:
        missing = [name for name in REQUIRED if name not in h5]
        if missing:
            raise KeyError(f"missing dataset(s) {missing}")
        required = [n for n in REQUIRED_ATTRS if n != "config"] if "source" in h5.attrs else REQUIRED_ATTRS
        missing_attrs = [name for name in required if name not in h5.attrs]
        if missing_attrs:
            raise KeyError(f"missing attribute(s) {missing_attrs}")
        n = record["stop"] - record["start"]
        expected = (n, shape["frames"], *shape["space"], shape["channels"])
        fields = h5["fields"]
        if fields.shape != expected or fields.dtype != np.float32:
            raise ValueError(f"fields is {fields.dtype}{fields.shape}, expected float32{expected}")
        for start in range(0, n, 64):
            if not np.isfinite(fields[start : start + 64]).all():
                raise ValueError("fields hold NaN or Inf (the solver diverged)")
        names = [v.decode() if isinstance(v, bytes) else str(v) for v in h5["param_names"][...]]
        params = h5["params"][...]
        if params.shape != (n, len(names)):
            raise ValueError(f"params has shape {params.shape}, expected {(n, len(names))}")
        if h5["seeds"].shape != (n,) or h5["time"].shape != (shape["frames"],):
            raise ValueError("seeds or time has the wrong length")
        if not np.array_equal(h5["index"][...], np.arange(record["start"], record["stop"])):
            raise ValueError("index does not match the shard's range")
        hashes = record.get("sample_sha256")
        if hashes is not None and len(hashes) != n:
            raise ValueError(f"the record holds {len(hashes)} sample hashes for {n} samples")
        if int(h5.attrs["format_version"]) >= 2 and (unlabelled := unlabelled_dimensions(h5)):
            raise KeyError(f"fields axes {unlabelled} have no dimension scale (format version 2 labels all)")
        axes = [str(a) for a in h5.attrs.get("axis_names", AXIS_NAMES)]
        for axis, n_points in zip(axes, shape["space"], strict=False):
            if axis not in h5 or h5[axis].shape != (n, n_points):
                raise KeyError(f"coordinate {axis!r} missing or of the wrong shape")
        for i, name in enumerate(names):
            lo, hi = float(params[:, i].min()), float(params[:, i].max())
            old = param_ranges.get(name, [lo, hi])
            param_ranges[name] = [min(old[0], lo), max(old[1], hi)]
        return n
