"""Boundary values as input channels (`data.boundary_channels`, issue 35 item 5): each sample's boundary
parameters that differ between the train samples reach the model as constant channels, held (not
predicted), recorded in the checkpoint, appended again by evaluation and by the ONNX rollout, and not
scored."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.cli import main
from dynaforge.data.boundary import (
    boundary_normalizer,
    boundary_parameters_of,
    stored_fields_with_boundary,
    varying_boundary_parameters,
    with_boundary_channels,
)
from dynaforge.data.normalize import Normalizer
from dynaforge.errors import ConfigError, DatasetError
from dynaforge.store import DatasetFolder
from dynaforge.store.format import append_parameter_channels

REPO = Path(__file__).resolve().parents[2]
NAMES = ["diffusivity", "left_value", "left_amplitude", "right_value", "right_amplitude", "domain_length"]
PARAMS = np.array(
    [
        [0.05, 0.1, 0.3, -0.2, 0.0, 1.0],
        [0.08, 0.7, 0.4, 0.3, 0.0, 1.0],
        [0.02, 0.4, 0.2, 0.1, 0.0, 1.0],
    ]
)


def test_boundary_channels_carry_each_samples_values() -> None:
    boundary = varying_boundary_parameters(NAMES, PARAMS)
    # diffusivity varies but is no boundary value; right_amplitude is a boundary value shared by all
    assert boundary == ("left_value", "left_amplitude", "right_value")
    frames = torch.randn(3, 4, 2, 5)  # (N, T, C, X)
    appended = with_boundary_channels(frames, PARAMS, NAMES, boundary)
    assert appended.shape == (3, 4, 5, 5)
    torch.testing.assert_close(appended[:, :, :2], frames, rtol=0, atol=0)
    for sample in range(3):
        for k, column in enumerate((1, 2, 3)):
            expected = torch.full((4, 5), PARAMS[sample, column], dtype=torch.float32)
            torch.testing.assert_close(appended[sample, :, 2 + k], expected, rtol=0, atol=0)
    stored = np.moveaxis(frames.numpy(), 2, -1)  # (N, T, X, C): the stored layout evaluation reads
    again = stored_fields_with_boundary(stored, PARAMS, NAMES, boundary)
    np.testing.assert_array_equal(np.moveaxis(again, -1, 2), appended.numpy())
    # the torch-free form the ONNX rollout uses, on channels-first frames (axis 2)
    first = append_parameter_channels(frames.numpy(), PARAMS, NAMES, boundary, axis=2)
    np.testing.assert_array_equal(first, appended.numpy())
    with pytest.raises(DatasetError, match=r"the data has no \['top_value'\].*trained on"):
        append_parameter_channels(stored, PARAMS, NAMES, ["left_value", "top_value"], axis=-1)
    normalizer = boundary_normalizer(Normalizer([0.5, -1.0], [2.0, 3.0]), PARAMS, NAMES, boundary)
    np.testing.assert_allclose(normalizer.mean[2:], PARAMS[:, 1:4].mean(axis=0), rtol=1e-12)
    np.testing.assert_allclose(normalizer.std[2:], PARAMS[:, 1:4].std(axis=0), rtol=1e-12)
    assert normalizer.mean[:2] == [0.5, -1.0]
    with pytest.raises(ConfigError, match=r"data\.boundary_channels"):
        boundary_parameters_of(NAMES, PARAMS[:1])  # one sample: nothing differs


TINY = [
    "dataset.n_train=4",
    "dataset.n_val=1",
    "dataset.n_test=2",
    "dataset.shard_size=4",
    "dataset.batch_size=4",
    "data.batch_size=4",
    "system.steps=80",
    "system.save_every=20",
    "model.width=8",
    "model.modes=4",
    "model.layers=2",
    "model.projection=8",
    "train.time_budget=null",
    "train.epochs=2",
    "train.log_every=1",
    "evaluate.rollout_frames=2",
    "evaluate.plot_samples=0",
]


@pytest.fixture(scope="module")
def bounded_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny heated-rod run with boundary channels, generated, trained and evaluated (one thread)."""
    root = tmp_path_factory.mktemp("boundary_channels")
    config = REPO / "configs" / "heat_bounded_1d.yaml"
    arguments = ["-q", "run", "--out", str(root), "--no-progress", str(config), *TINY]
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main([*arguments, "data.boundary_channels=true"]) == 0
    finally:
        torch.set_num_threads(previous)
    return root


def test_a_bounded_run_with_boundary_channels_trains_and_evaluates(bounded_run: Path) -> None:
    checkpoint = torch.load(bounded_run / "run" / "checkpoints" / "best.pt", weights_only=True)
    shape = checkpoint["model_shape"]
    # the preset draws the left end's value, amplitude and frequency and the right end's flux per sample
    assert tuple(shape["boundary"]) == ("left_value", "left_amplitude", "left_frequency", "right_value")
    assert shape["channels"] == 5 and list(shape["held"]) == [1, 2, 3, 4]
    assert len(checkpoint["normalization"]["mean"]) == 5
    metrics = json.loads((bounded_run / "run" / "eval" / "metrics.json").read_text())
    assert np.isfinite(metrics["one_step_nrmse"]) and metrics["one_step_nrmse"] > 0
    assert len(metrics["rollout_nrmse"]) == 2 and all(np.isfinite(metrics["rollout_nrmse"]))


def test_a_run_with_boundary_channels_exports_and_rolls_out_under_onnxruntime(
    bounded_run: Path, tmp_path: Path, one_thread: None
) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from dynaforge.export.onnx_rollout import rollout_onnx  # with the optional export extra only

    onnx_path = tmp_path / "model.onnx"
    assert main(["-q", "export", str(bounded_run / "run"), "--out", str(onnx_path)]) == 0
    result = rollout_onnx(onnx_path, bounded_run / "data", frames=2)
    assert result.predicted.shape[2] == 1  # the boundary channels are not scored
    test = DatasetFolder(bounded_run / "data").read_split("test")
    np.testing.assert_array_equal(result.truth[:, :, 0], test.fields[:, 2:4, :, 0])
    metrics = json.loads((bounded_run / "run" / "eval" / "metrics.json").read_text())
    np.testing.assert_allclose(result.nrmse, metrics["rollout_nrmse"], rtol=1e-4)


def test_the_python_api_takes_the_boundary_channels_and_names_them_when_missing(
    bounded_run: Path, one_thread: None
) -> None:
    import dynaforge

    run = dynaforge.load_run(bounded_run / "run")
    test = dynaforge.open_dataset(bounded_run / "data").split("test")
    with pytest.raises(ConfigError, match=r"boundary values \['left_value'"):
        run.rollout(test.fields[:, :2], steps=1)
    frames = with_boundary_channels(test.fields, test.params.numpy(), test.param_names, run.shape.boundary)
    predicted = run.rollout(frames[:, :2], steps=2)
    assert predicted.shape[2] == 5
    # held, not predicted: the input values back, up to normalising and back in float32 (a few ulps)
    torch.testing.assert_close(predicted[:, :, 1:], frames[:, 2:4, 1:], rtol=1e-6, atol=1e-6)


SHARED_VALUES = [
    "system.boundary.left.value=0.5",
    "system.boundary.left.amplitude=0",
    "system.boundary.left.frequency=1",
    "system.boundary.right.value=0",
]


@pytest.mark.parametrize("case", ["lazy reading", "values shared by every sample"])
def test_what_boundary_channels_cannot_take_is_refused_naming_the_fix(
    bounded_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], case: str
) -> None:
    config = REPO / "configs" / "heat_bounded_1d.yaml"
    data, override, fix = bounded_run / "data", "data.reading=lazy", "data.reading=memory"
    if case == "values shared by every sample":  # nothing per sample to give
        data, override, fix = tmp_path / "data", "data.boundary_channels=true", "set it false"
        generate = ["-q", "generate", "--out", str(data), str(config), *TINY[:5], *SHARED_VALUES]
        assert main([*generate, "system.steps=20"]) == 0
    train = ["-q", "train", "--no-progress", "--data", str(data), "--out", str(tmp_path / "run"), str(config)]
    assert main([*train, *TINY, override]) == 2
    error = capsys.readouterr().err
    assert "error: data.boundary_channels" in error and fix in error
    assert not (tmp_path / "run" / "checkpoints").exists()
