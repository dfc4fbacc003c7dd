"""What a foreign (PDEBench or The Well) HDF5 file holds, described before any field is read.

Each reader (`dynaforge.store.pdebench`, `dynaforge.store.the_well`) turns an open file into a
`ForeignLayout` and reads samples [start, stop) from it as a dynaforge fields array,
(samples, time, *space, channels) float32, channels last (the stored layout of docs/format.md).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from dynaforge.store.format import DatasetError, SplitArrays


class ForeignLayout(NamedTuple):
    """The shape and metadata of a foreign file's trajectories."""

    format: str
    """`pdebench` or `the_well`."""
    layout: str
    """How the file stores the fields: `tensor`, `cfd`, `groups` (PDEBench) or `the_well`."""
    name: str
    """The dataset's name: the file name's stem (PDEBench) or the `dataset_name` attribute (The Well)."""
    n_samples: int
    n_frames: int
    space: tuple[int, ...]
    """Grid points per spatial axis, in the fields' axis order."""
    channel_names: tuple[str, ...]
    time: np.ndarray
    """(frames,) float64: the time of every frame."""
    coords: dict[str, np.ndarray]
    """Axis name (x, y, z) -> (samples, points) float64: every sample's grid coordinates."""
    param_names: tuple[str, ...]
    params: np.ndarray
    """(samples, parameters) float64: every sample's physical parameters (a file's constants repeated)."""
    test_first: bool
    """True when the source benchmark's loader takes its test split from the front of the file."""
    details: dict[str, Any]
    """JSON-able facts worth keeping: source dataset names, axis names, boundary conditions, dropped fields."""


class SinkInput(NamedTuple):
    """A dataset as a sink writes it into a foreign format: a dataset folder or a foreign file, read through
    `DatasetFolder` by `dynaforge.store.convert.export` (the sinks never open a dataset folder themselves)."""

    system: str
    """`burgers`, `pdebench:NAME`, ...: names the written files and datasets."""
    axis_names: tuple[str, ...]
    channel_names: tuple[str, ...]
    split_sizes: dict[str, int]
    read_split: Callable[[str], SplitArrays]
    """split -> all its samples in order (docs/format.md's arrays: channels last, per-sample coordinates)."""
    stats: dict[str, Any]
    """The train split's normalisation statistics (`mean`, `std`, ... per channel)."""
    boundaries: dict[str, str]
    """Axis name -> boundary type in The Well's words (`PERIODIC`, `WALL`, `OPEN`); empty where unknown."""


class ForeignFormat(NamedTuple):
    """One foreign format, as a source (recognise, describe and read its files) and as a sink (write a
    dataset in it). `dynaforge.store.interop.FORMATS` maps each format's name to its one `ForeignFormat`."""

    recognises: Callable[[h5py.File], bool]
    describe: Callable[[h5py.File, str], ForeignLayout]
    """(open file, file stem) -> its layout."""
    read: Callable[[h5py.File, ForeignLayout, int, int], np.ndarray]
    """(open file, layout, start, stop) -> fields of samples [start, stop), float32, channels last."""
    write: Callable[[SinkInput, Path, Callable[[int], object]], tuple[list[str], str]]
    """(dataset, new folder `out` the caller made, `on_samples(n)` called after every n samples written) ->
    (what it wrote, paths relative to `out`; a sentence saying how to read it back, `{out}` standing for the
    folder's final name: a sink writes into a temporary folder renamed into place)."""


def decode(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def string_list(value: Any) -> list[str]:
    """An HDF5 attribute holding one string or a list of them, as a list of str."""
    if value is None:
        return []
    if isinstance(value, str | bytes):
        return [decode(value)]
    return [decode(v) for v in np.asarray(value).ravel()]


def check_real_valued(dataset: h5py.Dataset) -> None:
    """Refuse a field that is not real numbers: casting complex values to float32 would silently keep the
    real part, and dynaforge's channels, statistics and metrics are defined for real fields only."""
    kind = dataset.dtype.kind
    if kind in "fiu":
        return
    name = dataset.name.rsplit("/", 1)[-1]
    what = "complex-valued" if kind == "c" else f"of dtype {dataset.dtype}"
    fix = (
        f"store its real and imaginary parts as two real fields (e.g. `{name}_re`, `{name}_im`) and convert that"
        if kind == "c"
        else "store it as floating point"
    )
    raise DatasetError(
        f"{dataset.file.filename}: field `{dataset.name.lstrip('/')}` is {what} ({dataset.dtype}); dynaforge "
        f"reads real fields only: {fix}"
    )


def per_sample(values: np.ndarray, n_samples: int, where: str) -> np.ndarray:
    """(k,) values shared by every sample, or (samples, k) values of each, as (samples, k) float64."""
    values = np.asarray(values, dtype=np.float64)
    if values.ndim == 1:
        return np.broadcast_to(values, (n_samples, len(values))).copy()
    if values.ndim != 2 or values.shape[0] != n_samples:
        raise DatasetError(f"{where} is {values.shape}; expected one row per sample ({n_samples})")
    return values


def sink_name(system: str) -> str:
    """A file-name-safe dataset name from a system name (`pdebench:1D_Advection` -> `pdebench_1D_Advection`)."""
    return "".join(c if c.isalnum() or c in "-_." else "_" for c in system)


def identical_rows(values: np.ndarray) -> bool:
    """Whether every sample (row) of a (samples, ...) array holds the same values."""
    return len(values) == 0 or bool((values == values[:1]).all())
