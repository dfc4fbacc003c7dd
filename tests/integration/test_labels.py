"""Shards that other tools open: xarray (through h5netcdf) reads `fields` with named dimensions, the stored
grid and times as coordinate values, and units; `split_to_xarray` gives a whole split the same labels."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import h5py
import numpy as np
import pytest

from dynaforge.config import Config, config_from_dict, config_to_dict, load_config
from dynaforge.generate import generate
from dynaforge.store import DatasetFolder, validate_dataset, writer
from dynaforge.store.convert import convert
from dynaforge.store.format import FORMAT_VERSION, sample_sha256
from dynaforge.store.labels import label_shard
from dynaforge.store.pdebench import write_tensor_file
from dynaforge.store.to_xarray import split_to_xarray

from ..conftest import CONFIGS

xarray = pytest.importorskip("xarray")
pytest.importorskip("h5netcdf")

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "main-48c4532" / "dataset"


def tiny(*overrides: str) -> Config:
    """Burgers on 8 points whose domain length differs per sample, so the grid differs per sample too."""
    small = ["dataset.n_train=3", "dataset.n_val=1", "dataset.n_test=1", "dataset.shard_size=2"]
    grid = ["system.resolution=8", "system.steps=6", "system.domain_length={low: 1.0, high: 2.0}"]
    return load_config(CONFIGS / "tiny.yaml", [*small, *grid, *overrides])


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("labels") / "d"
    generate(tiny(), root, progress=False)
    return root


def open_shard(path: Path) -> xarray.Dataset:
    return xarray.open_dataset(path, engine="h5netcdf", phony_dims="access")


def test_xarray_reads_a_shard_with_named_dimensions_coordinates_and_units(folder: Path) -> None:
    path = folder / "train" / "shard-00000.h5"
    with open_shard(path) as ds, h5py.File(path, "r") as h5:
        fields = ds["fields"]
        assert fields.dims == ("sample", "time", "x_index", "channel")
        np.testing.assert_array_equal(fields.values, h5["fields"][...])
        np.testing.assert_array_equal(fields["time"].values, h5["time"][...])
        np.testing.assert_array_equal(fields["x"].values, h5["x"][...])  # (sample, x_index), per sample
        assert fields["x"].dims == ("sample", "x_index")
        assert not np.array_equal(h5["x"][0], h5["x"][1])  # two domain lengths: a 2-D coordinate
        np.testing.assert_array_equal(fields["x_index"].values, np.arange(8))
        np.testing.assert_array_equal(fields["index"].values, h5["index"][...])
        assert list(fields["channel"].values) == ["u"]
        assert list(ds["params"]["param_names"].values) == ["domain_length", "viscosity"]
        np.testing.assert_array_equal(ds["params"].values, h5["params"][...])
        assert ds["seeds"].dims == ("sample",)
        assert fields.attrs["units"] == "1" and "burgers" in fields.attrs["long_name"]
        assert ds["time"].attrs["units"] == "1" and ds["x"].attrs["units"] == "1"
        assert ds.attrs["format_version"] == FORMAT_VERSION == 2


def test_labels_leave_the_sample_hashes_and_the_validation_as_they_were(folder: Path) -> None:
    assert validate_dataset(folder).ok
    dataset = DatasetFolder(folder)
    for record in dataset.split_records("train"):
        with h5py.File(folder / record["file"], "r") as h5:
            hashes = [sample_sha256(f, p) for f, p in zip(h5["fields"][...], h5["params"][...], strict=True)]
        assert hashes == record["sample_sha256"]


def test_a_2d_shard_names_both_grid_axes(tmp_path: Path) -> None:
    root = tmp_path / "d2"
    data = config_to_dict(tiny())
    data["system"] = {"name": "heat", "ndim": 2, "resolution": 8, "domain_length": {"low": 1.0, "high": 2.0}}
    generate(config_from_dict(data), root, progress=False)
    path = root / "val" / "shard-00000.h5"
    with open_shard(path) as ds, h5py.File(path, "r") as h5:
        assert ds["fields"].dims == ("sample", "time", "x_index", "y_index", "channel")
        np.testing.assert_array_equal(ds["fields"]["y"].values, h5["y"][...])
        np.testing.assert_array_equal(ds["fields"].values, h5["fields"][...])


def test_a_systems_extras_get_the_sample_dimension_and_their_own_inner_ones(tmp_path: Path) -> None:
    random_cnn = [
        "system.name=random_cnn",
        "system.resolution=8",
        "system.steps=2",
        "system.space.depth.high=2",
        "system.space.width_cap.choices={'32': 1.0}",
        "system.compile=false",
        "system.features=true",
    ]
    sizes = [f"dataset.{key}=3" for key in ("n_train", "n_val", "n_test", "batch_size", "shard_size")]
    generate(load_config(None, [*random_cnn, *sizes]), tmp_path / "r", progress=False)
    path = tmp_path / "r" / "train" / "shard-00000.h5"
    with open_shard(path) as ds, h5py.File(path, "r") as h5:
        assert ds["fields"].dims == ("sample", "time", "x_index", "y_index", "channel")
        assert ds["operator"].dims == ("sample",)
        assert ds["features"].dims == ("sample", "features_dim1")
        np.testing.assert_array_equal(ds["features"].values, h5["features"][...])


def test_split_to_xarray_holds_the_split_with_its_coordinates_and_parameters(folder: Path) -> None:
    arrays = DatasetFolder(folder).read_split("train")
    ds = split_to_xarray(folder, "train")
    assert ds["fields"].dims == ("sample", "time", "x_index", "channel")
    np.testing.assert_array_equal(ds["fields"].values, arrays.fields)
    np.testing.assert_array_equal(ds["x"].values, arrays.coords["x"])
    np.testing.assert_array_equal(ds["time"].values, arrays.time)
    np.testing.assert_array_equal(ds["index"].values, np.arange(3))
    np.testing.assert_array_equal(ds["viscosity"].values, arrays.params[:, 1])
    np.testing.assert_array_equal(ds["domain_length"].values, arrays.params[:, 0])
    assert ds["fields"].attrs["units"] == "1" and ds.attrs["split"] == "train"


def test_an_old_unlabelled_folder_still_reads_and_converts_to_xarray() -> None:
    assert validate_dataset(OLD).ok
    with h5py.File(OLD / "train" / "shard-00000.h5", "r") as h5:
        assert h5.attrs["format_version"] == 1 and "sample" not in h5
    ds = split_to_xarray(OLD, "train")
    assert ds["fields"].shape == (8, 11, 64, 1)
    assert ds["fields"].dims == ("sample", "time", "x_index", "channel")


def test_a_converted_pdebench_folder_is_labelled_without_claiming_units(tmp_path: Path) -> None:
    source = tmp_path / "1D_Advection_Sols_beta0.5.hdf5"
    x = (np.arange(16) + 0.5) / 16
    t = np.linspace(0.0, 1.0, 6)
    fields = np.sin(2 * np.pi * (x[None, None, :] - t[None, :5, None]) + np.arange(10)[:, None, None])
    write_tensor_file(source, fields, x, t)
    convert(source, tmp_path / "c", fractions=(0.6, 0.2, 0.2))
    assert validate_dataset(tmp_path / "c").ok
    path = tmp_path / "c" / "train" / "shard-00000.h5"
    with open_shard(path) as ds, h5py.File(path, "r") as h5:
        assert ds["fields"].dims == ("sample", "time", "x_index", "channel")
        np.testing.assert_array_equal(ds["fields"]["x"].values, h5["x"][...])
        np.testing.assert_array_equal(ds["time"].values, h5["time"][...])
        np.testing.assert_array_equal(ds["source_index"].values, h5["source_index"][...])
        assert "units" not in ds["fields"].attrs and "units" not in ds["time"].attrs


def test_inspect_reports_a_version_2_shard_missing_a_label(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def label_but_forget_x(h5: h5py.File, *args: Any) -> None:
        label_shard(h5, *args)
        h5["fields"].dims[2].detach_scale(h5["x_index"])

    monkeypatch.setattr(writer, "label_shard", label_but_forget_x)
    generate(tiny(), tmp_path / "d", progress=False)
    result = validate_dataset(tmp_path / "d")
    assert not result.ok
    assert all("fields axes [2] have no dimension scale" in error for error in result.errors), result.errors


def test_split_to_xarray_names_the_extra_when_xarray_is_missing(
    folder: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "xarray", None)
    with pytest.raises(ImportError, match=r"pip install 'dynaforge\[xarray\]'"):
        split_to_xarray(folder, "train")


def test_units_are_claimed_only_for_systems_that_know_them() -> None:
    from dynaforge.store.interop import FORMATS
    from dynaforge.store.labels import FOREIGN_SOURCES, units_of

    assert set(FOREIGN_SOURCES) == set(FORMATS)
    assert units_of("pdebench:1D_Burgers").system == "units not recorded by the source file"
    assert units_of("the_well:shear_flow").system == "units not recorded by the source file"
    assert units_of("mypackage.pdes:SwiftHohenberg").system == "units not declared by the system's code"
    assert units_of("nbody").system == "N-body units (G = 1)"
    assert units_of("burgers").system == "nondimensional"
