"""PDEBench and The Well files as dynaforge datasets: read directly, with the same arrays a conversion writes.

`ForeignDataset(FILE)` offers what a dataset folder offers (`split_size`, `read_split`, `stats`, `system`,
`manifest`), so training and evaluation take a file where they take a folder (`DatasetFolder(FILE)`
delegates here). `dynaforge convert` (`dynaforge.store.convert`) writes the same splits, arrays and
statistics into a folder of the store format. Both go through the functions below, so a model trained on
one and evaluated on the other gets the same numbers.

Splits are contiguous runs of samples in file order, sized by fractions (train, val, test), default
(0.8, 0.1, 0.1): n_test and n_val are rounded down and train takes the rest; or by counts (1000, 100, 200),
which leave the samples beyond their sum unused (between train and the others). Where the test run sits
follows the source benchmark's loader (`ForeignLayout.test_first`): PDEBench `tensor`/`cfd` files test on
their first samples (then val, then train), PDEBench per-sample-group files and The Well files on their
last (train, then val, then test). Normalisation statistics come from the train split only, accumulated in
chunks of STATS_CHUNK samples (Chan et al.'s merge, as for generated datasets).
"""

from __future__ import annotations

import functools
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np

import dynaforge
from dynaforge.errors import ConfigError
from dynaforge.seeds import SPLITS
from dynaforge.store.foreign import ForeignFormat, ForeignLayout
from dynaforge.store.format import FORMAT_VERSION, DatasetError, SplitArrays
from dynaforge.store.pdebench import PDEBENCH
from dynaforge.store.stats import ChannelMoments
from dynaforge.store.the_well import THE_WELL

FORMATS: dict[str, ForeignFormat] = {"pdebench": PDEBENCH, "the_well": THE_WELL}
"""The one registry of foreign formats: name -> how to recognise, describe, read and write it."""
DEFAULT_FRACTIONS = (0.8, 0.1, 0.1)
"""(train, val, test) shares of a foreign file's samples."""
STATS_CHUNK = 64
"""Samples per chunk when accumulating the train statistics (fixed, so that every path gets equal bits)."""


def parse_fractions(text: str) -> tuple[float, float, float]:
    """`0.8,0.1,0.1` -> (0.8, 0.1, 0.1): train, val, test shares, each >= 0, summing to 1; or counts
    `1000,100,200` -> (1000, 100, 200): whole numbers of samples (see `split_ranges`)."""
    try:
        values = tuple(float(v) for v in text.split(","))
    except ValueError:
        values = ()
    if len(values) != 3:
        raise DatasetError(
            f"--splits takes three fractions TRAIN,VAL,TEST such as 0.8,0.1,0.1 or three counts such as "
            f"1000,100,200; got {text!r}"
        )
    return check_fractions(values)


def are_counts(splits: Sequence[float]) -> bool:
    """Split sizes given as sample counts (whole numbers, not all of them 0 or 1) rather than fractions."""
    return all(float(v).is_integer() for v in splits) and sum(splits) > 1


def check_fractions(fractions: Sequence[float]) -> tuple[float, float, float]:
    train, val, test = (float(f) for f in fractions)
    if are_counts((train, val, test)) and min(train, val, test) >= 0:
        return train, val, test
    if min(train, val, test) < 0 or abs(train + val + test - 1) > 1e-9:
        raise DatasetError(
            f"split fractions (train, val, test) must be >= 0 and sum to 1, got {(train, val, test)}"
        )
    return train, val, test


def split_ranges(n: int, fractions: Sequence[float], test_first: bool) -> dict[str, tuple[int, int]]:
    """Split -> [start, stop) sample range of a file of `n` samples (see the module docstring)."""
    train, val, test = check_fractions(fractions)
    if are_counts(fractions):
        return count_ranges(n, int(train), int(val), int(test), test_first)
    n_val = int(n * val)
    if test_first:  # PDEBench FNODatasetSingle: data[:int(N * test_ratio)] is the test set
        n_test = int(n * test)
        return {"train": (n_test + n_val, n), "val": (n_test, n_test + n_val), "test": (0, n_test)}
    test_start = int(n * (1 - test))  # PDEBench FNODatasetMult: keys[int(N * (1 - test_ratio)):]
    val_start = max(test_start - n_val, 0)
    return {"train": (0, val_start), "val": (val_start, test_start), "test": (test_start, n)}


def count_ranges(n: int, train: int, val: int, test: int, test_first: bool) -> dict[str, tuple[int, int]]:
    """Split ranges of given sizes, in the order of the source's loader (test first or last)."""
    if train + val + test > n:
        raise DatasetError(
            f"--splits {train},{val},{test} asks for {train + val + test} samples; the file has {n}"
        )
    if test_first:
        return {"train": (test + val, test + val + train), "val": (test, test + val), "test": (0, test)}
    return {"train": (0, train), "val": (n - test - val, n - test), "test": (n - test, n)}


def detect_format(h5: h5py.File) -> str:
    for name, reader in FORMATS.items():
        if reader.recognises(h5):
            return name
    raise DatasetError(
        f"{h5.filename} is neither a PDEBench file (a `tensor` dataset; `density`, `Vx`, ... datasets; or "
        "per-sample groups `0000/data`) nor a The Well file (`dimensions` and `t0_fields`/`t1_fields`); "
        f"found {sorted(h5)[:10]}"
    )


class ForeignDataset:
    """A PDEBench or The Well HDF5 file, split and read like a dataset folder."""

    def __init__(
        self, path: str | Path, format: str | None = None, fractions: Sequence[float] = DEFAULT_FRACTIONS
    ) -> None:
        self.root = Path(path)
        if not self.root.is_file():
            raise DatasetError(f"{self.root} is not a file")
        if format is not None and format not in FORMATS:
            raise DatasetError(f"unknown format {format!r}; valid: {', '.join(FORMATS)}")
        try:
            with h5py.File(self.root, "r") as h5:
                self.format = format or detect_format(h5)
                reader = FORMATS[self.format]
                if not reader.recognises(h5):
                    raise DatasetError(
                        f"{self.root} is not a {self.format} file; try --format {detect_format(h5)}"
                    )
                self.layout: ForeignLayout = reader.describe(h5, self.root.stem)
        except OSError as error:
            raise DatasetError(f"{self.root} is not a readable HDF5 file ({error})") from None
        self.reader = reader
        self.fractions = check_fractions(fractions)
        self.ranges = split_ranges(self.layout.n_samples, self.fractions, self.layout.test_first)

    @property
    def system(self) -> str:
        """`pdebench:NAME` or `the_well:NAME`."""
        return f"{self.layout.format}:{self.layout.name}"

    def split_size(self, split: str) -> int:
        start, stop = self.ranges[check_split(split)]
        return stop - start

    def read_fields(self, split: str, start: int = 0, stop: int | None = None) -> np.ndarray:
        """Fields of the split's samples [start, stop) (split-local indices), (n, T, *space, C) float32."""
        lo, hi = self.ranges[check_split(split)]
        stop = hi - lo if stop is None else stop
        with h5py.File(self.root, "r") as h5:
            fields = self.reader.read(h5, self.layout, lo + start, lo + stop)
        if not np.isfinite(fields).all():
            raise DatasetError(f"{self.root}: the {split} split holds NaN or Inf values")
        return fields

    def chunks(self, split: str, size: int) -> Iterator[tuple[int, np.ndarray]]:
        """(split-local start, fields) of consecutive chunks of `size` samples."""
        n = self.split_size(split)
        for start in range(0, n, size):
            yield start, self.read_fields(split, start, min(start + size, n))

    def read_arrays(self, split: str, start: int = 0, stop: int | None = None) -> SplitArrays:
        """Samples [start, stop) of the split (split-local indices) with their parameters, coordinates and
        times, seeds 0 (no dynaforge seed made them)."""
        fields = self.read_fields(split, start, stop)
        first = self.ranges[check_split(split)][0] + start
        rows = slice(first, first + len(fields))
        layout = self.layout
        return SplitArrays(
            fields=fields,
            params=layout.params[rows].copy(),
            param_names=layout.param_names,
            seeds=np.zeros(len(fields), dtype=np.uint64),
            time=layout.time.copy(),
            coords={axis: c[rows].copy() for axis, c in layout.coords.items()},
        )

    def read_split(self, split: str, samples: int | None = None) -> SplitArrays:
        """The split's samples in order, all of them or the first `samples` (only those are read)."""
        if self.split_size(split) == 0:
            raise DatasetError(f"split {split!r} of {self.root} has no samples (fractions {self.fractions})")
        return self.read_arrays(split, 0, samples)

    def source_indices(self, split: str) -> np.ndarray:
        """Each sample's index in the file (sorted group order for per-sample groups), int64."""
        lo, hi = self.ranges[check_split(split)]
        return np.arange(lo, hi, dtype=np.int64)

    @functools.cached_property
    def stats(self) -> dict[str, Any] | None:
        """Normalisation statistics of the train split (None when it is empty)."""
        moments = ChannelMoments(0, [], [], [], [])
        for _, fields in self.chunks("train", STATS_CHUNK):
            moments = moments.merge(ChannelMoments.of(fields))
        return moments.summary() if moments.count else None

    def source(self) -> dict[str, Any]:
        """What the dataset was read from and how it was split (JSON-able)."""
        layout = self.layout
        return {
            "format": layout.format,
            "layout": layout.layout,
            "name": layout.name,
            "file": str(self.root.resolve()),
            "fractions": list(self.fractions),
            "ranges": {split: list(r) for split, r in self.ranges.items()},
            "channel_names": list(layout.channel_names),
            "param_names": list(layout.param_names),
            "details": layout.details,
        }

    @property
    def manifest(self) -> dict[str, Any]:
        """A manifest like a folder's, without shards and (lazily computed) statistics."""
        return {
            "format_version": FORMAT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "system": self.system,
            "source": self.source(),
            "splits": {split: {"n_samples": self.split_size(split)} for split in SPLITS},
            "shape": {
                "frames": self.layout.n_frames,
                "space": list(self.layout.space),
                "channels": len(self.layout.channel_names),
            },
            "complete": True,
        }


def check_split(split: str) -> str:
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    return split
