"""PDEBench HDF5 files (Takamoto et al. 2022; data at DaRUS, doi:10.18419/darus-2986): reader and tiny writers.

Three layouts, as PDEBench's own loaders (`FNODatasetSingle`, `FNODatasetMult` in
`pdebench/models/fno/utils.py`) read them:

- `tensor`: one dataset `tensor` [N, T, X] (1D: advection, Burgers, reaction-diffusion) or [N, T, X, Y],
  with `x-coordinate` [X] (`y-coordinate` [Y]) and `t-coordinate` [T + 1] (PDEBench stores one time more
  than it has frames; the first T are the frames' times).
- `cfd`: compressible Navier-Stokes, one dataset per field, `density`, `pressure`, `Vx` (`Vy`, `Vz`), each
  [N, T, X(, Y, Z)], with `x-`/`y-`/`z-coordinate` and `t-coordinate`. Channels follow PDEBench's loader:
  density, pressure, Vx, Vy, Vz.
- `groups`: one group per sample (`0000`, `0001`, ...: 2D diffusion-reaction, shallow water, 1D
  diffusion-sorption), each with `data` [T, X(, Y), C] and `grid/x` (`grid/y`), `grid/t`. Samples are the
  groups in sorted name order, as PDEBench sorts them.

Default test split, as PDEBench: `tensor` and `cfd` files give their first 10% of samples to the test set
(`FNODatasetSingle`: `data[:int(N * test_ratio)]`), `groups` files their last 10% (`FNODatasetMult`:
`keys[int(N * (1 - test_ratio)):]`).

As a sink (`write_dataset`, `dynaforge convert DIR --to pdebench`) it writes one file in the `tensor` layout
(1D, one channel, one grid) or in per-sample groups, its samples ordered so that PDEBench's loader finds the
same test split.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

import h5py
import numpy as np

from dynaforge.store.foreign import (
    ForeignFormat,
    ForeignLayout,
    SinkInput,
    check_real_valued,
    identical_rows,
    per_sample,
    sink_name,
    string_list,
)
from dynaforge.store.format import AXIS_NAMES, DatasetError, SplitArrays

CFD_FIELDS = ("density", "pressure", "Vx", "Vy", "Vz")
"""The compressible-flow fields, in the channel order of PDEBench's loader."""
COORDINATES = {"x": "x-coordinate", "y": "y-coordinate", "z": "z-coordinate"}
TIME = "t-coordinate"
PARAMS, PARAM_NAMES, CHANNEL_NAMES = "params", "param_names", "channel_names"
"""Where a dynaforge export keeps each sample's parameters: a `params` [N, P] dataset (`tensor` files) or
attribute of each sample group, names in a `param_names` attribute beside it; and the channel names in the
file's `channel_names` attribute. PDEBench's loaders never read them."""


def recognises(h5: h5py.File) -> bool:
    return "tensor" in h5 or "density" in h5 or bool(sample_groups(h5))


def sample_groups(h5: h5py.File) -> list[str]:
    """Names of the per-sample groups (those holding `data`), sorted."""
    return sorted(k for k in h5 if isinstance(h5[k], h5py.Group) and "data" in h5[k])


def frame_times(times: np.ndarray | None, frames: int, where: str) -> np.ndarray:
    """The frames' times: the first `frames` of `times` (PDEBench stores T + 1), or 0, 1, ... if absent."""
    if times is None:
        return np.arange(frames, dtype=np.float64)
    times = np.asarray(times, dtype=np.float64).ravel()
    if len(times) not in (frames, frames + 1):
        raise DatasetError(
            f"{where} has {len(times)} times for {frames} frames (expected {frames} or {frames + 1})"
        )
    return times[:frames]


def axis_coordinates(
    found: Mapping[str, np.ndarray | None], space: Sequence[int], where: str
) -> dict[str, np.ndarray]:
    """Coordinates per axis; an axis without any gets j / n (the unit interval, left end included)."""
    coords = {}
    for axis, n in zip(AXIS_NAMES, space):
        values = found.get(axis)
        if values is None:
            coords[axis] = np.arange(n, dtype=np.float64) / n
            continue
        values = np.asarray(values, dtype=np.float64).ravel()
        if len(values) != n:
            raise DatasetError(f"{where}: {len(values)} {axis} coordinates for {n} grid points")
        coords[axis] = values
    return coords


def optional(group: h5py.Group, name: str) -> np.ndarray | None:
    return group[name][...] if name in group else None


def describe(h5: h5py.File, stem: str) -> ForeignLayout:
    if "tensor" in h5:
        return describe_arrays(h5, stem, "tensor", ("tensor",))
    if "density" in h5:
        return describe_arrays(h5, stem, "cfd", tuple(n for n in CFD_FIELDS if n in h5))
    groups = sample_groups(h5)
    if groups:
        return describe_groups(h5, stem, groups)
    raise DatasetError(
        f"{h5.filename} is not a PDEBench file: it has no `tensor`, no `density`/`Vx`/... fields and no "
        f"per-sample groups with `data` (found: {sorted(h5)[:10]})"
    )


def describe_arrays(h5: h5py.File, stem: str, layout: str, names: tuple[str, ...]) -> ForeignLayout:
    shape = h5[names[0]].shape
    if len(shape) < 3:
        raise DatasetError(f"{h5.filename}: `{names[0]}` is {shape}, expected [samples, time, x(, y, z)]")
    for name in names:
        check_real_valued(h5[name])
        if h5[name].shape != shape:
            raise DatasetError(f"{h5.filename}: `{name}` is {h5[name].shape} but `{names[0]}` is {shape}")
    space = tuple(int(n) for n in shape[2:])
    n = int(shape[0])
    found = {axis: optional(h5, key) for axis, key in COORDINATES.items()}
    coords = axis_coordinates(found, space, h5.filename)
    stored = h5.get(PARAMS)
    param_names, params = (
        stored_parameters(h5, None, n) if stored is None else stored_parameters(stored, stored[...], n)
    )
    return ForeignLayout(
        format="pdebench",
        layout=layout,
        name=stem,
        n_samples=n,
        n_frames=int(shape[1]),
        space=space,
        channel_names=(stored_channel_names(h5, 1) or ("u",)) if layout == "tensor" else names,
        time=frame_times(optional(h5, TIME), int(shape[1]), f"{h5.filename}:{TIME}"),
        coords={axis: per_sample(c, n, f"{h5.filename}:{axis}") for axis, c in coords.items()},
        param_names=param_names,
        params=params,
        test_first=True,
        details={"datasets": list(names)},
    )


def describe_groups(h5: h5py.File, stem: str, groups: list[str]) -> ForeignLayout:
    first = h5[groups[0]]
    check_real_valued(first["data"])
    shape = first["data"].shape  # (T, *space, C)
    if len(shape) < 3:
        raise DatasetError(f"{h5.filename}: `{groups[0]}/data` is {shape}, expected [time, x(, y), channels]")
    space = tuple(int(n) for n in shape[1:-1])
    grid = first.get("grid")
    coords = {axis: np.stack(c) for axis, c in group_coordinates(h5, groups, space).items()}
    rows = [h5[key].attrs[PARAMS] for key in groups] if PARAMS in first.attrs else None
    param_names, params = stored_parameters(first, rows, len(groups))
    channels = int(shape[-1])
    return ForeignLayout(
        format="pdebench",
        layout="groups",
        name=stem,
        n_samples=len(groups),
        n_frames=int(shape[0]),
        space=space,
        channel_names=stored_channel_names(h5, channels)
        or (("u",) if channels == 1 else tuple(f"u{c}" for c in range(channels))),
        time=frame_times(
            optional(grid, "t") if grid is not None else None,
            int(shape[0]),
            f"{h5.filename}:{groups[0]}/grid/t",
        ),
        coords=coords,
        param_names=param_names,
        params=params,
        test_first=False,
        details={"groups": [groups[0], groups[-1]], "group_order": "sorted by name"},
    )


def stored_channel_names(h5: h5py.File, channels: int) -> tuple[str, ...]:
    """The channel names a dynaforge export recorded (PDEBench files have none: empty)."""
    names = tuple(string_list(h5.attrs.get(CHANNEL_NAMES)))
    return names if len(names) == channels else ()


def group_coordinates(h5: h5py.File, groups: list[str], space: Sequence[int]) -> dict[str, list[np.ndarray]]:
    """Each sample group's grid coordinates (`NNNN/grid/x`, ...), axis -> one array per group."""
    coords: dict[str, list[np.ndarray]] = {}
    for key in groups:
        grid = h5[key].get("grid")
        found = {axis: optional(grid, axis) if grid is not None else None for axis in COORDINATES}
        for axis, values in axis_coordinates(found, space, f"{h5.filename}:{key}").items():
            coords.setdefault(axis, []).append(values)
    return coords


def stored_parameters(
    holder: h5py.Group | h5py.Dataset, rows: np.ndarray | list[np.ndarray] | None, n_samples: int
) -> tuple[tuple[str, ...], np.ndarray]:
    """Per-sample parameters a dynaforge export stored beside PDEBench's arrays (PDEBench itself names its
    parameters in the file name only): names in `holder`'s `param_names` attribute, values `rows`."""
    if rows is None:
        return (), np.zeros((n_samples, 0), dtype=np.float64)
    names = tuple(string_list(holder.attrs.get(PARAM_NAMES)))
    values = np.asarray(rows, dtype=np.float64).reshape(n_samples, len(names))
    return names, values


def read(h5: h5py.File, layout: ForeignLayout, start: int, stop: int) -> np.ndarray:
    """Samples [start, stop) as (n, T, *space, C) float32."""
    if layout.layout == "tensor":
        return np.asarray(h5["tensor"][start:stop], dtype=np.float32)[..., None]
    if layout.layout == "cfd":
        return np.stack(
            [np.asarray(h5[name][start:stop], dtype=np.float32) for name in layout.channel_names], axis=-1
        )
    groups = sample_groups(h5)[start:stop]
    expected = (layout.n_frames, *layout.space, len(layout.channel_names))
    blocks = []
    for key in groups:
        data = h5[key]["data"]
        if data.shape != expected:
            raise DatasetError(
                f"{h5.filename}: `{key}/data` is {data.shape}, the first sample's is {expected}"
            )
        blocks.append(np.asarray(data[...], dtype=np.float32))
    return np.stack(blocks) if blocks else np.zeros((0, *expected), dtype=np.float32)


# ---- PDEBench as a sink: `dynaforge convert DIR --to pdebench` -----------------------------------------


def write_dataset(
    dataset: SinkInput, out: Path, on_samples: Callable[[int], object]
) -> tuple[list[str], str]:
    """The dataset as one PDEBench file `NAME.hdf5` holding every split, in the order PDEBench's loader splits
    it: a 1D one-channel dataset on one grid in the `tensor` layout (`FNODatasetSingle`; test, val, train),
    anything else in per-sample groups (`FNODatasetMult`; train, val, test)."""
    sizes = dataset.split_sizes
    order = tensor_order(dataset)
    layout = "tensor" if order else "groups"
    order = order or ("train", "val", "test")
    path = out / f"{sink_name(dataset.system)}.hdf5"
    with h5py.File(path, "w") as h5:
        h5.attrs[CHANNEL_NAMES] = list(dataset.channel_names)
        start = 0
        for split in order:
            if sizes[split] == 0:
                continue
            arrays = dataset.read_split(split)
            if layout == "tensor":
                write_tensor_rows(h5, arrays, start, sum(sizes.values()))
            else:
                write_group_rows(h5, arrays, start, sum(sizes.values()))
            start += len(arrays.fields)
            on_samples(len(arrays.fields))
    counts = ",".join(str(sizes[split]) for split in ("train", "val", "test"))
    test_ratio = sizes["test"] / max(sum(sizes.values()), 1)
    return [path.name], (
        f"{layout} layout; PDEBench's loader takes its test split with test_ratio={test_ratio:g}; read it back "
        f"with `dynaforge convert {{out}}/{path.name} --out DIR --splits {counts}`"
    )


def tensor_order(dataset: SinkInput) -> tuple[str, ...] | None:
    """The split order of a `tensor` file (test first, as FNODatasetSingle) when the dataset fits one: 1D, one
    channel, every sample on the same grid; else None (per-sample groups)."""
    if len(dataset.axis_names) != 1 or len(dataset.channel_names) != 1:
        return None
    grids = [dataset.read_split(s).coords["x"] for s in ("test", "val", "train") if dataset.split_sizes[s]]
    first = grids[0][0]
    if all(identical_rows(np.concatenate([first[None], g])) for g in grids):
        return ("test", "val", "train")
    return None


def write_tensor_rows(h5: h5py.File, arrays: SplitArrays, start: int, total: int) -> None:
    """Samples [start, start + n) of a `tensor` file [N, T, X], its coordinates and each sample's parameters."""
    n, frames = len(arrays.fields), arrays.fields.shape[1]
    if "tensor" not in h5:
        h5.create_dataset("tensor", shape=(total, *arrays.fields.shape[1:-1]), dtype=np.float32)
        h5.create_dataset(COORDINATES["x"], data=arrays.coords["x"][0])
        h5.create_dataset(TIME, data=stored_times(arrays.time, frames))
        h5.create_dataset(PARAMS, shape=(total, len(arrays.param_names)), dtype=np.float64)
        h5[PARAMS].attrs[PARAM_NAMES] = list(arrays.param_names)
    h5["tensor"][start : start + n] = arrays.fields[..., 0]
    h5[PARAMS][start : start + n] = arrays.params


def stored_times(time: np.ndarray, frames: int) -> np.ndarray:
    """PDEBench's `t-coordinate`: the frames' times and one more (it stores T + 1), spaced as the last two."""
    if frames < 2:
        return np.asarray(time, dtype=np.float64)
    return np.append(time, time[-1] + (time[-1] - time[-2]))


def write_group_rows(h5: h5py.File, arrays: SplitArrays, start: int, total: int) -> None:
    """Samples as groups `0000`, `0001`, ... (zero-padded so that their sorted order is the sample order),
    each with `data` [T, *space, C], `grid/x` (`grid/y`, `grid/z`), `grid/t` and its parameters."""
    width = max(4, len(str(total - 1)))
    for row, sample in enumerate(arrays.fields):
        group = h5.create_group(f"{start + row:0{width}d}")
        group.create_dataset("data", data=sample)
        for axis, coords in arrays.coords.items():
            group.create_dataset(f"grid/{axis}", data=coords[row])
        group.create_dataset("grid/t", data=arrays.time)
        group.attrs[PARAMS] = arrays.params[row]
        group.attrs[PARAM_NAMES] = list(arrays.param_names)


PDEBENCH = ForeignFormat(recognises=recognises, describe=describe, read=read, write=write_dataset)


# ---- tiny files in PDEBench's layouts, for tests (no downloads) ----------------------------------------


def write_tensor_file(
    path: str | Path, fields: np.ndarray, x: np.ndarray, t: np.ndarray, **coords: np.ndarray
) -> None:
    """A `tensor` file: fields [N, T, X(, Y)], `x-coordinate`, `t-coordinate` (give T + 1 times, as PDEBench),
    and `y=...` for 2D."""
    with h5py.File(path, "w") as h5:
        h5.create_dataset("tensor", data=np.asarray(fields, dtype=np.float32))
        h5.create_dataset("x-coordinate", data=np.asarray(x, dtype=np.float32))
        for axis, values in coords.items():
            h5.create_dataset(COORDINATES[axis], data=np.asarray(values, dtype=np.float32))
        h5.create_dataset(TIME, data=np.asarray(t, dtype=np.float32))


def write_cfd_file(
    path: str | Path, fields: Mapping[str, np.ndarray], t: np.ndarray, **coords: np.ndarray
) -> None:
    """A compressible-flow file: one dataset per field name (`density`, `Vx`, ...), coordinates by axis."""
    with h5py.File(path, "w") as h5:
        for name, values in fields.items():
            h5.create_dataset(name, data=np.asarray(values, dtype=np.float32))
        for axis, values in coords.items():
            h5.create_dataset(COORDINATES[axis], data=np.asarray(values, dtype=np.float32))
        h5.create_dataset(TIME, data=np.asarray(t, dtype=np.float32))


def write_groups_file(path: str | Path, data: np.ndarray, t: np.ndarray, **grid: np.ndarray) -> None:
    """A per-sample-group file: data [N, T, *space, C] -> groups `0000/data` [T, *space, C], `grid/x`, ...,
    `grid/t`."""
    with h5py.File(path, "w") as h5:
        for index, sample in enumerate(np.asarray(data, dtype=np.float32)):
            group = h5.create_group(f"{index:04d}")
            group.create_dataset("data", data=sample)
            for axis, values in grid.items():
                group.create_dataset(f"grid/{axis}", data=np.asarray(values, dtype=np.float32))
            group.create_dataset("grid/t", data=np.asarray(t, dtype=np.float32))
