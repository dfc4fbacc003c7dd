"""`dynaforge convert DIR --to the_well|pdebench`: a dataset written in The Well's and PDEBench's formats, read
back equal by dynaforge's own readers of those formats (every run) and by The Well's `WellDataset` (where
`the_well` is installed: the benchmark environment, `make bench-env`).

PDEBench's loaders (`FNODatasetSingle`, `FNODatasetMult` in `pdebench/models/fno/utils.py`) are not
installable (PDEBench is not on PyPI and its licence forbids redistribution): the PDEBench test reads the
file with h5py exactly as those loaders do (which keys, which axes, which test split), not with their code.
The Well's format checker is a script in its repository, not in its package: set THE_WELL_FORMAT_CHECKER to a
copy of `scripts/check_thewell_formatting.py` to run it on every file written here.

In the benchmark environment (which has no dev extras, so no beartype for the jaxtyping hook):
    PYTHONPATH=src .venv-bench/bin/python -m pytest -o addopts=-ra tests/integration/test_convert_sinks.py
"""

from __future__ import annotations

import importlib.util
import os
import runpy
from pathlib import Path

import h5py
import numpy as np
import pytest
import yaml

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.generate import generate
from dynaforge.seeds import SPLITS
from dynaforge.store import DatasetError, DatasetFolder
from dynaforge.store.convert import export
from dynaforge.store.interop import ForeignDataset

from ..conftest import CONFIGS

WELL_SPLITS = {"train": "train", "val": "valid", "test": "test"}
NEEDS_THE_WELL = pytest.mark.skipif(
    importlib.util.find_spec("the_well") is None,
    reason="The Well (`pip install the_well`) is not installed here; `make bench-env` installs it",
)


@pytest.fixture(scope="module")
def burgers(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 1D dataset whose samples' domain lengths (so grids) and viscosities differ."""
    root = tmp_path_factory.mktemp("burgers") / "data"
    generate(load_config(CONFIGS / "tiny.yaml", ["dataset.n_val=3"]), root, progress=False)
    return root


@pytest.fixture(scope="module")
def gray_scott(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A generated 2D dataset with two channels."""
    overrides = ["system.resolution=16", "system.steps=4", "system.save_every=2", "dataset.n_train=3"]
    overrides += ["dataset.n_val=1", "dataset.n_test=2", "dataset.shard_size=2"]
    root = tmp_path_factory.mktemp("gray_scott") / "data"
    generate(load_config(CONFIGS / "gray_scott.yaml", overrides), root, progress=False)
    return root


def assert_same_split(back: object, original: object, where: str) -> None:
    for name in ("fields", "params", "time"):
        np.testing.assert_array_equal(getattr(back, name), getattr(original, name), err_msg=f"{where}/{name}")
    assert back.param_names == original.param_names, where
    assert back.coords.keys() == original.coords.keys(), where
    for axis in original.coords:
        np.testing.assert_array_equal(back.coords[axis], original.coords[axis], err_msg=f"{where}/{axis}")


def split_counts(folder: DatasetFolder) -> tuple[int, int, int]:
    return tuple(folder.split_size(split) for split in SPLITS)


@pytest.mark.parametrize("dataset", ["burgers", "gray_scott"])
def test_the_well_sink_reads_back_equal(dataset: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source = request.getfixturevalue(dataset)
    written, _ = export(source, tmp_path / "well", "the_well", progress=False)
    original = DatasetFolder(source)
    assert sorted(written) == sorted(
        [f"data/{WELL_SPLITS[s]}/{original.system}.hdf5" for s in SPLITS] + ["stats.yaml"]
    )
    for split in SPLITS:
        path = tmp_path / "well" / "data" / WELL_SPLITS[split] / f"{original.system}.hdf5"
        back = ForeignDataset(path, fractions=(1.0, 0.0, 0.0))  # a The Well file is one split
        assert back.layout.channel_names == tuple(original_channels(original))
        assert_same_split(back.read_split("train"), original.read_split(split), f"{dataset}/{split}")
    stats = yaml.safe_load((tmp_path / "well" / "stats.yaml").read_text())
    for c, channel in enumerate(original_channels(original)):
        assert stats["mean"][channel] == pytest.approx(original.stats["mean"][c], rel=1e-12)
        assert stats["std"][channel] == pytest.approx(original.stats["std"][c], rel=1e-12)
    check_well_format(tmp_path / "well")


@pytest.mark.parametrize("dataset", ["burgers", "gray_scott"])
def test_pdebench_sink_reads_back_equal(dataset: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    source = request.getfixturevalue(dataset)
    written, how = export(source, tmp_path / "pdebench", "pdebench", progress=False)
    original = DatasetFolder(source)
    counts = split_counts(original)
    assert f"--splits {','.join(map(str, counts))}" in how
    back = ForeignDataset(tmp_path / "pdebench" / written[0], fractions=tuple(map(float, counts)))
    assert back.layout.channel_names == tuple(original_channels(original))
    for split in SPLITS:
        assert_same_split(back.read_split(split), original.read_split(split), f"{dataset}/{split}")


def test_a_pdebench_file_goes_to_the_well_and_back(tmp_path: Path) -> None:
    """A foreign file is a dataset too: PDEBench -> The Well without a dataset folder between them."""
    from dynaforge.store.pdebench import write_tensor_file

    rng = np.random.default_rng(0)
    fields = rng.normal(size=(10, 5, 8)).astype(np.float32)
    write_tensor_file(tmp_path / "adv.hdf5", fields, x=(np.arange(8) + 0.5) / 8, t=np.linspace(0, 1, 6))
    export(tmp_path / "adv.hdf5", tmp_path / "well", "the_well", progress=False)
    train = ForeignDataset(
        tmp_path / "well" / "data" / "train" / "pdebench_adv.hdf5", fractions=(1.0, 0.0, 0.0)
    )
    np.testing.assert_array_equal(
        train.read_split("train").fields[..., 0], fields[2:]
    )  # PDEBench: test first
    with h5py.File(tmp_path / "well" / "data" / "train" / "pdebench_adv.hdf5", "r") as h5:
        assert list(h5["boundary_conditions"]) == []  # PDEBench does not record them: none is claimed


def pdebench_loader_reads(path: Path, test_ratio: float) -> dict[str, np.ndarray]:
    """What PDEBench's loaders take from a file, read as they read it (their documented keys and axes):
    `FNODatasetSingle` for a `tensor` file (test = the first int(N * test_ratio) samples, data transposed to
    [N, X, T, 1], grid `x-coordinate`); `FNODatasetMult` for per-sample groups (keys sorted, test = the
    last, `data` [T, *space, C] transposed to [*space, T, C], grid `grid/x`...)."""
    with h5py.File(path, "r") as h5:
        if "tensor" in h5:
            data = np.transpose(np.asarray(h5["tensor"], dtype=np.float32), (0, 2, 1))[..., None]
            n_test = int(len(data) * test_ratio)
            return {"test": data[:n_test], "rest": data[n_test:], "x": np.asarray(h5["x-coordinate"])}
        keys = sorted(h5.keys())
        n_rest = int(len(keys) * (1 - test_ratio))
        data = np.stack([np.moveaxis(np.asarray(h5[k]["data"], dtype=np.float32), 0, -2) for k in keys])
        return {"test": data[n_rest:], "rest": data[:n_rest], "x": np.asarray(h5[keys[0]]["grid"]["x"])}


@pytest.mark.parametrize("dataset", ["burgers", "gray_scott"])
def test_pdebench_loaders_read_the_test_split(
    dataset: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    source = request.getfixturevalue(dataset)
    written, _ = export(source, tmp_path / "pdebench", "pdebench", progress=False)
    original = DatasetFolder(source)
    test_ratio = original.split_size("test") / sum(split_counts(original))
    read = pdebench_loader_reads(tmp_path / "pdebench" / written[0], test_ratio)
    test = original.read_split("test")
    np.testing.assert_array_equal(read["test"], np.moveaxis(test.fields, 1, -2))
    assert len(read["rest"]) == original.split_size("train") + original.split_size("val")
    np.testing.assert_array_equal(read["x"], original.read_split("train").coords["x"][0])  # a train sample's


@NEEDS_THE_WELL
@pytest.mark.parametrize("dataset", ["burgers", "gray_scott"])
def test_well_dataset_reads_the_export(dataset: str, request: pytest.FixtureRequest, tmp_path: Path) -> None:
    import torch
    from the_well.data import WellDataset
    from the_well.data.normalization import ZScoreNormalization

    source = request.getfixturevalue(dataset)
    export(source, tmp_path / "well", "the_well", progress=False)
    original = DatasetFolder(source)
    for split, folder in WELL_SPLITS.items():
        arrays = original.read_split(split)
        frames = arrays.fields.shape[1]
        well = WellDataset(
            path=str(tmp_path / "well"),
            well_split_name=folder,
            normalization_path="stats.yaml",
            n_steps_input=1,
            n_steps_output=frames - 1,  # one sample per trajectory: the whole of it
            use_normalization=True,
            normalization_type=ZScoreNormalization,
        )
        assert len(well) == len(arrays.fields)
        assert well.metadata.field_names[0] == original_channels(original)
        mean = torch.tensor(original.stats["mean"], dtype=torch.float32)
        std = torch.tensor(original.stats["std"], dtype=torch.float32)
        for index in range(len(well)):
            sample = well[index]
            whole = torch.cat([sample["input_fields"], sample["output_fields"]])  # (T, *space, C)
            torch.testing.assert_close(whole * std + mean, torch.from_numpy(arrays.fields[index]))
            if arrays.param_names:
                torch.testing.assert_close(
                    sample["constant_scalars"].double(),
                    torch.from_numpy(arrays.params[index]),
                    rtol=0,
                    atol=0,
                )


def check_well_format(root: Path) -> None:
    """The Well's own format checker on every file, where THE_WELL_FORMAT_CHECKER names a copy of it."""
    checker = os.environ.get("THE_WELL_FORMAT_CHECKER")
    if not checker:
        return
    check = runpy.run_path(checker)["check_hdf5_format"]
    for path in sorted((root / "data").rglob("*.hdf5")):
        check(str(path))


def original_channels(folder: DatasetFolder) -> list[str]:
    with h5py.File(folder.shard_paths("train")[0], "r") as h5:
        return [str(c) for c in h5.attrs["channel_names"]]


def test_convert_to_cli_errors_name_the_fix(
    burgers: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "convert", str(burgers), "--to", "netcdf", "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert (
        err.count("error:") == 1
        and "choose one of: pdebench, the_well" in err
        and not (tmp_path / "x").exists()
    )
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "notes.txt").write_text("mine")
    assert main(["-q", "convert", str(burgers), "--to", "the_well", "--out", str(tmp_path / "busy")]) == 2
    err = capsys.readouterr().err
    assert "is not empty" in err and "choose an empty or new --out folder" in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["busy"]  # nothing written, no temporary left
    assert main(["-q", "convert", str(burgers), "--to", "pdebench", "--out", str(tmp_path / "pde")]) == 0
    out = capsys.readouterr().out
    assert f"dynaforge convert {tmp_path / 'pde' / 'burgers.hdf5'} --out DIR --splits 8,3,4" in out
    assert main(["-q", "convert", str(burgers), "--to", "pdebench", "--out", str(tmp_path / "pde")]) == 2
    assert "is not empty" in capsys.readouterr().err


def test_a_dataset_without_a_grid_is_refused(tmp_path: Path) -> None:
    generate(load_config(CONFIGS / "nbody_tiny.yaml"), tmp_path / "nbody", progress=False)
    with pytest.raises(DatasetError, match="not on a spatial grid"):
        export(tmp_path / "nbody", tmp_path / "out", "the_well", progress=False)
    assert not (tmp_path / "out").exists()


def test_an_interrupted_export_leaves_nothing(
    burgers: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Killed after its first split: no OUT, no partial folder beside it; the rerun writes it whole."""
    reads = []

    def read_then_stop(self: DatasetFolder, split: str, samples: int | None = None) -> object:
        reads.append(split)
        if len(reads) > 1:
            raise KeyboardInterrupt
        return original(self, split, samples)

    original = DatasetFolder.read_split
    monkeypatch.setattr(DatasetFolder, "read_split", read_then_stop)
    with pytest.raises(KeyboardInterrupt):
        export(burgers, tmp_path / "out" / "well", "the_well", progress=False)
    assert list((tmp_path / "out").iterdir()) == []
    monkeypatch.setattr(DatasetFolder, "read_split", original)
    written, _ = export(burgers, tmp_path / "out" / "well", "the_well", progress=False)
    assert len(written) == 4 and sorted(p.name for p in (tmp_path / "out").iterdir()) == ["well"]
