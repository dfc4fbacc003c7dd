"""The Well HDF5 files (Ohana et al. 2024; `docs/data_format.md` of PolymathicAI/the_well): reader and a
tiny writer.

A file holds `n_trajectories` trajectories on a uniform grid (attributes `n_spatial_dims`,
`n_trajectories`, `dataset_name`, `grid_type`, `simulation_parameters` with one attribute per parameter):

- `dimensions`: `time` [T] and one coordinate dataset per name in its `spatial_dims` attribute;
- `t0_fields`, `t1_fields`, `t2_fields`: scalar [N, T, *space], vector [N, T, *space, D] and tensor
  [N, T, *space, D, D] fields, each with `time_varying`, `sample_varying` and `dim_varying` attributes (a field
  that does not vary along an axis omits it);
- `boundary_conditions`: one group per condition (`bc_type`, `associated_dims`, `mask`);
- `scalars`: non-spatial quantities.

dynaforge's channels are the time-varying fields, t0 first, then each vector's components, then each
tensor's, in `field_names` order (as The Well's dataset stacks them); a vector `v` gives channels `v_x`,
`v_y`, a tensor `s` gives `s_xx`, `s_xy`, ... Fields that do not vary in time (The Well's constant fields)
are not channels: their names are kept in the manifest. The scalars that do not vary in time (per
trajectory where sample-varying), then the simulation parameters not among them, become the samples'
parameters; a sample-varying grid is kept per trajectory. A file is one split in The Well; read directly or
converted it is cut into train, val and test in trajectory order (test last).

As a sink (`write_dataset`, `dynaforge convert DIR --to the_well`) it writes a dataset folder in The Well's
layout: `data/{train,valid,test}/NAME.hdf5` and `stats.yaml`, each channel a scalar field.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import yaml

from dynaforge.store.foreign import (
    ForeignFormat,
    ForeignLayout,
    SinkInput,
    check_real_valued,
    decode,
    identical_rows,
    per_sample,
    sink_name,
    string_list,
)
from dynaforge.store.format import AXIS_NAMES, DatasetError, SplitArrays

FIELD_GROUPS = ("t0_fields", "t1_fields", "t2_fields")


def recognises(h5: h5py.File) -> bool:
    return "dimensions" in h5 and any(group in h5 for group in FIELD_GROUPS)


def field_names(group: h5py.Group) -> list[str]:
    """The group's fields: those its `field_names` attribute lists (in that order), then any others."""
    listed = [name for name in string_list(group.attrs.get("field_names")) if name in group]
    return listed + sorted(name for name in group if name not in listed)


def flag(dataset: h5py.Dataset, name: str) -> bool:
    return bool(dataset.attrs.get(name, True))


def field_channels(name: str, order: int, spatial: Sequence[str], trailing: Sequence[int]) -> list[str]:
    """Channel names of a field of tensor order 0, 1 or 2: `p`; `v_x`, `v_y`; `s_xx`, `s_xy`, ..."""
    if order == 0:
        return [name]
    count = math.prod(trailing)
    components = ["".join(c) for c in itertools.product(spatial, repeat=order)]
    if len(components) != count:
        components = [str(i) for i in range(count)]
    return [f"{name}_{c}" for c in components]


def describe(h5: h5py.File, stem: str) -> ForeignLayout:
    dimensions = h5["dimensions"]
    spatial = string_list(dimensions.attrs.get("spatial_dims"))
    n_dims = int(h5.attrs.get("n_spatial_dims", len(spatial)))
    if len(spatial) != n_dims or any(name not in dimensions for name in spatial):
        raise DatasetError(
            f"{h5.filename}: `dimensions` lists spatial dims {spatial} but n_spatial_dims is {n_dims} "
            f"(or a coordinate dataset is missing; found {sorted(dimensions)})"
        )
    if n_dims > len(AXIS_NAMES):
        raise DatasetError(f"{h5.filename}: {n_dims} spatial dimensions; dynaforge reads up to 3")
    coords_raw = [np.asarray(dimensions[name][...], dtype=np.float64) for name in spatial]
    space = tuple(c.shape[-1] for c in coords_raw)  # (points,) or, sample-varying, (trajectories, points)
    time = np.asarray(dimensions["time"][...], dtype=np.float64)
    time = time[0] if time.ndim == 2 else time
    channels, fields, constant = [], [], []
    for order, group_name in enumerate(FIELD_GROUPS):
        if group_name not in h5:
            continue
        group = h5[group_name]
        for name in field_names(group):
            dataset = group[name]
            if not flag(dataset, "time_varying"):
                constant.append(f"{group_name}/{name}")
                continue
            check_real_valued(dataset)
            varying = np.asarray(dataset.attrs.get("dim_varying", [True] * n_dims), dtype=bool).ravel()
            leading = int(flag(dataset, "sample_varying")) + 1 + int(varying.sum())
            trailing = dataset.shape[leading:]
            channels.extend(field_channels(name, order, spatial, trailing))
            fields.append(f"{group_name}/{name}")
    if not channels:
        raise DatasetError(f"{h5.filename}: no time-varying field in {', '.join(FIELD_GROUPS)}")
    n = int(h5.attrs.get("n_trajectories", h5[fields[0]].shape[0]))
    param_names, params = parameters(h5, n)
    return ForeignLayout(
        format="the_well",
        layout="the_well",
        name=decode(h5.attrs.get("dataset_name", stem)),
        n_samples=n,
        n_frames=len(time),
        space=space,
        channel_names=tuple(channels),
        time=time,
        coords={
            axis: per_sample(c, n, f"{h5.filename}:dimensions/{name}")
            for axis, name, c in zip(AXIS_NAMES, spatial, coords_raw)
        },
        param_names=param_names,
        params=params,
        test_first=False,
        details={
            "spatial_dims": spatial,
            "grid_type": decode(h5.attrs.get("grid_type", "cartesian")),
            "fields": fields,
            "constant_fields": constant,
            "boundary_conditions": boundary_conditions(h5),
            "scalars": field_names(h5["scalars"]) if "scalars" in h5 else [],
        },
    )


def parameters(h5: h5py.File, n: int) -> tuple[tuple[str, ...], np.ndarray]:
    """Every trajectory's parameters, (names, (n, P) float64): the `scalars` that do not vary in time (one
    value per file, or per trajectory when sample-varying), in `field_names` order, then the numeric
    `simulation_parameters` attributes not among them."""
    columns: dict[str, np.ndarray] = {}
    scalars = h5.get("scalars")
    for name in field_names(scalars) if scalars is not None else []:
        dataset = scalars[name]
        if flag(dataset, "time_varying") or dataset.dtype.kind not in "fiu":
            continue
        values = np.asarray(dataset[...], dtype=np.float64).ravel()
        if flag(dataset, "sample_varying") and values.size == n:
            columns[name] = values
        elif values.size == 1:
            columns[name] = np.full(n, values[0])
    for name in string_list(h5.attrs.get("simulation_parameters")):
        value = np.asarray(h5.attrs.get(name, np.zeros(0)))
        if name not in columns and value.size == 1 and value.dtype.kind in "fiu":
            columns[name] = np.full(n, float(value.ravel()[0]))
    params = np.stack(list(columns.values()), axis=1) if columns else np.zeros((n, 0), dtype=np.float64)
    return tuple(columns), params


def boundary_conditions(h5: h5py.File) -> dict[str, Any]:
    if "boundary_conditions" not in h5:
        return {}
    return {
        name: {
            "bc_type": decode(group.attrs.get("bc_type", "")),
            "associated_dims": string_list(group.attrs.get("associated_dims")),
        }
        for name, group in h5["boundary_conditions"].items()
    }


def read(h5: h5py.File, layout: ForeignLayout, start: int, stop: int) -> np.ndarray:
    """Trajectories [start, stop) as (n, T, *space, C) float32."""
    n = stop - start
    blocks = []
    for path in layout.details["fields"]:
        dataset = h5[path]
        values = dataset[start:stop] if flag(dataset, "sample_varying") else dataset[...][None]
        varying = np.asarray(dataset.attrs.get("dim_varying", [True] * len(layout.space)), dtype=bool).ravel()
        for axis, present in enumerate(varying):
            if not present:  # a field constant along this axis omits it: broadcast it back
                values = np.expand_dims(values, 2 + axis)
        trailing = values.shape[2 + len(layout.space) :]
        values = np.broadcast_to(values, (n, layout.n_frames, *layout.space, *trailing))
        blocks.append(np.asarray(values, dtype=np.float32).reshape(n, layout.n_frames, *layout.space, -1))
    return np.concatenate(blocks, axis=-1)


# ---- The Well as a sink: `dynaforge convert DIR --to the_well` ---------------------------------------

SPLIT_FOLDERS = {"train": "train", "val": "valid", "test": "test"}
"""dynaforge's split -> The Well's split folder (`data/train`, `data/valid`, `data/test`)."""
STATISTICS = "stats.yaml"


def write_dataset(
    dataset: SinkInput, out: Path, on_samples: Callable[[int], object]
) -> tuple[list[str], str]:
    """The dataset as one The Well dataset folder: `data/{train,valid,test}/NAME.hdf5` (a split without
    samples gets no file) and `stats.yaml` (the normalisation statistics WellDataset reads)."""
    name = sink_name(dataset.system)
    written, statistics = [], {}
    for split, folder in SPLIT_FOLDERS.items():
        if dataset.split_sizes[split] == 0:
            continue
        arrays = dataset.read_split(split)
        path = out / "data" / folder / f"{name}.hdf5"
        path.parent.mkdir(parents=True, exist_ok=True)
        write_split_file(path, dataset, name, arrays)
        written.append(str(path.relative_to(out)))
        if split == "train":
            statistics = well_statistics(dataset, arrays.fields)
        on_samples(len(arrays.fields))
    (out / STATISTICS).write_text(yaml.safe_dump(statistics, sort_keys=False))
    written.append(STATISTICS)
    return written, (
        "read it with The Well's `WellDataset(path='{out}', well_split_name='train', "
        f"normalization_path='{STATISTICS}')`, or back into dynaforge with `dynaforge convert` of a split's file"
    )


def write_split_file(path: Path, dataset: SinkInput, name: str, arrays: SplitArrays) -> None:
    """One split's samples in The Well's layout: each channel a time-varying scalar field (`t0_fields`), each
    parameter a scalar (also a simulation parameter where it is the same for every trajectory), the grid in
    `dimensions` (sample-varying where the samples' grids differ), one boundary condition per known axis."""
    n, axes = len(arrays.fields), dataset.axis_names
    constant = [c for c, _ in enumerate(arrays.param_names) if identical_rows(arrays.params[:, c])]
    with h5py.File(path, "w") as h5:
        h5.attrs["dataset_name"] = name
        h5.attrs["grid_type"] = "cartesian"
        h5.attrs["n_spatial_dims"] = len(axes)
        h5.attrs["n_trajectories"] = n
        h5.attrs["simulation_parameters"] = [arrays.param_names[c] for c in constant]
        for c in constant:
            h5.attrs[arrays.param_names[c]] = float(arrays.params[0, c])
        dimensions = h5.create_group("dimensions")
        dimensions.attrs["spatial_dims"] = list(axes)
        write_varying(dimensions, "time", arrays.time, sample_varying=False, time_varying=True)
        for axis in axes:
            coords = arrays.coords[axis]
            shared = identical_rows(coords)
            write_varying(dimensions, axis, coords[0] if shared else coords, not shared, time_varying=False)
        conditions = h5.create_group("boundary_conditions")
        for axis, kind in dataset.boundaries.items():
            condition = conditions.create_group(f"{axis}_{kind.lower()}")
            condition.attrs.update(
                bc_type=kind,
                associated_dims=[axis],
                associated_fields=[],
                sample_varying=False,
                time_varying=False,
            )
            mask = np.zeros(arrays.fields.shape[2 + axes.index(axis)], dtype=bool)
            mask[[0, -1]] = True  # the boundary: the first and last grid point of the axis
            condition.create_dataset("mask", data=mask)
        scalars = h5.create_group("scalars")
        scalars.attrs["field_names"] = list(arrays.param_names)
        for c, parameter in enumerate(arrays.param_names):
            shared = c in constant
            values = np.asarray(arrays.params[0, c]) if shared else arrays.params[:, c]  # () or (n,)
            write_varying(scalars, parameter, values, sample_varying=not shared, time_varying=False)
        fields = h5.create_group("t0_fields")
        fields.attrs["field_names"] = list(dataset.channel_names)
        for channel, field in enumerate(dataset.channel_names):
            values = arrays.fields[..., channel]  # (n, T, *space)
            write_varying(
                fields, field, values, sample_varying=True, time_varying=True, chunks=(1, *values.shape[1:])
            )
            fields[field].attrs["dim_varying"] = [True] * len(axes)
        for group in ("t1_fields", "t2_fields"):  # dynaforge's channels are scalars; the groups are required
            h5.create_group(group).attrs["field_names"] = []


def write_varying(
    group: h5py.Group,
    name: str,
    values: np.ndarray,
    sample_varying: bool,
    time_varying: bool,
    chunks: tuple[int, ...] | None = None,
) -> None:
    """A dataset with The Well's `sample_varying` and `time_varying` flags."""
    group.create_dataset(name, data=values, chunks=chunks)
    group[name].attrs["sample_varying"] = sample_varying
    group[name].attrs["time_varying"] = time_varying


def well_statistics(dataset: SinkInput, train: np.ndarray) -> dict[str, dict[str, float]]:
    """The Well's `stats.yaml`: per field `mean`, `std`, `rms` (dynaforge's train statistics) and the same of
    the differences between consecutive frames (`*_delta`, what WellDataset's delta normalisation uses)."""
    deltas = np.diff(train, axis=1)  # (N, T - 1, *space, C)
    over = tuple(range(train.ndim - 1))
    if deltas.shape[1]:
        delta_mean = deltas.mean(axis=over, dtype=np.float64)
        delta_rms = np.sqrt(np.square(deltas, dtype=np.float64).mean(axis=over))
    else:
        delta_mean = delta_rms = np.zeros(train.shape[-1])
    mean, std = (np.asarray(dataset.stats[key], dtype=np.float64) for key in ("mean", "std"))
    columns = {
        "mean": mean,
        "std": std,
        "rms": np.sqrt(mean**2 + std**2),
        "mean_delta": delta_mean,
        "std_delta": np.sqrt(np.maximum(delta_rms**2 - delta_mean**2, 0.0)),
        "rms_delta": delta_rms,
    }
    return {
        key: {name: float(values[c]) for c, name in enumerate(dataset.channel_names)}
        for key, values in columns.items()
    }


THE_WELL = ForeignFormat(recognises=recognises, describe=describe, read=read, write=write_dataset)


# ---- a tiny file in The Well's layout, for tests (no downloads) ----------------------------------------


def write_well_file(
    path: str | Path,
    fields: Mapping[str, np.ndarray],
    time: np.ndarray,
    coords: Mapping[str, np.ndarray],
    parameters: Mapping[str, float] | None = None,
    constant_fields: Mapping[str, np.ndarray] | None = None,
    bc_type: str = "PERIODIC",
    dataset_name: str = "tiny_well",
) -> None:
    """A file in The Well's format. `fields` maps `t0_fields/name`, `t1_fields/name` or `t2_fields/name` to
    arrays [N, T, *space(, D(, D))]; `constant_fields` the same without T; `coords` axis name -> [n]."""
    parameters = dict(parameters or {})
    spatial = list(coords)
    first = next(iter(fields.values()))
    with h5py.File(path, "w") as h5:
        h5.attrs["dataset_name"] = dataset_name
        h5.attrs["grid_type"] = "cartesian"
        h5.attrs["n_spatial_dims"] = len(spatial)
        h5.attrs["n_trajectories"] = first.shape[0]
        h5.attrs["simulation_parameters"] = list(parameters)
        for name, value in parameters.items():
            h5.attrs[name] = value
        dimensions = h5.create_group("dimensions")
        dimensions.attrs["spatial_dims"] = spatial
        dimensions.create_dataset("time", data=np.asarray(time, dtype=np.float32))
        dimensions["time"].attrs["sample_varying"] = False
        for name, values in coords.items():
            dimensions.create_dataset(name, data=np.asarray(values, dtype=np.float32))
            dimensions[name].attrs["sample_varying"] = False
            dimensions[name].attrs["time_varying"] = False
        conditions = h5.create_group("boundary_conditions")
        for name, values in coords.items():
            condition = conditions.create_group(f"{name}_periodic")
            condition.attrs["associated_dims"] = [name]
            condition.attrs["associated_fields"] = []
            condition.attrs["bc_type"] = bc_type
            condition.attrs["sample_varying"] = False
            condition.attrs["time_varying"] = False
            mask = np.zeros(len(values), dtype=bool)
            mask[[0, -1]] = True
            condition.create_dataset("mask", data=mask)
        scalars = h5.create_group("scalars")
        scalars.attrs["field_names"] = list(parameters)
        for name, value in parameters.items():
            scalars.create_dataset(name, data=np.asarray([value], dtype=np.float32))
            scalars[name].attrs["sample_varying"] = False
            scalars[name].attrs["time_varying"] = False
        for group_name in FIELD_GROUPS:
            group = h5.create_group(group_name)
            names = []
            for key, values in {**fields, **(constant_fields or {})}.items():
                if not key.startswith(f"{group_name}/"):
                    continue
                name = key.split("/", 1)[1]
                names.append(name)
                dataset = group.create_dataset(name, data=np.asarray(values, dtype=np.float32))
                dataset.attrs["dim_varying"] = [True] * len(spatial)
                dataset.attrs["sample_varying"] = True
                dataset.attrs["time_varying"] = key in fields
            group.attrs["field_names"] = names
