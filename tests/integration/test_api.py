"""The notebook API (`dynaforge.api`, re-exported by `import dynaforge`): the whole flow in a few lines,
`simulate` against the stored bytes, physical units in and out of a run, a light `import dynaforge`, and
the docstring examples of dynaforge/api.py run as doctests (so that the examples in the reference stay
true; they use the fixtures below under the names the module docstring gives)."""

from __future__ import annotations

import doctest
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import dynaforge
from dynaforge.config import load_config
from dynaforge.evaluate.rollout import rollouts
from dynaforge.models import ModelInput

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "configs" / "tiny.yaml"


@pytest.fixture(scope="module")
def tiny_run(tiny_data: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A run of configs/tiny.yaml trained for 2 epochs on `tiny_data`."""
    out = tmp_path_factory.mktemp("tiny-run") / "run"
    dynaforge.api.train(TINY, tiny_data, out, overrides=["train.epochs=2"], progress=False)
    return out


def test_notebook_flow(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None) -> None:
    monkeypatch.chdir(ROOT)
    # The user's code, as in the README's "Python in ten lines":
    sim = dynaforge.simulate("configs/tiny.yaml", n=4, split="test")
    data = dynaforge.api.generate("configs/tiny.yaml", tmp_path / "data")
    dynaforge.api.train("configs/tiny.yaml", data, tmp_path / "run", overrides=["train.epochs=2"])
    run = dynaforge.load_run(tmp_path / "run")
    predicted = run.rollout(sim.fields[:, :2], steps=5)
    result = run.evaluate()

    assert torch.equal(sim.fields, data.split("test").fields)
    assert predicted.shape == sim.fields[:, 2:7].shape and torch.isfinite(predicted).all()
    assert len(result.metrics["rollout_nrmse"]) == 5 and result.report.exists()
    assert run.config.train.epochs == 2 and not run.model.training


@pytest.mark.parametrize("split", ["train", "val", "test"])
def test_simulate_gives_the_stored_samples_bit_for_bit(tiny_data: Path, split: str) -> None:
    stored = dynaforge.open_dataset(tiny_data).split(split)
    sim = dynaforge.simulate(TINY, split=split)  # n: the whole split, as the config sizes it
    assert torch.equal(sim.fields, stored.fields)
    assert torch.equal(sim.params, stored.params)
    assert sim.param_names == stored.param_names and sim.seeds == stored.seeds
    assert torch.equal(sim.time, stored.time)
    assert sim.grid.keys() == stored.grid.keys()
    assert all(torch.equal(sim.grid[axis], stored.grid[axis]) for axis in sim.grid)


def test_simulate_from_a_start_and_a_config_object_gives_the_stored_samples(tiny_data: Path) -> None:
    data = dynaforge.open_dataset(tiny_data)
    # samples 3 and 4 of the train split lie in two shards (shard_size 4) and in one batch here
    sim = dynaforge.simulate(load_config(TINY), overrides=["dataset.batch_size=2"], n=2, start=3)
    for i, index in enumerate((3, 4)):
        one, stored = sim.sample(i), data.sample("train", index)
        assert torch.equal(one.fields, stored.fields) and torch.equal(one.params, stored.params)
        assert one.seed == stored.seed and torch.equal(one.grid["x"], stored.grid["x"])
    other = dynaforge.simulate(TINY, n=2, start=3, seed=1)
    assert not torch.equal(other.fields, sim.fields)


def test_dataset_reads_splits_samples_and_statistics(tiny_data: Path) -> None:
    data = dynaforge.open_dataset(tiny_data)
    assert data.splits == {"train": 8, "val": 4, "test": 4} and data.system == "burgers"
    assert data.config.dataset.n_train == 8
    assert set(data.stats) >= {"mean", "std"} and len(data.stats["std"]) == 1
    train = data.split("train")
    assert train.fields.is_contiguous() and train.fields.dtype == torch.float32
    raw = data.folder.read_split("train").fields  # (N, T, X, C): the stored layout
    assert np.array_equal(train.fields.numpy(), np.moveaxis(raw, -1, 2))
    for index in (0, 5, 7):
        assert torch.equal(data.sample("train", index).fields, train.fields[index])
    with pytest.raises(IndexError, match=r"holds \[0, 4\)"):
        data.sample("test", 4)


def test_to_xarray_without_xarray_says_how_to_install_it(
    tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "xarray", None)  # `import xarray` raises ImportError
    with pytest.raises(ImportError, match="pip install 'dynaforge\\[xarray\\]'"):
        dynaforge.open_dataset(tiny_data).to_xarray("test")


def test_to_xarray_labels_the_arrays(tiny_data: Path) -> None:
    xarray = pytest.importorskip("xarray")
    data = dynaforge.open_dataset(tiny_data)
    converted = data.to_xarray("test")
    assert isinstance(converted, xarray.Dataset)
    test = data.split("test")
    assert converted["fields"].dims == ("sample", "time", "x_index", "channel")  # as the shards store it
    assert np.array_equal(converted["fields"].values, np.moveaxis(test.fields.numpy(), 2, -1))
    assert all(
        np.array_equal(converted[name].values, test.params[:, i]) for i, name in enumerate(test.param_names)
    )
    assert converted["x"].dims == ("sample", "x_index")


def test_predict_and_rollout_take_and_return_physical_units(
    tiny_data: Path, tiny_run: Path, one_thread: None
) -> None:
    run = dynaforge.load_run(tiny_run)
    test = dynaforge.open_dataset(tiny_data).split("test")
    mean, std = run.normalizer.mean[0], run.normalizer.std[0]
    assert abs(std - 1) > 0.1  # else physical and normalised units could not be told apart

    frames = test.fields[:, :2]
    with torch.inference_mode():
        by_hand = run.model(ModelInput(frames=(frames - mean) / std)).frames * std + mean
    torch.testing.assert_close(run.predict(frames), by_hand, rtol=1e-5, atol=1e-6)

    reference = rollouts(
        run.model,
        run.normalizer,
        dynaforge.open_dataset(tiny_data).folder.read_split("test").fields,
        run.shape,
        stride=1,
        start_frame=0,
        frames=5,
        batch_size=16,
        device=torch.device("cpu"),
    )
    torch.testing.assert_close(run.rollout(frames, steps=5), reference.predicted, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(run.rollout(frames, steps=1), run.predict(frames))


def test_run_errors_name_the_fix(tiny_run: Path) -> None:
    run = dynaforge.load_run(tiny_run, checkpoint="last")
    assert run.checkpoint == "last"
    with pytest.raises(ValueError, match=r"frames\[:, -2:\]"):
        run.rollout(torch.zeros(1, 3, 1, 64), steps=2)
    with pytest.raises(ValueError, match=r"frames\[None\]"):
        run.predict(torch.zeros(2, 1, 64))


def test_import_dynaforge_does_not_import_torch() -> None:
    code = "import dynaforge, sys; assert 'torch' not in sys.modules; print(sorted(dynaforge.API))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert "simulate" in result.stdout


def test_the_package_reexports_the_api() -> None:
    from dynaforge import api

    assert dynaforge.simulate is api.simulate and dynaforge.load_run is api.load_run
    assert dynaforge.open_dataset is api.open_dataset and dynaforge.Samples is api.Samples
    assert set(dynaforge.API) <= set(dir(dynaforge))
    with pytest.raises(AttributeError, match="no attribute 'nothing'"):
        _ = dynaforge.nothing


def test_docstring_examples(
    tiny_data: Path, tiny_run: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    from dynaforge import api

    monkeypatch.chdir(ROOT)
    extra = {"tmp": tmp_path, "tiny_data": tiny_data, "tiny_run": tiny_run}
    result = doctest.testmod(api, extraglobs=extra, optionflags=doctest.ELLIPSIS, report=True)
    assert result.failed == 0
    assert result.attempted >= 20  # every example ran


def test_predict_and_rollout_take_numpy_and_return_numpy(
    tiny_data: Path, tiny_run: Path, one_thread: None
) -> None:
    run = dynaforge.load_run(tiny_run)
    frames = dynaforge.open_dataset(tiny_data).split("test").fields[:, :2]
    predicted = run.rollout(frames.numpy(), steps=3)
    assert isinstance(predicted, np.ndarray) and predicted.dtype == np.float32
    np.testing.assert_allclose(predicted, run.rollout(frames, steps=3).numpy(), rtol=1e-6, atol=1e-7)
    one = run.predict(frames.numpy().astype(np.float64))  # any float dtype: the model takes float32
    assert isinstance(one, np.ndarray) and one.shape == (4, 1, 1, 64)
    with pytest.raises(TypeError):  # a list: one TypeError (under pytest, jaxtyping's, which checks first)
        run.rollout(frames.tolist(), steps=1)


def test_printed_forms_fit_a_notebook_cell(tiny_data: Path, tiny_run: Path, one_thread: None) -> None:
    run = dynaforge.load_run(tiny_run)
    data = dynaforge.open_dataset(tiny_data)
    test = data.split("test")
    result = run.evaluate()
    printed = {
        "run": repr(run),
        "dataset": repr(data),
        "samples": repr(test),
        "sample": repr(test.sample(0)),
        "simulated": repr(dynaforge.simulate(TINY, n=2, split="test")),
        "evaluation": repr(result),
    }
    for name, text in printed.items():
        assert len(text) < 600, f"{name}: {len(text)} characters:\n{text}"
    assert "'fno'" in printed["run"] and "history=2" in printed["run"] and "'burgers'" in printed["run"]
    assert "(4, 11, 1, 64) float32" in printed["samples"] and "viscosity" in printed["samples"]
    assert "tensor(" not in printed["samples"] + printed["sample"] + printed["simulated"]
    assert "'burgers'" in printed["dataset"] and "'test': 4" in printed["dataset"]
    assert f"one_step_nrmse={result.metrics['one_step_nrmse']:.4g}" in printed["evaluation"]
    assert "report.html" in printed["evaluation"] and "spectra" not in printed["evaluation"]


def test_api_errors_name_python_arguments(tiny_data: Path, tiny_run: Path, tmp_path: Path) -> None:
    """Messages written once name the option; through the API they read as the function's arguments."""
    from dynaforge.errors import DatasetError, DynaforgeError, RunError

    def message(error: pytest.ExceptionInfo[BaseException]) -> str:
        text = str(error.value)
        for path in (tmp_path, tiny_run, tiny_data):
            text = text.replace(str(path), "PATH")
        assert "--" not in text, f"a command-line flag in an API error: {text}"
        return text

    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    with pytest.raises(RunError) as error:  # a run is there: resume, overwrite or write elsewhere
        dynaforge.api.train(TINY, tiny_data, run, overrides=["train.epochs=2"], progress=False)
    assert all(name in message(error) for name in ("resume=True", "overwrite=True", "`out`"))
    best = run / "checkpoints" / "best.pt"
    best.write_bytes(best.read_bytes()[: best.stat().st_size // 2])
    with pytest.raises(DynaforgeError) as error:  # truncated: the other checkpoint, or resume
        dynaforge.load_run(run)
    assert "checkpoint='last'" in message(error) and "resume=True" in message(error)
    with pytest.raises(FileNotFoundError) as error:  # how to make a run, as a call
        dynaforge.load_run(tmp_path)
    assert "dynaforge.api.train(CONFIG, data=DIR, out=RUN)" in message(error)
    with pytest.raises(DatasetError) as error:
        dynaforge.open_dataset(tmp_path / "nothing")
    assert "dynaforge.api.generate(CONFIG, out='PATH/nothing')" in message(error)
    (tmp_path / "notes.txt").write_text("mine")
    with pytest.raises(RunError) as error:  # the one folder rule, through the API too
        dynaforge.api.train(TINY, tiny_data, tmp_path, overrides=["train.epochs=1"], progress=False)
    assert "notes.txt" in message(error) and "`out`" in message(error)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "run"]
