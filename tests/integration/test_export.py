"""`dynaforge export` and `dynaforge rollout --onnx`: every registry model and the N-body step controller
export to ONNX and match onnxruntime; the exported surrogate rolls out without PyTorch."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import NamedTuple

import numpy as np
import pytest
import torch

pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from dynaforge.cli import main
from dynaforge.config import MODEL_CONFIGS, Config, FNOConfig, UNetConfig, config_to_dict, load_config
from dynaforge.data import Normalizer
from dynaforge.evaluate.rollout import rollouts
from dynaforge.export.onnx_export import (
    OPSET,
    ExportError,
    check_surrogate_contract,
    export_run,
    exportable_model,
    follows_surrogate_contract,
    surrogate_exportable,
    verify,
)
from dynaforge.export.onnx_rollout import rollout_onnx
from dynaforge.generate import generate
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.models import (
    MODELS,
    ModelInput,
    ModelShape,
    build_model,
    load_surrogate,
    model_from_checkpoint,
)
from dynaforge.runs import CHECKPOINT_VERSION, save_checkpoint
from dynaforge.store import DatasetFolder
from dynaforge.train import train
from dynaforge.train.step_controller import train_controller
from tests.conftest import CONFIGS

TINY_2D = [
    "system.name=navier_stokes",
    "system.resolution=32",
    "system.steps=6",
    "system.save_every=2",
    "system.dt=0.01",
    "dataset.n_train=2",
    "dataset.n_val=1",
    "dataset.n_test=2",
    "dataset.shard_size=2",
    "dataset.batch_size=2",
]


@pytest.fixture(scope="module")
def tiny_data_2d(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 32 x 32 Navier-Stokes dataset (for registry models that take two spatial axes; 32 points leave the
    default FNO its 16 modes)."""
    root = tmp_path_factory.mktemp("tiny-2d") / "data"
    generate(load_config(CONFIGS / "tiny.yaml", TINY_2D), root, progress=False)
    return root


def fitting_shapes(model_name: str, data: dict[int, Path]) -> list[tuple[ModelShape, Path]]:
    """Each of 1 and 2 spatial axes on which the registry model's default config builds and runs."""
    fitting, errors = [], []
    for dims, root in data.items():
        shape = ModelShape(channels=1, history=2, horizon=1, spatial_dims=dims)
        fields = DatasetFolder(root).read_split("test").fields
        frames = torch.as_tensor(np.moveaxis(fields, -1, 2)[:1, :2].copy(), dtype=torch.float32)
        try:
            model = build_model(MODEL_CONFIGS[model_name](), shape).eval()
            with torch.inference_mode():
                model(ModelInput(frames=frames))
        except ValueError as error:
            errors.append(f"{dims}D: {error}")
            continue
        fitting.append((shape, root))
    assert fitting, f"model {model_name} runs on neither tiny dataset: {errors}"
    return fitting


def write_random_checkpoint(
    run: Path, model_name: str, shape: ModelShape, data: Path, config: Config | None = None
) -> None:
    """A run folder whose best.pt holds the registry model with random weights (residual paths included:
    a zero-initialised last layer would make the check trivial)."""
    config = config or Config(model=MODEL_CONFIGS[model_name]())
    model = build_model(config.model, shape)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            noise = torch.randn(parameter.shape, generator=generator, dtype=parameter.dtype)
            parameter.copy_(parameter + 0.1 * noise)  # in place on purpose: set the weights
    stats = DatasetFolder(data).manifest["stats"]
    state = {
        "format_version": CHECKPOINT_VERSION,
        "model": model.state_dict(),
        "config": config_to_dict(config),
        "model_shape": shape._asdict(),
        "normalization": Normalizer.from_stats(stats).to_dict(),
        "data": str(data),
    }
    save_checkpoint(run / "checkpoints" / "best.pt", state)


@pytest.mark.parametrize("model_name", sorted(MODELS))
def test_every_registry_model_exports_and_matches_onnxruntime_in_1d_and_2d(
    model_name: str, tmp_path: Path, tiny_data: Path, tiny_data_2d: Path, one_thread: None
) -> None:
    import onnxruntime

    if not follows_surrogate_contract(MODELS[model_name]):
        assert exportable_model(MODELS[model_name]), f"{model_name}: no export path"
        pytest.skip(f"{model_name} is not a surrogate; its own export test covers it")
    for shape, data in fitting_shapes(model_name, {1: tiny_data, 2: tiny_data_2d}):
        folder = tmp_path / f"{shape.spatial_dims}d"
        write_random_checkpoint(folder / "run", model_name, shape, data)
        result = export_run(folder / "run", folder / "model.onnx")  # raises above tolerance
        assert [c.name for c in result.checks] == ["random", "real"]
        for check in result.checks:
            assert check.max_abs <= check.tolerance
            assert check.relative < 1e-4
        assert result.inputs == ["frames"] and result.outputs == ["next_frames"] and result.opset == OPSET

        session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
        (frames,) = session.get_inputs()
        assert frames.name == "frames" and isinstance(frames.shape[0], str)  # a named, dynamic batch axis
        meta = json.loads(session.get_modelmeta().custom_metadata_map["dynaforge"])
        assert meta["model"]["name"] == model_name and meta["opset"] == OPSET
        space = tuple(meta["space"])
        assert len(space) == shape.spatial_dims
        batch = np.zeros((5, shape.history, shape.channels, *space), dtype=np.float32)
        (output,) = session.run(["next_frames"], {"frames": batch})
        assert output.shape == (5, shape.horizon, shape.channels, *space)


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory: pytest.TempPathFactory, tiny_data: Path) -> tuple[Path, Path]:
    """A one-epoch run of configs/tiny.yaml (a small FNO) exported with `dynaforge export`: (run, model.onnx)."""
    root = tmp_path_factory.mktemp("trained-export")
    config = load_config(CONFIGS / "tiny.yaml", ["train.epochs=1", "train.device=cpu"])
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        train(config, tiny_data, root / "run", progress=False)
        assert main(["-q", "export", str(root / "run"), "--out", str(root / "model.onnx")]) == 0
    finally:
        torch.set_num_threads(previous)
    return root / "run", root / "model.onnx"


def test_exported_run_rolls_out_without_torch(
    trained_export: tuple[Path, Path], tiny_data: Path, one_thread: None
) -> None:
    run, onnx_path = trained_export
    state = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    model = model_from_checkpoint(state).eval()
    shape = ModelShape(**state["model_shape"])
    fields = DatasetFolder(tiny_data).read_split("test").fields
    frames = 6
    reference = rollouts(
        model,
        Normalizer.from_stats(state["normalization"]),
        fields,
        shape,
        1,
        0,
        frames,
        8,
        torch.device("cpu"),
    )
    expected = nrmse_per_frame(reference.predicted, reference.truth).tolist()  # what `evaluate` reports

    # The same rollout with onnxruntime + numpy + h5py.
    result = rollout_onnx(onnx_path, tiny_data, frames=frames)
    assert result.samples == 4
    np.testing.assert_allclose(result.nrmse, expected, rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(result.truth, reference.truth.numpy())

    # The CLI path imports no PyTorch at all.
    script = (
        "import sys\n"
        "from dynaforge.cli import main\n"
        f"code = main(['rollout', '--onnx', {str(onnx_path)!r}, '--data', {str(tiny_data)!r}, '--frames', '6'])\n"
        "assert code == 0, code\n"
        "loaded = sorted(m for m in sys.modules if m == 'torch' or m.startswith('torch.'))\n"
        "print('TORCH', loaded)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "TORCH []" in done.stdout
    assert f"rollout nRMSE, step 6   {expected[5]:.4e}" in done.stdout


@pytest.mark.parametrize("history", [0, 2])
def test_step_controller_exports_and_matches_onnxruntime(
    tmp_path: Path, history: int, one_thread: None
) -> None:
    config = load_config(CONFIGS / "nbody_tiny.yaml", [f"timestepper.model.history={history}"])
    train_controller(config, tmp_path / "ctrl")
    result = export_run(tmp_path / "ctrl", tmp_path / "ctrl.onnx")
    assert result.inputs == (["features", "history"] if history else ["features"])
    assert result.outputs == ["log_step"]
    for check in result.checks:
        assert check.max_abs <= check.tolerance
        assert check.relative < 1e-12  # float64 throughout


def test_onnx_rollout_follows_horizon_and_stride_like_the_torch_rollout(
    tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    # Two frames per call from every second stored frame: 11 frames -> 6, 2 in, 4 predicted in 2 calls.
    config = load_config(None, ["model.width=8", "model.modes=8", "model.layers=1", "data.stride=2"])
    shape = ModelShape(channels=1, history=2, horizon=2, spatial_dims=1)
    write_random_checkpoint(tmp_path / "run", "fno", shape, tiny_data, config)
    export_run(tmp_path / "run", tmp_path / "model.onnx")
    state = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    fields = DatasetFolder(tiny_data).read_split("test").fields
    reference = rollouts(
        model_from_checkpoint(state).eval(),
        Normalizer.from_stats(state["normalization"]),
        fields,
        shape,
        2,
        0,
        4,
        8,
        torch.device("cpu"),
    )
    result = rollout_onnx(tmp_path / "model.onnx", tiny_data)
    assert result.predicted.shape == (4, 4, 1, 64)
    np.testing.assert_allclose(result.truth, reference.truth.numpy())
    np.testing.assert_allclose(result.predicted, reference.predicted.numpy(), rtol=1e-4, atol=1e-5)
    expected = nrmse_per_frame(reference.predicted, reference.truth).tolist()
    np.testing.assert_allclose(result.nrmse, expected, rtol=1e-4, atol=1e-6)


def test_a_mismatch_above_tolerance_is_an_error(trained_export: tuple[Path, Path], one_thread: None) -> None:
    run, onnx_path = trained_export
    # Verify the exported file against a model whose weights moved: the difference must be caught.
    state = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    exportable = surrogate_exportable(load_surrogate(state), None)
    verify(onnx_path, exportable)  # the model it was exported from passes
    with torch.no_grad():
        first = next(exportable.reference.parameters())
        first.add_(1e-2)  # in place on purpose: perturb the reference
    with pytest.raises(ExportError, match="differs from PyTorch"):
        verify(onnx_path, exportable)


def test_rollout_refuses_a_grid_the_model_was_not_exported_for(
    trained_export: tuple[Path, Path], tiny_data_2d: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _, onnx_path = trained_export
    assert main(["-q", "rollout", "--onnx", str(onnx_path), "--data", str(tiny_data_2d)]) == 2
    assert "export it for this data's grid" in capsys.readouterr().err


class Denoiser(torch.nn.Module):
    """A model of another contract (its own NamedTuple in), as a registry may also hold."""

    class Inputs(NamedTuple):
        state: torch.Tensor
        time: torch.Tensor

    def forward(self, inputs: Denoiser.Inputs) -> torch.Tensor:
        return inputs.state * inputs.time[:, None]


def test_a_model_of_another_contract_is_refused_with_a_clear_error() -> None:
    assert not follows_surrogate_contract(Denoiser)
    assert all(follows_surrogate_contract(MODELS[name]) for name in ("fno", "unet"))
    with pytest.raises(ExportError, match="surrogate contract ModelInput -> ModelOutput"):
        check_surrogate_contract(Denoiser())


def test_the_latent_stacks_flow_net_exports_and_matches_onnxruntime(
    tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    import onnxruntime

    shape = ModelShape(channels=1, history=2, horizon=1, spatial_dims=1)
    config = Config(model=MODEL_CONFIGS["flow"](parameters=2))
    write_random_checkpoint(tmp_path / "run", "flow", shape, tiny_data, config)
    result = export_run(tmp_path / "run", tmp_path / "flow.onnx")  # raises above tolerance
    assert result.inputs == ["state", "time", "condition", "params"] and result.outputs == ["velocity"]
    assert [c.name for c in result.checks] == ["random", "real"]
    assert all(c.max_abs <= c.tolerance for c in result.checks)

    session = onnxruntime.InferenceSession(str(result.path), providers=["CPUExecutionProvider"])
    meta = json.loads(session.get_modelmeta().custom_metadata_map["dynaforge"])
    n = meta["space"][0]
    frames = config.model.condition_frames
    feeds = {
        "state": np.zeros((5, 1, n), dtype=np.float32),
        "time": np.full((5,), 0.5, dtype=np.float32),
        "condition": np.zeros((5, frames, 1, n), dtype=np.float32),
        "params": np.zeros((5, 2), dtype=np.float32),
    }
    (velocity,) = session.run(["velocity"], feeds)
    assert velocity.shape == (5, 1, n)


@pytest.mark.parametrize(
    "model",
    [FNOConfig(width=8, modes=4, layers=2, projection=16, domain_padding=0.25), UNetConfig(padding="zeros")],
)
def test_models_for_walled_data_export_and_match_onnxruntime(
    model: FNOConfig | UNetConfig, tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    """The FNO's domain padding (pad, then crop) and the U-Net's zero padding survive the ONNX export."""
    shape = ModelShape(channels=1, history=1, horizon=1)
    write_random_checkpoint(tmp_path / "run", model.name, shape, tiny_data, Config(model=model))
    result = export_run(tmp_path / "run", tmp_path / "model.onnx")  # raises above tolerance
    assert all(check.relative < 1e-4 for check in result.checks)
