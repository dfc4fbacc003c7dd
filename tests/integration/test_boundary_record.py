"""Shards record each sample's boundary conditions (issue 35, item 5): the type of each axis in the shard
(`boundary_types`, The Well's words) and the per-sample values as parameters; xarray shows both, and a
dataset exported to The Well carries them in its `boundary_conditions` group and its scalars, and reads back
with the same types (the source direction keeps The Well's conditions)."""

from __future__ import annotations

from pathlib import Path

import h5py
import numpy as np
import pytest

from dynaforge.config import load_config
from dynaforge.generate import generate
from dynaforge.store import DatasetFolder
from dynaforge.store.convert import export
from dynaforge.store.to_xarray import split_to_xarray

REPO = Path(__file__).resolve().parents[2]
TINY = {
    "cylinder": ["system.resolution=16", "system.spin_up=2", "system.steps=4", "system.save_every=2"],
    "heat_bounded_1d": ["system.steps=40", "system.save_every=20"],
}
SIZES = [
    "dataset.n_train=2",
    "dataset.n_val=1",
    "dataset.n_test=1",
    "dataset.shard_size=2",
    "dataset.batch_size=2",
]
EXPECTED = {"cylinder": {"x": "OPEN", "y": "WALL"}, "heat_bounded_1d": {"x": "WALL"}}
VALUES = {"cylinder": ("centre_x", "radius", "inflow_peak"), "heat_bounded_1d": ("left_value", "right_value")}


@pytest.mark.parametrize("preset", sorted(TINY))
def test_boundary_conditions_are_recorded_shown_in_xarray_and_exported_to_the_well(
    tmp_path: Path, preset: str, one_thread: None
) -> None:
    pytest.importorskip("xarray")
    config = load_config(REPO / "configs" / f"{preset}.yaml", [*TINY[preset], *SIZES])
    generate(config, tmp_path / "data", progress=False)
    folder = DatasetFolder(tmp_path / "data")
    axes = tuple(EXPECTED[preset])
    assert folder.boundaries(axes) == EXPECTED[preset]
    shown = split_to_xarray(folder, "train")
    assert {k: v for k, v in shown.attrs.items() if k.startswith("boundary_")} == {
        f"boundary_{axis}": kind for axis, kind in EXPECTED[preset].items()
    }
    params = folder.read_split("train")
    for name in VALUES[preset]:  # each sample's own boundary values (or geometry)
        column = params.params[:, list(params.param_names).index(name)]
        np.testing.assert_array_equal(shown[name].values, column)
    assert len(set(shown[VALUES[preset][0]].values.tolist())) == 2  # drawn per sample
    export(tmp_path / "data", tmp_path / "well", "the_well", progress=False)
    written = next((tmp_path / "well" / "data" / "train").glob("*.hdf5"))
    with h5py.File(written, "r") as h5:
        kinds = {
            str(group.attrs["associated_dims"][0]): str(group.attrs["bc_type"])
            for group in h5["boundary_conditions"].values()
        }
        assert kinds == EXPECTED[preset]
        assert all(name in h5["scalars"] for name in VALUES[preset])
    assert DatasetFolder(written).boundaries(axes) == EXPECTED[preset]  # The Well's conditions read back


def test_a_periodic_dataset_is_periodic_on_every_axis(tmp_path: Path, one_thread: None) -> None:
    sizes = [*SIZES, "system.resolution=16", "system.steps=4", "system.save_every=2"]
    generate(load_config(REPO / "configs" / "burgers1d.yaml", sizes), tmp_path / "data", progress=False)
    assert DatasetFolder(tmp_path / "data").boundaries(("x",)) == {"x": "PERIODIC"}
