"""`dynaforge export RUN --out model.onnx`: a run's model as ONNX, verified in onnxruntime against PyTorch.

Three kinds of run, told apart by the checkpoint:
- a surrogate of `dynaforge.models.MODELS` (any registry model, loaded with `load_surrogate`): input
  `frames` (batch, history, channels, *space), normalised; output `next_frames` (batch, horizon, channels,
  *space). The grid is fixed at the trained resolution; the batch axis is dynamic.
- the latent stack's flow network (a stage run of `train/stages.py`): inputs `state`, `time`, `condition`,
  `params`; output `velocity` (see `FlowInput`).
- the N-body step controller (`dynaforge nbody train`): input `features` (batch, features) (and `history`
  (batch, K, features) when it reads a history), float64; output `log_step` (batch,), log(h / T0).

The exporter is torch.export-based (`torch.onnx.export(..., dynamo=True)`): the TorchScript exporter has no
FFT, which an FNO built with `spectral_transform: fft` needs (with the DFT-matrix transform both exporters
work; the weights are real tensors either way, so the graph has no complex parameters;
benchmarks/onnx_export_fno.py records both exporters). The model file carries what a user of
it needs in its metadata (`dynaforge` key, JSON): the kind, the model config and shape, the normalisation
statistics, the input and output names, the opset; beside it (`dynaforge_sha256`) the SHA-256 of that
metadata and the weights (`checksum.py`), which `dynaforge rollout` checks before using the file.

Verification runs the file in onnxruntime and PyTorch on random inputs (a batch size other than the
export example's, to exercise the dynamic axis) and real inputs (test windows of the dataset trained on;
the controller's training states), prints the largest absolute and relative differences, and raises
`ExportError` above tolerance.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
import logging
import typing
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.atomic import atomic_path
from dynaforge.data.boundary import stored_fields_with_boundary
from dynaforge.errors import RunError
from dynaforge.export.checksum import CHECKSUM_KEY, METADATA_KEY, model_checksum
from dynaforge.export.onnx_file import Holds, read_onnx_file
from dynaforge.models import (
    LoadedModel,
    ModelInput,
    ModelOutput,
    ModelShape,
    load_surrogate,
    model_from_checkpoint,
)
from dynaforge.models.flow import FlowInput, FlowOutput
from dynaforge.models.loading import CONTROLLER_KIND
from dynaforge.models.step_controller import StepControllerInput, StepControllerNet
from dynaforge.runs import load_checkpoint, run_folder
from dynaforge.store import DatasetFolder
from dynaforge.systems.nbody.control import controller_features, system_scales
from dynaforge.systems.nbody.physics import BodyState, gravity, make_params

log = logging.getLogger(__name__)

OPSET = 20
"""ONNX opset of every export (DFT with its length as an input, needed by the FNO, is opset >= 20)."""
TOLERANCE = {torch.float32: (1e-5, 1e-4), torch.float64: (1e-10, 1e-8)}
"""dtype -> (absolute, relative): onnxruntime may differ from PyTorch by atol + rtol * max |PyTorch|."""
CHATTY_LOGGERS = ("onnx_ir", "onnxscript", "torch.onnx")
"""Loggers that report each graph pass at INFO level (and torchvision's absence as a warning)."""
RANDOM_BATCH = 3
EXAMPLE_BATCH = 2
REAL_SAMPLES = 8


class ExportError(RunError):
    """An export that failed or does not match PyTorch within tolerance."""


class Check(NamedTuple):
    name: str
    """`random` or `real`."""
    max_abs: float
    relative: float
    """max_abs / max |PyTorch output|."""
    tolerance: float
    """Largest max_abs accepted: atol + rtol * max |PyTorch output|."""

    def describe(self) -> str:
        """One line for `dynaforge export` (a check that is kept passed: a failed one raises)."""
        return (
            f"{self.name:<7} max |onnxruntime - torch| {self.max_abs:.3e}  relative {self.relative:.3e}  "
            f"(tolerance {self.tolerance:.1e}) ok"
        )


class ExportResult(NamedTuple):
    path: Path
    opset: int
    inputs: list[str]
    outputs: list[str]
    checks: list[Check]


class Exportable(NamedTuple):
    """What to export: a module of plain tensors, its input and output names, example and check inputs."""

    module: nn.Module
    """What is exported."""
    reference: nn.Module
    """What the export is verified against (the model's own forward)."""
    input_names: list[str]
    output_names: list[str]
    example: tuple[Tensor, ...]
    random: tuple[Tensor, ...]
    real: tuple[Tensor, ...]
    metadata: dict[str, Any]


class FramesToNextFrames(nn.Module):
    """A registry surrogate with plain tensors in and out: frames (B, history, C, *space) -> (B, horizon, C, *space)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, frames: Float[Tensor, "batch history channels *space"]
    ) -> Float[Tensor, "batch horizon channels *space"]:
        return self.model(ModelInput(frames=frames)).frames


class FlowToVelocity(nn.Module):
    """The latent stack's flow network with plain tensors: (state, time, condition, params) -> velocity."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(
        self,
        state: Float[Tensor, "batch channels *space"],
        time: Float[Tensor, " batch"],
        condition: Float[Tensor, "batch frames channels *space"],
        params: Float[Tensor, "batch parameters"],
    ) -> Float[Tensor, "batch channels *space"]:
        return self.model(FlowInput(state=state, time=time, condition=condition, params=params)).velocity


class FeaturesToLogStep(nn.Module):
    """The step controller with plain tensors: features (B, F) [, history (B, K, F)] -> log(h / T0) (B,)."""

    def __init__(self, net: StepControllerNet) -> None:
        super().__init__()
        self.net = net

    def forward(
        self,
        features: Float[Tensor, "batch features"],
        history: Float[Tensor, "batch k features"] | None = None,
    ) -> Float[Tensor, " batch"]:
        return self.net(StepControllerInput(features=features, history=history)).log_step


def export_run(
    run: str | Path,
    out: str | Path,
    checkpoint: str = "best",
    data: str | Path | None = None,
    force: bool = False,
) -> ExportResult:
    """Export the `checkpoint` (best or last) of run folder `run` to `out`, then verify it (see module doc).

    An existing `out` is replaced only when it is an earlier dynaforge export (or with `force`)."""
    check_replaceable(Path(out), force)
    folder = run_folder(run)
    state = load_checkpoint(folder.checkpoint(checkpoint))
    if state.get("kind") == CONTROLLER_KIND:
        exportable = controller_exportable(state)
    else:
        loaded = load_surrogate(state)
        if follows_contract(type(loaded.model), FlowInput, FlowOutput):
            exportable = flow_exportable(loaded, data)
        else:
            exportable = surrogate_exportable(loaded, data)
    path = export_module(exportable, Path(out))
    checks = verify(path, exportable)
    return ExportResult(path, OPSET, exportable.input_names, exportable.output_names, checks)


def check_replaceable(out: Path, force: bool) -> None:
    """Refuse, before any work, an `out` that is a folder, or a file other than a dynaforge export unless
    `force`: --out names the file to write, and a mistyped one must not cost the user a checkpoint."""
    found = read_onnx_file(out)
    if found.holds is Holds.FOLDER:
        raise ExportError(
            f"--out {out} is a folder; --out takes the .onnx file to write, e.g. --out {out / 'model.onnx'}"
        )
    if found.holds in (Holds.NOTHING, Holds.EXPORT) or force:
        return
    detail = f": {found.detail}" if found.detail else ""
    raise ExportError(
        f"--out {out} already exists and is not a dynaforge export ({found.holds.value}{detail}); nothing "
        "was written. Choose a new --out file, or add --force to replace it (what it holds is lost)"
    )


# ---- what to export ---------------------------------------------------------------------------------


def surrogate_exportable(loaded: LoadedModel, data: str | Path | None) -> Exportable:
    """A registry model from its checkpoint, with random frames and real test windows to check it on."""
    model, shape, state = loaded.model, loaded.shape, loaded.checkpoint
    check_surrogate_contract(model)
    frames = real_frames(loaded, data)
    space = tuple(frames.shape[3:])
    generator = torch.Generator().manual_seed(0)

    def random(batch: int) -> Tensor:
        size = (batch, shape.history, shape.channels, *space)
        return torch.randn(size, generator=generator, dtype=torch.float32)

    metadata = {
        **field_model_metadata("surrogate", state, shape, space),
        "stride": int(state["config"]["data"]["stride"]),
        "inputs": {"frames": ["batch", "history", "channels", *(f"space{i}" for i in range(len(space)))]},
        "outputs": {
            "next_frames": ["batch", "horizon", "channels", *(f"space{i}" for i in range(len(space)))]
        },
    }
    wrapper = FramesToNextFrames(model).eval()
    return Exportable(
        wrapper,
        wrapper,
        ["frames"],
        ["next_frames"],
        (random(EXAMPLE_BATCH),),
        (random(RANDOM_BATCH),),
        (frames,),
        metadata,
    )


def field_model_metadata(
    kind: str, state: Mapping[str, Any], shape: ModelShape, space: Sequence[int]
) -> dict[str, Any]:
    """What the ONNX metadata of a model on fields holds beside its inputs and outputs."""
    return {
        "kind": kind,
        "model": state["config"]["model"],
        "model_shape": shape._asdict(),
        "space": list(space),
        "normalization": state["normalization"],
    }


def follows_surrogate_contract(model_class: type[nn.Module]) -> bool:
    """True when `model_class.forward` takes a ModelInput first and returns a ModelOutput."""
    return follows_contract(model_class, ModelInput, ModelOutput)


def follows_contract(model_class: type[nn.Module], takes: type, returns: type) -> bool:
    """True when `model_class.forward` takes a `takes` first and returns a `returns`."""
    hints = typing.get_type_hints(model_class.forward)
    parameters = [name for name in inspect.signature(model_class.forward).parameters if name != "self"]
    first = hints.get(parameters[0]) if parameters else None
    return first is takes and hints.get("return") is returns


def exportable_model(model_class: type[nn.Module]) -> bool:
    """True for the registry models `dynaforge export` writes: surrogates and the latent stack's flow net."""
    return follows_surrogate_contract(model_class) or follows_contract(model_class, FlowInput, FlowOutput)


def flow_exportable(loaded: LoadedModel, data: str | Path | None) -> Exportable:
    """The flow network of a `diffusion_residual`, `consistency_distill` or `steady_prior` stage. Random
    inputs, and real ones: test frames of the dataset as the conditioning frames, Gaussian noise as the
    state (where a sampler starts), flow times spread over [0, 1], the mean parameters."""
    model, shape, state = loaded.model, loaded.shape, loaded.checkpoint
    config = model.config
    frames = real_frames(loaded, data)  # (N, history, C, *space)
    space = tuple(frames.shape[3:])
    generator = torch.Generator().manual_seed(0)

    def random(batch: int) -> tuple[Tensor, ...]:
        def normal(*size: int) -> Tensor:
            return torch.randn(size, generator=generator, dtype=torch.float32)

        condition = normal(batch, config.condition_frames, shape.channels, *space)
        time = torch.rand((batch,), generator=generator, dtype=torch.float32)
        return normal(batch, shape.channels, *space), time, condition, normal(batch, config.parameters)

    n = frames.shape[0]
    last = frames[:, -1:]  # (N, 1, C, *space)
    real = (
        torch.randn((n, shape.channels, *space), generator=generator, dtype=torch.float32),
        torch.linspace(0.0, 1.0, n, dtype=torch.float32),
        last.expand(n, config.condition_frames, *last.shape[2:]).contiguous(),
        torch.zeros((n, config.parameters), dtype=torch.float32),
    )
    axes = [f"space{i}" for i in range(len(space))]
    metadata = {
        **field_model_metadata("flow", state, shape, space),
        "inputs": {
            "state": ["batch", "channels", *axes],
            "time": ["batch"],
            "condition": ["batch", "frames", "channels", *axes],
            "params": ["batch", "parameters"],
        },
        "outputs": {"velocity": ["batch", "channels", *axes]},
    }
    wrapper = FlowToVelocity(model).eval()
    return Exportable(
        wrapper,
        wrapper,
        ["state", "time", "condition", "params"],
        ["velocity"],
        random(EXAMPLE_BATCH),
        random(RANDOM_BATCH),
        real,
        metadata,
    )


def check_surrogate_contract(model: nn.Module) -> None:
    """Export handles the surrogate contract (ModelInput -> ModelOutput); say so for any other model."""
    if not follows_surrogate_contract(type(model)):
        raise ExportError(
            f"{type(model).__name__}.forward does not follow the surrogate contract ModelInput -> ModelOutput "
            "that `dynaforge export` writes as frames -> next_frames; export the surrogate that uses it instead"
        )


def real_frames(loaded: LoadedModel, data: str | Path | None) -> Tensor:
    """Normalised input windows from the first test trajectories of the dataset (default: the trained one)."""
    shape = loaded.shape
    root = Path(data) if data is not None else Path(str(loaded.checkpoint.get("data", "")))
    if not root.exists():
        raise ExportError(
            f"the dataset {root} the run was trained on is not here; the real-input check needs one: pass "
            "--data DIR (a dataset of the same system and grid)"
        )
    dataset = DatasetFolder(root)
    count = min(REAL_SAMPLES, dataset.split_size("test"))
    if count == 0:
        raise ExportError(f"{root} has an empty test split; pass --data with a dataset that has test samples")
    # (N, T, *space, C); only these samples' shards are read
    test = dataset.read_split("test", count)
    fields = stored_fields_with_boundary(
        test.fields, test.params, test.param_names, shape.boundary, shape.parameters
    )
    channels_first = np.moveaxis(fields, -1, 2)[:, : shape.history]  # (N, history, C, *space)
    frames = torch.as_tensor(np.ascontiguousarray(channels_first), dtype=torch.float32)
    return loaded.normalizer.physical_to_normalized(frames, shape.spatial_dims)


def controller_exportable(state: dict[str, Any]) -> Exportable:
    """The step controller, with random features and the features of its own training states."""
    net = model_from_checkpoint(state).eval()
    assert isinstance(net, StepControllerNet)  # what the controller kind builds
    features = controller_training_features(state)
    count = features.shape[1]
    generator = torch.Generator().manual_seed(0)

    def random(batch: int) -> tuple[Tensor, ...]:
        # Spread wide enough that some outputs reach the soft clamp at +-LOG_STEP_LIMIT.
        values = (40.0 * torch.randn((batch, count), generator=generator, dtype=torch.float64),)
        if net.history:
            values += (torch.randn((batch, net.history, count), generator=generator, dtype=torch.float64),)
        return values

    real: tuple[Tensor, ...] = (features,)
    names = ["features"]
    if net.history:
        real += (torch.zeros((features.shape[0], net.history, count), dtype=torch.float64),)
        names.append("history")
    metadata = {
        "kind": "step_controller",
        "model_config": dict(state["model_config"]),
        "feature_names": list(state["feature_names"]),
        "inputs": {
            "features": ["batch", "features"],
            **({"history": ["batch", "k", "features"]} if net.history else {}),
        },
        "outputs": {"log_step": ["batch"]},
    }
    return Exportable(
        FeaturesToLogStep(net).eval(),
        FeaturesToLogStep(net).eval(),
        names,
        ["log_step"],
        random(EXAMPLE_BATCH),
        random(RANDOM_BATCH),
        real,
        metadata,
    )


def controller_training_features(state: dict[str, Any]) -> Tensor:
    """Controller features (float64) of the start states of the first training group in the checkpoint."""
    systems = state["training_systems"]
    group = sorted({key.split("/")[0] for key in systems})[0]
    take = slice(0, REAL_SAMPLES)
    body_state = BodyState(systems[f"{group}/positions"][take], systems[f"{group}/velocities"][take])
    params = make_params(systems[f"{group}/masses"][take], systems[f"{group}/softening"][take])
    current = gravity(body_state.positions, params)
    scales = system_scales(body_state, params, current.potential)
    return controller_features(body_state, current, params, scales).to(torch.float64)


# ---- export and verification ------------------------------------------------------------------------


def export_module(exportable: Exportable, out: Path) -> Path:
    """Export with the torch.export-based exporter: named inputs and outputs, a dynamic batch axis."""
    import onnx  # lazy: an optional extra (dynaforge[export])

    batch = torch.export.Dim("batch", min=1)
    dynamic_shapes = {name: {0: batch} for name in exportable.input_names}
    try:
        with quiet_exporter(), torch.no_grad():
            program = torch.onnx.export(
                exportable.module,
                exportable.example,
                input_names=exportable.input_names,
                output_names=exportable.output_names,
                dynamic_shapes=dynamic_shapes,
                opset_version=OPSET,
                dynamo=True,
                verbose=False,
            )
    except Exception as error:  # the exporter's failures come in many types; one clear message
        raise ExportError(f"ONNX export failed: {type(error).__name__}: {first_line(error)}") from error
    assert program is not None
    model = program.model_proto
    metadata = json.dumps({**exportable.metadata, "opset": OPSET, "torch": torch.__version__})
    checksum = model_checksum(model, metadata)
    onnx.helper.set_model_props(model, {METADATA_KEY: metadata, CHECKSUM_KEY: checksum})
    out.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(out) as temporary:
        onnx.save_model(model, str(temporary))
    onnx.checker.check_model(str(out))
    return out


def verify(path: Path, exportable: Exportable) -> list[Check]:
    """Compare onnxruntime with PyTorch on the random and the real inputs; ExportError above tolerance."""
    import onnxruntime  # lazy: an optional extra (dynaforge[export])

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    checks = []
    for name, inputs in (("random", exportable.random), ("real", exportable.real)):
        with torch.inference_mode():
            expected = exportable.reference(*inputs).numpy()
        feed = {n: t.numpy() for n, t in zip(exportable.input_names, inputs)}
        (actual,) = session.run(exportable.output_names, feed)
        check = compare(name, actual, expected, inputs[0].dtype)
        log.info("%s inputs: max abs difference %.3e, relative %.3e", name, check.max_abs, check.relative)
        if check.max_abs > check.tolerance or actual.shape != expected.shape:
            raise ExportError(
                f"{path}: onnxruntime differs from PyTorch on {name} inputs by {check.max_abs:.3e} (relative "
                f"{check.relative:.3e}), above the tolerance {check.tolerance:.3e}; shapes {actual.shape} and "
                f"{expected.shape}. The exported file is kept for inspection; please report this model."
            )
        checks.append(check)
    return checks


def compare(name: str, actual: np.ndarray, expected: np.ndarray, dtype: torch.dtype) -> Check:
    atol, rtol = TOLERANCE[dtype]
    scale = float(np.abs(expected).max()) if expected.size else 0.0
    difference = float(np.abs(actual.astype(np.float64) - expected.astype(np.float64)).max())
    return Check(name, difference, difference / max(scale, 1e-30), atol + rtol * scale)


@contextlib.contextmanager
def quiet_exporter() -> Iterator[None]:
    """The exporter prints progress lines and warns about its own internals; keep the command's output to
    the results (a failure still raises, with its message)."""
    loggers = [logging.getLogger(name) for name in CHATTY_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:400] if text else ""
