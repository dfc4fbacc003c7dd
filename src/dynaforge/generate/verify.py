"""`dynaforge verify DIR`: regenerate samples from the dataset's config and seeds alone and compare them with
the stored ones, byte for byte (docs/format.md, "A dataset is its config").

A sample is regenerated alone (or, for random CNN operators, with its operator's other realizations), so a
pass also shows that the stored sample did not depend on the batch or shard it was made in. On the machine
that made the dataset every sample is identical; on another CPU family or a GPU, floating-point results may
legitimately differ in the last bits, which `tolerance` accepts (the largest difference relative to the
sample's largest magnitude). The stored bytes are also checked against the hash recorded when the shard was
written, which tells a regenerated sample that differs apart from a stored one that was altered.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from dynaforge.config import ConfigError, resolve_device
from dynaforge.generate.stage import system_for
from dynaforge.machine import machine_record
from dynaforge.seeds import Rows
from dynaforge.store.format import DatasetError, sample_sha256
from dynaforge.store.layout import fields_to_disk
from dynaforge.store.reader import DatasetFolder
from dynaforge.systems.base import SampleRows

DEFAULT_SAMPLES = 3
"""Samples regenerated per split when `--samples` is not given."""


class SampleCheck(NamedTuple):
    """One regenerated sample against its stored copy."""

    split: str
    index: int
    file: str
    identical: bool
    """Every regenerated array equals the stored one, byte for byte."""
    stored_matches_record: bool | None
    """The stored fields and params hash to the shard record's `sample_sha256` (None: none recorded)."""
    max_abs: float
    """Largest |regenerated - stored| over the differing arrays (0 when identical)."""
    max_rel: float
    """Largest |regenerated - stored| of an array over that array's largest |stored value|."""
    differing: tuple[str, ...]
    """Names of the arrays that differ (fields, params, or a system's extras)."""
    tolerance: float | None
    comparable: bool = True
    """Every differing array is floating point of the stored shape (a tolerance can apply)."""

    @property
    def within_tolerance(self) -> bool:
        return self.tolerance is not None and self.comparable and self.max_rel <= self.tolerance

    @property
    def passed(self) -> bool:
        return self.stored_matches_record is not False and (self.identical or self.within_tolerance)

    def describe(self) -> str:
        name = f"{self.split}/{self.index} ({self.file})"
        detail = (
            f"max |difference| {self.max_abs:.3g}, relative {self.max_rel:.3g} ({', '.join(self.differing)})"
        )
        if self.stored_matches_record is False:
            regenerated = "equals it" if self.identical else f"differs from it: {detail}"
            return (
                f"{name}: FAIL, the stored sample no longer matches the hash recorded when it was written "
                f"(altered or corrupt after generation); the regenerated sample {regenerated}"
            )
        if self.identical:
            return f"{name}: identical"
        if self.within_tolerance:
            return f"{name}: within tolerance {self.tolerance:g}: {detail}"
        return f"{name}: FAIL, differs: {detail}"


class VerifyResult(NamedTuple):
    checks: list[SampleCheck]
    made_on: list[dict[str, Any]]
    """The machines the dataset's shards were made on (manifest `machines`)."""
    checked_on: dict[str, Any]

    @property
    def ok(self) -> bool:
        return all(check.passed for check in self.checks)


def verify_dataset(
    root: str | Path,
    samples: int | None = DEFAULT_SAMPLES,
    tolerance: float | None = None,
    seed: int | None = None,
    on_sample: Callable[[SampleCheck], Any] | None = None,
) -> VerifyResult:
    """Regenerate `samples` randomly chosen samples per split (None: every sample) and compare them."""
    folder = DatasetFolder(root)
    try:
        config = folder.config
    except ConfigError as error:
        raise DatasetError(f"{error}; only datasets made by `dynaforge generate` can be verified") from None
    recorded = folder.manifest.get("identity", {}).get("system", {}).get("precision")
    if getattr(config.system, "precision", None) == "auto" and recorded in ("bfloat16", "float32"):
        # regenerate in the precision the dataset was made with, whatever this machine would pick
        config = replace(config, system=replace(config.system, precision=recorded))
    if tolerance is not None and tolerance < 0:
        raise DatasetError(f"--tolerance must be >= 0, got {tolerance}")
    device = torch.device(resolve_device(config.dataset.device))
    system = system_for(config, device)
    unit = system.rows_per_unit  # random CNN rows come in whole operators
    rng = np.random.default_rng(seed)
    checks = []
    for split in ("train", "val", "test"):
        size = folder.split_size(split)
        chosen = list(range(size))
        if samples is not None:
            chosen = sorted(int(i) for i in rng.choice(size, min(samples, size), replace=False))
        for start, stop in unit_runs(chosen, unit, max(config.dataset.batch_size, unit)):
            rows = system.sample_rows(Rows(split, start, stop, config.dataset.seed), device)
            wanted = [i for i in chosen if start <= i < stop]
            for check in compare_rows(folder, split, start, rows, wanted, tolerance):
                checks.append(check)
                if on_sample is not None:
                    on_sample(check)
    return VerifyResult(checks, folder.manifest.get("machines", []), machine_record(device))


def unit_runs(indices: list[int], unit: int, batch: int) -> Iterator[tuple[int, int]]:
    """Ranges [start, stop) of whole units (`unit` rows each) covering `indices`, neighbouring units merged
    up to `batch` rows."""
    units = sorted({i // unit for i in indices})
    run_start = None
    previous = None
    for u in units:
        if run_start is None:
            run_start = previous = u
            continue
        if u == previous + 1 and (u + 1 - run_start) * unit <= batch:
            previous = u
            continue
        yield run_start * unit, (previous + 1) * unit
        run_start = previous = u
    if run_start is not None:
        yield run_start * unit, (previous + 1) * unit


def compare_rows(
    folder: DatasetFolder,
    split: str,
    start: int,
    rows: SampleRows,
    wanted: list[int],
    tolerance: float | None,
) -> Iterator[SampleCheck]:
    regenerated = fields_to_disk(rows.fields)  # compared in the stored layout, byte for byte
    for index in wanted:
        record = folder.record_of(split, index)
        local = index - record["start"]
        stored = folder.stored_arrays(split, index, ("fields", "params", *rows.extras))
        row = index - start
        fresh = {"fields": regenerated[row], "params": rows.params[row]}
        fresh.update({name: values[row] for name, values in rows.extras.items()})
        differing = tuple(
            name
            for name, values in fresh.items()
            if stored[name] is None or not same_bytes(values, stored[name])
        )
        hashes = record.get("sample_sha256")
        recorded = (
            None if hashes is None else hashes[local] == sample_sha256(stored["fields"], stored["params"])
        )
        gaps = [difference(fresh[name], stored[name]) for name in differing]
        yield SampleCheck(
            split=split,
            index=index,
            file=record["file"],
            identical=not differing,
            stored_matches_record=recorded,
            max_abs=max((gap[0] for gap in gaps), default=0.0),
            max_rel=max((gap[1] for gap in gaps), default=0.0),
            differing=differing,
            tolerance=tolerance,
            comparable=all(gap[2] for gap in gaps),
        )


def difference(
    fresh: np.ndarray | np.generic, stored: np.ndarray | np.generic | None
) -> tuple[float, float, bool]:
    """(max |fresh - stored|, that over max |stored|, whether a tolerance can apply) of one array."""
    fresh = np.asarray(fresh)
    if stored is None or fresh.shape != np.shape(stored):
        return float("inf"), float("inf"), False
    stored = np.asarray(stored)
    floating = np.issubdtype(fresh.dtype, np.floating) and np.issubdtype(stored.dtype, np.floating)
    gap = np.abs(fresh.astype(np.float64) - stored.astype(np.float64))
    largest = float(np.nan_to_num(gap, nan=np.inf).max()) if gap.size else 0.0
    scale = float(np.abs(stored.astype(np.float64)).max()) if stored.size else 0.0
    relative = largest / scale if scale > 0 else (0.0 if largest == 0 else float("inf"))
    return largest, relative, floating


def same_bytes(a: np.ndarray | np.generic, b: np.ndarray | np.generic) -> bool:
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and a.tobytes() == b.tobytes()


def verify_summary(result: VerifyResult) -> dict[str, Any]:
    """The result as plain data (`dynaforge verify --json`)."""
    return {
        "ok": result.ok,
        "made_on": result.made_on,
        "checked_on": result.checked_on,
        "samples": [check._asdict() | {"passed": check.passed} for check in result.checks],
    }


def dumps(result: VerifyResult) -> str:
    return json.dumps(verify_summary(result), indent=2)
