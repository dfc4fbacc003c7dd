"""`dynaforge rollout --onnx model.onnx --data DIR`: an exported surrogate rolled out with onnxruntime alone.

This module imports onnx, onnxruntime, numpy and h5py and nothing of PyTorch (nor of the dynaforge modules
that import it): it shows that an exported model is usable where PyTorch is not installed. It trusts no
model file: it reads the file once, refuses one that is not a dynaforge export (a folder, a missing path, a
file that is not ONNX, a damaged or foreign ONNX file: `onnx_file.py` tells which, and the message says it)
or that changed since export (its metadata and weights no longer match the checksum of `checksum.py`), and
runs the bytes it checked. No message advises writing over the file it names. It refuses `--frames` and
`--samples` beyond what the data holds rather than take fewer. It reads the dataset folder directly (docs/format.md: the manifest's complete shards of a split, `fields` channels last),
normalises with the statistics stored in the model file, calls the model on its own predictions, and
scores the physical predictions against the stored trajectories with PDEBench's nRMSE per predicted frame
(the `rollout_nrmse` of `dynaforge evaluate`); where the data has an obstacle mask (a channel named
`obstacle`), over the fluid cells and the other channels, as `dynaforge evaluate` scores it
(`metrics.fields.fluid_fields`). A model trained with boundary channels (`data.boundary_channels`; the
exported `model_shape` names them under `boundary`) gets each sample's parameters of those names appended
as constant channels, which are held, not predicted, and not scored; so does one trained with coefficient
channels (`data.parameter_channels`, under `parameters`), 0 for a coefficient the data lacks.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from dynaforge.errors import RunError
from dynaforge.export.checksum import CHECKSUM_KEY, METADATA_KEY, model_checksum
from dynaforge.export.onnx_file import Holds, OnnxFile, read_onnx_file, run_of
from dynaforge.store.format import READABLE_VERSIONS, append_parameter_channels, file_sha256

EPS = 1e-12
"""Floor of a true frame's norm in the nRMSE denominator (as in dynaforge.metrics.fields)."""

OBSTACLE = "obstacle"
"""The channel name of an obstacle mask (as `dynaforge evaluate` reads it)."""


class OnnxRollout(NamedTuple):
    nrmse: list[float]
    """PDEBench nRMSE of each predicted frame, averaged over trajectories and channels (the fluid cells and
    channels where the data has an `obstacle` channel)."""
    predicted: np.ndarray
    """Physical predictions (N, frames, C, *space)."""
    truth: np.ndarray
    """The stored frames they are compared with (N, frames, C, *space)."""
    samples: int


def rollout_onnx(
    model: str | Path,
    data: str | Path,
    split: str = "test",
    frames: int | None = None,
    samples: int | None = None,
) -> OnnxRollout:
    """Roll out every trajectory of `split` (the first `samples`) for `frames` frames (default: all there are).

    Asking for more frames or samples than the data holds is an error that names how many there are."""
    check_counts(frames, samples)
    session, meta = open_checked_model(Path(model))
    shape, stride = meta["model_shape"], int(meta.get("stride", 1))
    history, horizon = int(shape["history"]), int(shape["horizon"])
    stored, names, params = read_split(Path(data), split, samples)  # (N, T, C, *space)
    physical = stored.shape[2]
    boundary = [str(name) for name in shape.get("boundary", ())]
    coefficients = [str(name) for name in shape.get("parameters", ())]
    if boundary or coefficients:  # held like an obstacle mask (`dynaforge.data.boundary`)
        given = [*boundary, *coefficients]
        stored = append_parameter_channels(
            stored, params.values, params.names, given, axis=2, zero_missing=coefficients
        )
    trajectories = stored[:, ::stride]
    check_grid(trajectories, meta, data)
    available = trajectories.shape[1] - history
    if available < 1:
        raise RunError(f"{data}: trajectories of {trajectories.shape[1]} frames leave nothing to predict")
    if frames is not None and frames > available:
        strided = f", {trajectories.shape[1]} at the model's stride {stride}" if stride > 1 else ""
        raise RunError(
            f"--frames {frames} is beyond the data: {data} holds {stored.shape[1]} frames per trajectory"
            f"{strided}, of which the model reads {history} as history, leaving {available} to predict; "
            f"pass --frames {available} or fewer"
        )
    frames = available if frames is None else frames
    mean, std = normalisation(meta, trajectories.ndim - 3)
    window = (trajectories[:, :history] - mean) / std
    predicted = []
    for _ in range(math.ceil(frames / horizon)):
        (step,) = session.run(["next_frames"], {"frames": window.astype(np.float32)})
        predicted.append(step)
        window = np.concatenate([window, step], axis=1)[:, -history:]
    predicted_physical = (np.concatenate(predicted, axis=1)[:, :frames] * std + mean)[:, :, :physical]
    truth = trajectories[:, history : history + frames, :physical]
    obstacle = names.index(OBSTACLE) if OBSTACLE in names else None
    return OnnxRollout(
        nrmse_per_frame(predicted_physical, truth, obstacle), predicted_physical, truth, trajectories.shape[0]
    )


def check_counts(frames: int | None, samples: int | None) -> None:
    for flag, value in (("--frames", frames), ("--samples", samples)):
        if value is not None and value < 1:
            raise RunError(f"{flag} must be at least 1, got {value}; leave it out to take all there are")


class CheckedModel(NamedTuple):
    session: Any
    """An onnxruntime.InferenceSession of the checked bytes."""
    metadata: dict[str, Any]
    """The `dynaforge` metadata written by `dynaforge export`."""


def open_checked_model(path: Path) -> CheckedModel:
    """Read `path` once, check that it is a whole ONNX model written by `dynaforge export` whose metadata
    and weights match the checksum it was written with, and open those very bytes in onnxruntime."""
    try:
        import onnxruntime  # lazy: an optional extra (dynaforge[export])

        found = read_onnx_file(path)
    except ImportError as error:
        raise RunError(
            f"dynaforge rollout --onnx needs onnx and onnxruntime: pip install 'dynaforge[export]' ({error})"
        ) from error
    if found.holds is not Holds.EXPORT:
        raise RunError(unusable_model(path, found))
    metadata = check_checksum(found.proto, found.properties, path)
    try:
        session = onnxruntime.InferenceSession(found.content, providers=["CPUExecutionProvider"])
    except Exception as error:  # onnxruntime raises its own error types for every kind of bad graph
        raise RunError(damaged(path, f"onnxruntime cannot load it: {first_line(error)}")) from error
    return CheckedModel(session, metadata)


# The advice below never names `path` as the --out of an export: `path` may be a file the user wants to
# keep (a checkpoint passed by mistake), and a damaged or modified model is evidence worth keeping too.
EXPORT_NEW = (
    "export the run into a new file with `dynaforge export RUN --out NEW.onnx` and pass --onnx NEW.onnx"
)


def unusable_model(path: Path, found: OnnxFile) -> str:
    """The message for an --onnx that is not a dynaforge export: what `path` holds, and what to pass."""
    detail = f" ({found.detail})" if found.detail else ""
    run = run_of(path)
    if found.holds is Holds.NOTHING:
        return (
            f"{path} is missing (no such file); write a model there with `dynaforge export RUN --out {path}`"
        )
    if found.holds is Holds.FOLDER:
        what = "a run folder" if run is not None else "a folder"
        return f"{path} is {what}, not an ONNX file; {model_in_folder(path, run)}"
    if found.holds is Holds.NOT_ONNX:
        if run is not None:
            return f"{path} is not an ONNX file{detail}: it is a checkpoint of the run {run}; {model_in_folder(run, run)}"
        return f"{path} is not an ONNX file{detail}; rollout runs models written by `dynaforge export`: {EXPORT_NEW}"
    if found.holds is Holds.DAMAGED:
        return damaged(path, found.detail)
    return (
        f"{path} was not written by `dynaforge export` (no dynaforge metadata); rollout runs models "
        f"exported from a dynaforge run: {EXPORT_NEW}"
    )


def model_in_folder(folder: Path, run: Path | None) -> str:
    """What to pass instead of `folder` (or of a checkpoint of the run `folder`)."""
    exported = sorted(folder.glob("*.onnx"))
    if exported:
        return f"pass an exported model file, e.g. --onnx {exported[0]}"
    if run is None:
        return "--onnx takes the .onnx file that `dynaforge export RUN --out FILE.onnx` wrote"
    model = run / "model.onnx"
    return f"export the run with `dynaforge export {run} --out {model}` and pass --onnx {model}"


def check_checksum(proto: Any, properties: dict[str, str], path: Path) -> dict[str, Any]:
    """The dynaforge metadata of the parsed model `proto`, once its checksum matches (else a RunError)."""
    if CHECKSUM_KEY not in properties:
        raise RunError(
            f"{path} carries no checksum of its weights (an export of an older dynaforge); {EXPORT_NEW}"
        )
    try:
        actual = model_checksum(proto, properties[METADATA_KEY])
        metadata = json.loads(properties[METADATA_KEY])
    except (ValueError, TypeError) as error:  # tensors whose bytes do not fit their dims, broken JSON
        raise RunError(
            damaged(path, f"its weights or metadata cannot be read: {first_line(error)}")
        ) from error
    if actual != properties[CHECKSUM_KEY]:
        raise RunError(
            f"{path} was modified after export: its weights or metadata do not match the checksum written "
            f"with them; {EXPORT_NEW}"
        )
    if metadata.get("kind") != "surrogate":
        raise RunError(
            f"{path} holds a {metadata.get('kind')}, not a field surrogate; rollout needs a model exported "
            "from a `dynaforge train` run"
        )
    return metadata


def damaged(path: Path, reason: str) -> str:
    return f"{path} is damaged ({reason}); {EXPORT_NEW}"


def first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


class StoredParams(NamedTuple):
    values: np.ndarray
    """Each sample's parameters (N, P)."""
    names: list[str]


def read_split(root: Path, split: str, samples: int | None) -> tuple[np.ndarray, list[str], StoredParams]:
    """Every complete shard of `split`, in order: fields (N, T, C, *space) float32, channels first, the
    channel names (the first shard's `channel_names`; `u`, `u0`, ... where it has none) and the samples'
    parameters."""
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        raise RunError(
            f"{root} is not a dataset folder (no manifest.json); make one with `dynaforge generate`"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version") not in READABLE_VERSIONS or not manifest.get("complete"):
        raise RunError(
            f"{root} is not a complete dataset of format version "
            f"{' or '.join(map(str, READABLE_VERSIONS))}; check it with `dynaforge inspect`"
        )
    shards = sorted(
        (s for s in manifest["shards"] if s.get("split") == split and s.get("complete")),
        key=lambda s: s["index"],
    )
    if not shards:
        raise RunError(f"{root} has no {split} samples")
    parts, params = [], []
    names: list[str] = []
    param_names: list[str] = []
    count = 0
    for shard in shards:
        check_shard(root, shard)
        with h5py.File(root / shard["file"], "r") as handle:
            parts.append(np.asarray(handle["fields"][: None if samples is None else samples - count]))
            params.append(np.asarray(handle["params"][: parts[-1].shape[0]], dtype=np.float64))
            param_names = param_names or [
                n.decode() if isinstance(n, bytes) else str(n) for n in handle["param_names"][...]
            ]
            names = names or [str(n) for n in handle.attrs.get("channel_names", [])]
        count += parts[-1].shape[0]
        if samples is not None and count >= samples:
            break
    if samples is not None and count < samples:
        raise RunError(
            f"--samples {samples} is beyond the data: the {split} split of {root} holds {count} "
            f"trajectories; pass --samples {count} or fewer"
        )
    fields = np.concatenate(parts).astype(np.float32)  # (N, T, *space, C)
    return (
        np.ascontiguousarray(np.moveaxis(fields, -1, 2)),
        names,
        StoredParams(np.concatenate(params), param_names),
    )


def check_shard(root: Path, record: dict[str, Any]) -> None:
    """The shard's SHA-256 against its manifest record, as the store's readers check it."""
    path = root / record["file"]
    if file_sha256(path) != record.get("sha256"):
        raise RunError(
            f"{path}: its SHA-256 differs from the one {root / 'manifest.json'} records for it (modified or "
            f"damaged); run `dynaforge inspect {root}` and regenerate it with `dynaforge generate`"
        )


def check_grid(trajectories: np.ndarray, meta: dict[str, Any], data: str | Path) -> None:
    channels, space = int(meta["model_shape"]["channels"]), list(meta["space"])
    if trajectories.shape[2] != channels or list(trajectories.shape[3:]) != space:
        raise RunError(
            f"{data} holds frames of {trajectories.shape[2]} channel(s) on a {list(trajectories.shape[3:])} grid; "
            f"the model was exported for {channels} channel(s) on {space}: export it for this data's grid"
        )


def normalisation(meta: dict[str, Any], spatial_dims: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-channel mean and std, shaped to broadcast over (N, T, C, *space)."""
    view = (1, 1, -1) + (1,) * spatial_dims
    stats = meta["normalization"]
    mean = np.asarray(stats["mean"], dtype=np.float64).reshape(view)
    std = np.asarray(stats["std"], dtype=np.float64).reshape(view)
    return mean.astype(np.float32), std.astype(np.float32)


def nrmse_per_frame(prediction: np.ndarray, truth: np.ndarray, obstacle: int | None = None) -> list[float]:
    """PDEBench nRMSE per frame: ||error||_2 / ||truth||_2 over the grid, per sample, frame and channel,
    averaged over samples and channels. With an `obstacle` channel (1 inside the obstacle): that channel
    left out and both fields zero where the true frame's mask is >= 1/2, so the norms run over the fluid
    cells alone (`metrics.fields.fluid_fields`)."""
    prediction, truth = prediction.astype(np.float64), truth.astype(np.float64)
    if obstacle is not None:
        fluid = truth[:, :, obstacle : obstacle + 1] < 0.5
        kept = [c for c in range(truth.shape[2]) if c != obstacle]
        prediction, truth = (np.where(fluid, fields[:, :, kept], 0.0) for fields in (prediction, truth))
    points = (*truth.shape[:3], -1)
    error = (prediction - truth).reshape(points)
    norm = np.linalg.norm(truth.reshape(points), axis=-1)
    ratio = np.linalg.norm(error, axis=-1) / np.maximum(norm, EPS)
    return [float(v) for v in ratio.mean(axis=(0, 2))]
