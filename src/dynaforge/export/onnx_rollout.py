"""`dynaforge rollout --onnx model.onnx --data DIR`: an exported surrogate rolled out with onnxruntime alone.

This module imports onnxruntime, numpy and h5py and nothing of PyTorch (nor of the dynaforge modules that
import it): it shows that an exported model is usable where PyTorch is not installed. It reads the dataset
folder directly (docs/format.md: the manifest's complete shards of a split, `fields` channels last),
normalises with the statistics stored in the model file, calls the model on its own predictions, and
scores the physical predictions against the stored trajectories with PDEBench's nRMSE per predicted frame
(the `rollout_nrmse` of `dynaforge evaluate`).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, NamedTuple

import h5py
import numpy as np

from dynaforge.errors import RunError

EPS = 1e-12
"""Floor of a true frame's norm in the nRMSE denominator (as in dynaforge.metrics.fields)."""


class OnnxRollout(NamedTuple):
    nrmse: list[float]
    """PDEBench nRMSE of each predicted frame, averaged over trajectories and channels."""
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
    """Roll out every trajectory of `split` (the first `samples`) for `frames` frames (default: all there are)."""
    try:
        import onnxruntime  # lazy: an optional extra (dynaforge[export]); the error names it
    except ImportError as error:
        raise RunError("dynaforge rollout --onnx needs onnxruntime: pip install onnxruntime") from error
    if not Path(model).is_file():
        raise RunError(f"{model} does not exist; write it with `dynaforge export RUN --out {model}`")
    session = onnxruntime.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    meta = model_metadata(session, model)
    shape, stride = meta["model_shape"], int(meta.get("stride", 1))
    history, horizon = int(shape["history"]), int(shape["horizon"])
    trajectories = read_split(Path(data), split, samples)[:, ::stride]  # (N, T, C, *space)
    check_grid(trajectories, meta, data)
    available = trajectories.shape[1] - history
    if available < 1:
        raise RunError(f"{data}: trajectories of {trajectories.shape[1]} frames leave nothing to predict")
    frames = available if frames is None else min(frames, available)
    mean, std = normalisation(meta, trajectories.ndim - 3)
    window = (trajectories[:, :history] - mean) / std
    predicted = []
    for _ in range(math.ceil(frames / horizon)):
        (step,) = session.run(["next_frames"], {"frames": window.astype(np.float32)})
        predicted.append(step)
        window = np.concatenate([window, step], axis=1)[:, -history:]
    physical = np.concatenate(predicted, axis=1)[:, :frames] * std + mean
    truth = trajectories[:, history : history + frames]
    return OnnxRollout(nrmse_per_frame(physical, truth), physical, truth, trajectories.shape[0])


def model_metadata(session: Any, model: str | Path) -> dict[str, Any]:
    properties = session.get_modelmeta().custom_metadata_map
    if "dynaforge" not in properties:
        raise RunError(f"{model} was not written by `dynaforge export` (no dynaforge metadata)")
    meta = json.loads(properties["dynaforge"])
    if meta.get("kind") != "surrogate":
        raise RunError(
            f"{model} holds a {meta.get('kind')}, not a field surrogate; rollout needs a model exported from "
            "a `dynaforge train` run"
        )
    return meta


def read_split(root: Path, split: str, samples: int | None) -> np.ndarray:
    """Every complete shard of `split`, in order: fields (N, T, C, *space) float32, channels first."""
    manifest_path = root / "manifest.json"
    if not manifest_path.exists():
        raise RunError(
            f"{root} is not a dataset folder (no manifest.json); make one with `dynaforge generate`"
        )
    manifest = json.loads(manifest_path.read_text())
    if manifest.get("format_version") != 1 or not manifest.get("complete"):
        raise RunError(
            f"{root} is not a complete dataset of format version 1; check it with `dynaforge inspect`"
        )
    shards = sorted(
        (s for s in manifest["shards"] if s.get("split") == split and s.get("complete")),
        key=lambda s: s["index"],
    )
    if not shards:
        raise RunError(f"{root} has no {split} samples")
    parts = []
    count = 0
    for shard in shards:
        with h5py.File(root / shard["file"], "r") as handle:
            parts.append(np.asarray(handle["fields"][: None if samples is None else samples - count]))
        count += parts[-1].shape[0]
        if samples is not None and count >= samples:
            break
    fields = np.concatenate(parts).astype(np.float32)  # (N, T, *space, C)
    return np.ascontiguousarray(np.moveaxis(fields, -1, 2))


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


def nrmse_per_frame(prediction: np.ndarray, truth: np.ndarray) -> list[float]:
    """PDEBench nRMSE per frame: ||error||_2 / ||truth||_2 over the grid, per sample, frame and channel,
    averaged over samples and channels."""
    points = (*truth.shape[:3], -1)
    error = (prediction.astype(np.float64) - truth.astype(np.float64)).reshape(points)
    norm = np.linalg.norm(truth.astype(np.float64).reshape(points), axis=-1)
    ratio = np.linalg.norm(error, axis=-1) / np.maximum(norm, EPS)
    return [float(v) for v in ratio.mean(axis=(0, 2))]
