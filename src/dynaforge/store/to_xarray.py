"""One split of a dataset as an `xarray.Dataset` with the labels a shard carries (docs/format.md, "Labels:
opening a shard with xarray"). xarray is an optional extra: `pip install 'dynaforge[xarray]'`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import h5py
import numpy as np

from dynaforge.store.format import AXIS_NAMES
from dynaforge.store.labels import CHANNEL, SAMPLE, grid_dimension, variable_attributes
from dynaforge.store.reader import DatasetFolder

if TYPE_CHECKING:
    import xarray


def split_to_xarray(folder: str | Path | DatasetFolder, split: str) -> xarray.Dataset:
    """Every sample of `split` (checked as any reader checks it): `fields` on (sample, time, x_index, ...,
    channel) with the coordinates `index`, `time`, the grid indices, the grid `x` (`y`, `z`) per sample and
    the channel names; one variable per physical parameter (a walled system's per-sample boundary values
    among them: `left_value`, `lid_speed`, ...), and `seeds`; attributes `boundary_x` (`_y`, `_z`): each
    axis's boundary type (`DatasetFolder.boundaries`). `folder` may also be a PDEBench or
    The Well file (default splits), as for `DatasetFolder`."""
    try:
        import xarray  # lazy: optional extra (dynaforge[xarray])
    except ImportError as error:
        raise ImportError(
            f"split_to_xarray needs xarray ({error}); install it with `pip install 'dynaforge[xarray]'`"
        ) from None
    dataset = folder if isinstance(folder, DatasetFolder) else DatasetFolder(folder)
    arrays = dataset.read_split(split)
    axes, channel_names = axes_and_channels(dataset, split, arrays.fields.ndim - 3)
    attributes = variable_attributes(dataset.system, axes)
    grid = tuple(grid_dimension(axis) for axis in axes)
    coords: dict[str, tuple] = {
        "index": ((SAMPLE,), np.arange(len(arrays.fields), dtype=np.int64), attributes["index"]),
        "time": (("time",), arrays.time, attributes["time"]),
        CHANNEL: ((CHANNEL,), np.asarray(channel_names, dtype=str), attributes[CHANNEL]),
    }
    for axis, dim, points in zip(axes, grid, arrays.fields.shape[2:-1], strict=True):
        coords[dim] = ((dim,), np.arange(points, dtype=np.int64), attributes[dim])
        if axis in arrays.coords:
            coords[axis] = ((SAMPLE, dim), arrays.coords[axis], attributes[axis])
    field_attributes = {k: v for k, v in attributes["fields"].items() if k != "coordinates"}
    variables: dict[str, tuple] = {
        "fields": ((SAMPLE, "time", *grid, CHANNEL), arrays.fields, field_attributes),
        "seeds": ((SAMPLE,), arrays.seeds, attributes["seeds"]),
    }
    for column, name in enumerate(arrays.param_names):
        key = f"param_{name}" if name in coords or name in variables else name
        variables[key] = ((SAMPLE,), arrays.params[:, column], {"long_name": f"physical parameter {name}"})
    boundaries = dataset.boundaries(axes)
    attrs = {"system": dataset.system, "split": split}
    attrs |= {f"boundary_{axis}": kind for axis, kind in boundaries.items()}  # x: WALL, y: OPEN, ...
    return xarray.Dataset(variables, coords, attrs=attrs)


def axes_and_channels(
    dataset: DatasetFolder, split: str, ndim: int
) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The spatial axis names and channel names of a split, from its first shard (a foreign file: its
    layout)."""
    if dataset.foreign is not None:
        return AXIS_NAMES[:ndim], tuple(dataset.foreign.layout.channel_names)
    with h5py.File(dataset.shard_paths(split)[0], "r") as h5:
        axes = tuple(str(a) for a in h5.attrs.get("axis_names", AXIS_NAMES[:ndim]))
        channels = tuple(str(c) for c in h5.attrs["channel_names"])
    return axes, channels
