"""Labels that let netCDF tools read a shard as named arrays (docs/format.md, "Labels: opening a shard with
xarray"): HDF5 dimension scales, and `units` / `long_name` attributes in the CF style.

`fields` has the dimensions `sample`, `time`, one grid-index dimension per spatial axis (`x_index`, ...)
and `channel`. The physical grid stays where format version 1 put it, in `x` (`y`, `z`) of shape
(sample, points): a sample's domain length may differ from its neighbours', so the grid is a 2-D auxiliary
coordinate (CF `coordinates` attribute), not a dimension's values. The dimension scales are `time` (the
frame times), `x_index` (grid indices 0..n-1), `channel` (the channel names) and `param_names`; `sample`
is a dimension without values (netCDF's "dimension but not a variable"), the split-local sample index
being the auxiliary coordinate `index`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import h5py
import numpy as np

SAMPLE = "sample"
CHANNEL = "channel"
PARAMETER = "param_names"
NOT_A_VARIABLE = "This is a netCDF dimension but not a netCDF variable.%10d"
"""The NAME netCDF-4 gives a dimension scale that holds no values (h5netcdf reads it so)."""
DIMENSIONLESS = "1"
"""CF's unit of a dimensionless quantity: the generated systems are nondimensional (N-body: G = 1)."""


class Units(NamedTuple):
    """The units of a dataset's time, grid and fields, and the words that say which system of units."""

    time: str | None
    space: str | None
    fields: str | None
    system: str
    """e.g. `nondimensional`, `N-body units (G = 1)`, `units not recorded by the source file`."""


FOREIGN_SOURCES = ("pdebench", "the_well")
"""The prefixes of converted datasets' system names (`pdebench:NAME`): the keys of `store.interop.FORMATS`."""


def units_of(system: str) -> Units:
    """The units of a dataset made by `system` (`burgers`, `nbody`, `pdebench:NAME`, ...).

    The generated PDEs and random CNN operators are nondimensional; the N-body system uses units with
    G = 1. PDEBench and The Well files do not record units, so none are claimed for converted data; nor for
    a user's own system (`package.module:Class`), whose code declares none."""
    source, named, _ = system.partition(":")
    if named and source in FOREIGN_SOURCES:
        return Units(None, None, None, "units not recorded by the source file")
    if named:
        return Units(None, None, None, "units not declared by the system's code")
    if system == "nbody":
        return Units(DIMENSIONLESS, DIMENSIONLESS, DIMENSIONLESS, "N-body units (G = 1)")
    return Units(DIMENSIONLESS, DIMENSIONLESS, DIMENSIONLESS, "nondimensional")


def grid_dimension(axis: str) -> str:
    """The dimension of grid indices along `axis` (`x` -> `x_index`)."""
    return f"{axis}_index"


def variable_attributes(system: str, axes: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """`units` and `long_name` of every labelled variable of a `system` dataset with spatial `axes`; the one
    table that shards and `split_to_xarray` take their attributes from."""
    units = units_of(system)
    table: dict[str, dict[str, Any]] = {
        "fields": {
            "long_name": f"{system} trajectories ({units.system})",
            "units": units.fields,
            "coordinates": " ".join(("index", *axes)),
        },
        "time": {"long_name": f"time of each frame ({units.system})", "units": units.time, "axis": "T"},
        "index": {"long_name": "split-local sample index"},
        CHANNEL: {"long_name": "channel name"},
        PARAMETER: {"long_name": "physical parameter name"},
        "params": {"long_name": "physical parameters per sample"},
        "seeds": {"long_name": "seed of each sample (docs/format.md)"},
        "source_index": {"long_name": "each sample's index in the source file"},
    }
    for axis in axes:
        table[axis] = {
            "long_name": f"{axis} of each grid point, per sample ({units.system})",
            "units": units.space,
        }
        table[grid_dimension(axis)] = {"long_name": f"grid index along {axis}"}
    return {
        name: {key: value for key, value in attrs.items() if value is not None}
        for name, attrs in table.items()
    }


def label_shard(h5: h5py.File, system: str, axes: tuple[str, ...], channel_names: tuple[str, ...]) -> None:
    """Make the dimension scales of a shard whose other datasets are written, attach them, and set the
    attributes of `variable_attributes`. Nothing that is hashed changes: `fields` and `params` keep their
    values (the per-sample SHA-256), and the shard's own SHA-256 is taken after this."""
    fields = h5["fields"]
    n_samples, _, *space, _ = fields.shape
    sample = h5.create_dataset(SAMPLE, shape=(n_samples,), dtype=">f4")
    sample.make_scale(NOT_A_VARIABLE % n_samples)
    h5["time"].make_scale("time")
    h5.create_dataset(CHANNEL, data=np.asarray(channel_names, dtype=h5py.string_dtype()))
    h5[CHANNEL].make_scale(CHANNEL)
    h5[PARAMETER].make_scale(PARAMETER)
    grid = []
    for axis, points in zip(axes, space, strict=True):
        scale = h5.create_dataset(grid_dimension(axis), data=np.arange(points, dtype=np.int64))
        scale.make_scale(grid_dimension(axis))
        grid.append(scale)
    for i, scale in enumerate((sample, h5["time"], *grid, h5[CHANNEL])):
        fields.dims[i].attach_scale(scale)
    h5["params"].dims[1].attach_scale(h5[PARAMETER])
    for axis, scale in zip(axes, grid, strict=True):
        if axis in h5:
            h5[axis].dims[1].attach_scale(scale)
    scales = {SAMPLE, "time", CHANNEL, PARAMETER, *(s.name.lstrip("/") for s in grid)}
    for name, item in list(h5.items()):
        if isinstance(item, h5py.Dataset) and name not in scales and item.shape[:1] == (n_samples,):
            item.dims[0].attach_scale(sample)  # every other dataset is per sample (docs/format.md)
            label_inner_axes(h5, name)
    for name, attrs in variable_attributes(system, axes).items():
        if name in h5:
            h5[name].attrs.update(attrs)
    fields.attrs["coordinates"] = " ".join(name for name in ("index", *axes) if name in h5)


def label_inner_axes(h5: h5py.File, name: str) -> None:
    """Give every still unlabelled axis i of dataset `name` (a system's extras) a dimension of its own,
    `NAME_dimI`, without values: h5netcdf refuses a variable with labelled and unlabelled axes mixed."""
    dataset = h5[name]
    for axis, dim in enumerate(dataset.dims):
        if len(dim) == 0:
            scale = h5.create_dataset(f"{name}_dim{axis}", shape=(dataset.shape[axis],), dtype=">f4")
            scale.make_scale(NOT_A_VARIABLE % dataset.shape[axis])
            dim.attach_scale(scale)


def unlabelled_dimensions(h5: h5py.File) -> list[int]:
    """The axes of a shard's `fields` that have no dimension scale attached (format version 2 labels all)."""
    return [i for i, dim in enumerate(h5["fields"].dims) if len(dim) == 0]
