"""PDEBench and The Well files: read directly, converted with `dynaforge convert`, trained on and evaluated.

Every file here is written by the tests themselves in the source's layout (no downloads).
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import h5py
import numpy as np
import pytest

from dynaforge.cli import main
from dynaforge.seeds import SPLITS
from dynaforge.store import DatasetError, DatasetFolder, validate_dataset
from dynaforge.store.convert import convert
from dynaforge.store.interop import ForeignDataset, parse_fractions, split_ranges
from dynaforge.store.pdebench import write_cfd_file, write_groups_file, write_tensor_file
from dynaforge.store.the_well import write_well_file

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")


def advection_fields(n: int = 20, frames: int = 12, points: int = 32) -> tuple[np.ndarray, ...]:
    """Travelling sine waves u(x, t) = a sin(2 pi (x - 0.5 t) + phi), as PDEBench's 1D advection."""
    rng = np.random.default_rng(0)
    x = (np.arange(points) + 0.5) / points  # cell centres, as PDEBench
    t = np.linspace(0.0, 1.1, frames + 1)  # PDEBench stores one time more than it has frames
    phase = rng.uniform(0, 2 * np.pi, n)[:, None, None]
    amplitude = rng.uniform(0.5, 1.5, n)[:, None, None]
    fields = amplitude * np.sin(2 * np.pi * (x[None, None, :] - 0.5 * t[None, :frames, None]) + phase)
    return fields.astype(np.float32), x, t


@pytest.fixture(scope="module")
def advection_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("pdebench") / "1D_Advection_Sols_beta0.5.hdf5"
    fields, x, t = advection_fields()
    write_tensor_file(path, fields, x, t)
    return path


def test_pdebench_tensor_file_reads_with_pdebench_splits(advection_file: Path) -> None:
    fields, x, t = advection_fields()
    dataset = DatasetFolder(advection_file)  # a file where a folder goes
    assert dataset.system == "pdebench:1D_Advection_Sols_beta0.5"
    assert {s: dataset.split_size(s) for s in SPLITS} == {"train": 16, "val": 2, "test": 2}
    test = dataset.read_split("test")  # PDEBench FNODatasetSingle: the first 10% are the test set
    np.testing.assert_array_equal(test.fields, fields[:2, ..., None])
    np.testing.assert_array_equal(dataset.read_split("val").fields, fields[2:4, ..., None])
    np.testing.assert_array_equal(dataset.read_split("train").fields, fields[4:, ..., None])
    np.testing.assert_array_equal(dataset.read_split("train", 3).fields, fields[4:7, ..., None])
    np.testing.assert_allclose(test.time, t[:12].astype(np.float32))  # T + 1 stored, T frames
    np.testing.assert_allclose(test.coords["x"][1], x.astype(np.float32))
    train = fields[4:].astype(np.float64)
    assert dataset.stats["mean"] == pytest.approx([train.mean()], abs=1e-12)
    assert dataset.stats["std"] == pytest.approx([train.std()], rel=1e-9)


def test_pdebench_cfd_file_channels_follow_pdebench(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    names = ("Vx", "density", "Vy", "pressure")  # written in another order on purpose
    values = {name: rng.normal(size=(10, 4, 6, 5)).astype(np.float32) for name in names}
    path = tmp_path / "2D_CFD_Rand_M0.1_Eta0.01_Zeta0.01_periodic_Train.hdf5"
    write_cfd_file(path, values, t=np.linspace(0, 1, 5), x=np.arange(6) / 6, y=np.arange(5) / 5)
    dataset = ForeignDataset(path)
    assert dataset.layout.channel_names == ("density", "pressure", "Vx", "Vy")
    test = dataset.read_split("test")
    assert test.fields.shape == (1, 4, 6, 5, 4)
    for c, name in enumerate(dataset.layout.channel_names):
        np.testing.assert_array_equal(test.fields[..., c], values[name][:1])
    assert sorted(test.coords) == ["x", "y"] and test.coords["y"].shape == (1, 5)


def test_pdebench_group_file_sorted_with_test_last(tmp_path: Path) -> None:
    rng = np.random.default_rng(2)
    data = rng.normal(size=(10, 5, 4, 4, 2)).astype(np.float32)
    path = tmp_path / "2D_diff-react_NA_NA.h5"
    write_groups_file(path, data, t=np.linspace(0, 5, 5), x=np.arange(4) / 4, y=np.arange(4) / 4)
    dataset = ForeignDataset(path)
    assert dataset.layout.layout == "groups" and not dataset.layout.test_first
    assert dataset.ranges == {"train": (0, 8), "val": (8, 9), "test": (9, 10)}  # FNODatasetMult: last 10%
    np.testing.assert_array_equal(dataset.read_split("test").fields, data[9:])
    np.testing.assert_array_equal(dataset.read_split("train").fields, data[:8])
    np.testing.assert_allclose(dataset.read_split("test").time, np.linspace(0, 5, 5))


def well_file(path: Path) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(3)
    fields = {
        "t0_fields/pressure": rng.normal(size=(10, 6, 8, 4)),
        "t1_fields/velocity": rng.normal(size=(10, 6, 8, 4, 2)),
        "t2_fields/stress": rng.normal(size=(10, 6, 8, 4, 2, 2)),
    }
    write_well_file(
        path,
        fields,
        time=np.linspace(0, 0.5, 6),
        coords={"x": np.arange(8) / 8, "y": np.arange(4) / 4},
        parameters={"Reynolds": 1e3, "Schmidt": 0.5},
        constant_fields={"t0_fields/obstacle": rng.normal(size=(10, 8, 4))},
    )
    return fields


def test_the_well_file_channels_parameters_and_metadata(tmp_path: Path) -> None:
    fields = well_file(tmp_path / "shear_flow_tiny.hdf5")
    dataset = ForeignDataset(tmp_path / "shear_flow_tiny.hdf5")
    layout = dataset.layout
    assert dataset.system == "the_well:tiny_well"
    assert layout.channel_names == (
        "pressure",
        "velocity_x",
        "velocity_y",
        "stress_xx",
        "stress_xy",
        "stress_yx",
        "stress_yy",
    )
    assert layout.details["constant_fields"] == ["t0_fields/obstacle"]
    assert layout.details["boundary_conditions"]["x_periodic"]["bc_type"] == "PERIODIC"
    test = dataset.read_split("test")  # trajectories in file order, test last
    assert test.fields.shape == (1, 6, 8, 4, 7)
    np.testing.assert_allclose(test.fields[..., 0], fields["t0_fields/pressure"][9:], rtol=1e-6)
    np.testing.assert_allclose(test.fields[..., 2], fields["t1_fields/velocity"][9:, ..., 1], rtol=1e-6)
    np.testing.assert_allclose(test.fields[..., 4], fields["t2_fields/stress"][9:, ..., 0, 1], rtol=1e-6)
    assert test.param_names == ("Reynolds", "Schmidt")
    np.testing.assert_array_equal(test.params, [[1e3, 0.5]])


def test_the_well_field_constant_along_an_axis_is_broadcast(tmp_path: Path) -> None:
    path = tmp_path / "well.hdf5"
    well_file(path)
    with h5py.File(path, "a") as h5:  # a field that does not vary along y omits that axis
        profile = np.arange(10 * 6 * 8, dtype=np.float32).reshape(10, 6, 8)
        h5["t0_fields"].create_dataset("inflow", data=profile)
        h5["t0_fields/inflow"].attrs["dim_varying"] = [True, False]
        h5["t0_fields"].attrs["field_names"] = ["pressure", "inflow"]
    dataset = ForeignDataset(path)
    assert dataset.layout.channel_names[:2] == ("pressure", "inflow")
    inflow = dataset.read_split("train").fields[..., 1]
    np.testing.assert_array_equal(inflow, np.broadcast_to(profile[:8, :, :, None], (8, 6, 8, 4)))


def test_convert_gives_the_arrays_of_the_direct_read(tmp_path: Path, advection_file: Path) -> None:
    manifest = convert(advection_file, tmp_path / "converted", shard_size=7)
    result = validate_dataset(tmp_path / "converted")
    assert result.ok, result.errors
    assert result.summary["source"]["format"] == "pdebench"
    converted, direct = DatasetFolder(tmp_path / "converted"), DatasetFolder(advection_file)
    assert converted.stats == direct.stats and manifest["stats"] == direct.stats
    assert converted.system == direct.system
    for split in SPLITS:
        a, b = converted.read_split(split), direct.read_split(split)
        for name in ("fields", "params", "seeds", "time"):
            np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=f"{split}/{name}")
        assert a.coords.keys() == b.coords.keys() and a.param_names == b.param_names
        np.testing.assert_array_equal(a.coords["x"], b.coords["x"])
    with h5py.File(tmp_path / "converted" / "test" / "shard-00000.h5", "r") as h5:
        np.testing.assert_array_equal(h5["source_index"][...], [0, 1])
        assert json.loads(h5.attrs["source"])["layout"] == "tensor"
    before = (tmp_path / "converted" / "manifest.json").stat().st_mtime_ns
    assert convert(advection_file, tmp_path / "converted", shard_size=7) == manifest  # rerun: nothing to do
    assert (tmp_path / "converted" / "manifest.json").stat().st_mtime_ns == before


def test_an_interrupted_conversion_is_redone(tmp_path: Path, advection_file: Path) -> None:
    first = convert(advection_file, tmp_path / "a")
    out = tmp_path / "b"
    shutil.copytree(tmp_path / "a", out)
    (out / "manifest.json").unlink()  # killed before the manifest: not a dataset yet
    (out / ".conversion.json").write_text(json.dumps(first["identity"]))
    (out / "train" / "shard-00000.h5").write_bytes(b"truncated")
    (out / "train" / ".shard-00001.h5.x.tmp").write_bytes(b"partial")
    with pytest.raises(DatasetError, match=r"manifest\.json is missing"):
        DatasetFolder(out)
    assert convert(advection_file, out)["stats"] == first["stats"]
    assert (
        validate_dataset(out).ok and not list(out.rglob("*.tmp")) and not (out / ".conversion.json").exists()
    )


def test_convert_refuses_to_mix_datasets(tmp_path: Path, advection_file: Path) -> None:
    convert(advection_file, tmp_path / "out")
    with pytest.raises(DatasetError, match="already holds another dataset"):
        convert(advection_file, tmp_path / "out", fractions=(0.6, 0.2, 0.2))
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    with pytest.raises(DatasetError, match="not empty"):
        convert(advection_file, tmp_path / "busy")


def test_convert_cli_with_splits_and_the_well(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    well_file(tmp_path / "well.hdf5")
    out = tmp_path / "well"
    assert (
        main(["-q", "convert", str(tmp_path / "well.hdf5"), "--out", str(out), "--splits", "0.6,0.2,0.2"])
        == 0
    )
    assert "the_well" in capsys.readouterr().out
    assert main(["-q", "inspect", str(out)]) == 0
    assert "source    the_well" in capsys.readouterr().out
    assert {s: DatasetFolder(out).split_size(s) for s in SPLITS} == {"train": 6, "val": 2, "test": 2}


def test_bad_inputs_name_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with h5py.File(tmp_path / "other.h5", "w") as h5:
        h5.create_dataset("something", data=np.zeros(3))
    assert main(["-q", "convert", str(tmp_path / "other.h5"), "--out", str(tmp_path / "x")]) == 2
    assert "neither a PDEBench file" in capsys.readouterr().err
    assert main(["-q", "inspect", str(tmp_path / "other.h5")]) == 2
    assert "dynaforge convert" in capsys.readouterr().err  # a file is not a folder: the fix is named
    with pytest.raises(DatasetError, match="three fractions"):
        parse_fractions("0.8,0.2")
    with pytest.raises(DatasetError, match="sum to 1"):
        parse_fractions("0.8,0.2,0.1")


def test_split_ranges_follow_the_source_loaders() -> None:
    assert split_ranges(100, (0.8, 0.1, 0.1), test_first=True) == {
        "train": (20, 100),
        "val": (10, 20),
        "test": (0, 10),
    }
    assert split_ranges(100, (0.8, 0.1, 0.1), test_first=False) == {
        "train": (0, 80),
        "val": (80, 90),
        "test": (90, 100),
    }
    ranges = split_ranges(7, (0.5, 0.25, 0.25), test_first=False)
    assert sum(hi - lo for lo, hi in ranges.values()) == 7 and ranges["test"] == (5, 7)
    # Counts: exactly those sizes, in the loader's order; what is left over sits unused next to train.
    assert parse_fractions("10,3,5") == (10, 3, 5)
    assert split_ranges(20, (10.0, 3.0, 5.0), test_first=True) == {
        "train": (8, 18),
        "val": (5, 8),
        "test": (0, 5),
    }
    assert split_ranges(20, (10.0, 3.0, 5.0), test_first=False) == {
        "train": (0, 10),
        "val": (12, 15),
        "test": (15, 20),
    }
    with pytest.raises(DatasetError, match="asks for 21 samples; the file has 20"):
        split_ranges(20, (10.0, 6.0, 5.0), test_first=True)


def scores(path: Path) -> dict:
    metrics = json.loads(path.read_text())
    metrics.pop("data")
    return metrics


TRAIN = ["-q", "train", TINY, "train.epochs=1", "evaluate.rollout_frames=4", "evaluate.plot_samples=0"]
TRAIN += ["evaluate.worst_samples=1", "--no-progress"]


@pytest.fixture(scope="module")
def converted_run(tmp_path_factory: pytest.TempPathFactory, advection_file: Path) -> tuple[Path, Path]:
    """(dataset folder converted from the PDEBench-layout file, run trained on that folder)."""
    root = tmp_path_factory.mktemp("converted")
    folder, run = root / "adv", root / "run"
    assert main(["-q", "convert", str(advection_file), "--out", str(folder)]) == 0
    assert main([*TRAIN, "--data", str(folder), "--out", str(run)]) == 0
    return folder, run


def test_a_model_evaluates_the_same_on_the_file_and_its_conversion(
    converted_run: tuple[Path, Path], advection_file: Path
) -> None:
    folder, run = converted_run
    assert main(["-q", "evaluate", str(run), "--data", str(advection_file)]) == 0
    direct = scores(run / f"eval-{advection_file.name}" / "metrics.json")  # not the data it was trained on
    assert main(["-q", "evaluate", str(run), "--data", str(folder)]) == 0
    assert scores(run / "eval" / "metrics.json") == direct
    assert direct["system"] == "pdebench:1D_Advection_Sols_beta0.5" and direct["conserved"] == []
    assert direct["frame_dt"] == pytest.approx(1.1 / 12, rel=1e-6)
    assert direct["domain_lengths"] == pytest.approx([1.0])
    assert len(direct["rollout_nrmse"]) == 4 and all(math.isfinite(v) for v in direct["rollout_nrmse"])


def test_training_on_the_file_matches_training_on_its_conversion(
    converted_run: tuple[Path, Path], advection_file: Path, tmp_path: Path
) -> None:
    """The same windows and statistics either way: the same validation losses, bit for bit."""
    _, run = converted_run
    assert main([*TRAIN, "--data", str(advection_file), "--out", str(tmp_path / "direct")]) == 0

    def val_losses(folder: Path) -> list[float]:
        records = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        return [r["val_loss"] for r in records if r["kind"] == "epoch"]

    assert val_losses(tmp_path / "direct") == val_losses(run)
