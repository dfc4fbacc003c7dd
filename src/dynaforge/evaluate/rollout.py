"""Model predictions on a split, in physical units: one step from true inputs, and autoregressive rollouts.

Inputs are normalised with the statistics the model was trained with (saved in its checkpoint); outputs
are denormalised before any comparison, and the truth is the stored field itself (never normalised and
back). Input frames are returned apart from predictions, so no metric can count them.

On the CPU each batch (of a fixed size, in a fixed order) runs on one intra-op thread and batches run side by
side on the allowed threads (`dynaforge.threads`), so predictions are the same bytes whatever the thread
count; on a GPU batches run in order.
"""

from __future__ import annotations

import logging
import math
from typing import NamedTuple, TypeVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.data import MemoryTrajectories, Normalizer, WindowDataset
from dynaforge.errors import ConfigError
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout
from dynaforge.store.layout import fields_from_disk
from dynaforge.threads import run_pieces

log = logging.getLogger(__name__)


class Predictions(NamedTuple):
    """Predicted frames and the true frames they stand for, physical units, (N, frames, C, *space)."""

    predicted: Float[Tensor, "samples frames channels *space"]
    truth: Float[Tensor, "samples frames channels *space"]


class Rollouts(NamedTuple):
    """Autoregressive rollouts of every trajectory, physical units."""

    inputs: Float[Tensor, "samples history channels *space"]
    predicted: Float[Tensor, "samples frames channels *space"]
    truth: Float[Tensor, "samples frames channels *space"]


FramesT = TypeVar("FramesT", "Predictions", "Rollouts")


def physical_channels(frames: FramesT, channels: int) -> FramesT:
    """`Predictions` or `Rollouts` cut to their first `channels` channels (the boundary channels left out)."""
    return type(frames)(*(part[:, :, :channels] for part in frames))


def predict_physical(
    model: nn.Module, normalizer: Normalizer, inputs: Tensor, steps: int, spatial_dims: int
) -> Tensor:
    """Physical (B, history, C, *space) inputs -> physical predictions of `steps` model calls."""
    normalized = normalizer.physical_to_normalized(inputs, spatial_dims)
    predicted = autoregressive_rollout(model, ModelInput(frames=normalized), steps)
    return normalizer.normalized_to_physical(predicted.float(), spatial_dims)


def one_step_predictions(
    model: nn.Module,
    normalizer: Normalizer,
    fields: np.ndarray,
    shape: ModelShape,
    stride: int,
    batch_size: int,
    device: torch.device,
) -> Predictions:
    """One model call from the true `history` frames of every window of the split (`horizon` frames each)."""
    windows = WindowDataset(
        MemoryTrajectories(fields_from_disk(fields)),
        history=shape.history,
        targets=shape.horizon,
        stride=stride,
    )
    model.eval()

    def predict(lo: int) -> tuple[Tensor, Tensor]:
        batch = [windows[i] for i in range(lo, min(lo + batch_size, len(windows)))]
        inputs = torch.stack([w.inputs for w in batch]).to(device)
        predicted = predict_physical(model, normalizer, inputs, 1, shape.spatial_dims).cpu()
        return predicted, torch.stack([w.targets for w in batch])

    with torch.inference_mode():
        batches = run_pieces(predict, list(range(0, len(windows), batch_size)), workers_for(device))
    return Predictions(predicted=torch.cat([p for p, _ in batches]), truth=torch.cat([t for _, t in batches]))


def workers_for(device: torch.device) -> int | None:
    """Worker threads for batches on `device`: the allowed threads on the CPU, one for a GPU's stream."""
    return None if device.type == "cpu" else 1


def available_rollout_frames(n_frames: int, shape: ModelShape, stride: int, start_frame: int) -> int:
    """How many frames can be predicted and checked after the input frames, `stride` apart."""
    usable = len(range(start_frame, n_frames, stride))
    return max(usable - shape.history, 0)


def rollouts(
    model: nn.Module,
    normalizer: Normalizer,
    fields: np.ndarray,
    shape: ModelShape,
    stride: int,
    start_frame: int,
    frames: int,
    batch_size: int,
    device: torch.device,
) -> Rollouts:
    """Roll every trajectory out from its true frames start_frame, +stride, ... (`history` of them).

    Predicts `frames` frames, fewer (with a warning) when the stored trajectories end earlier.
    """
    trajectories = fields_from_disk(fields)[:, start_frame::stride]  # (N, T', C, *space)
    available = available_rollout_frames(fields.shape[1], shape, stride, start_frame)
    if available < 1:
        raise ConfigError(
            f"trajectories of {fields.shape[1]} frames leave nothing to predict after {shape.history} input "
            f"frames from frame {start_frame} with stride {stride}; lower evaluate.start_frame"
        )
    if frames > available:
        log.warning(
            "rollouts cut to %d frames: the stored trajectories end there (asked %d)", available, frames
        )
        frames = available
    calls = math.ceil(frames / shape.horizon)
    inputs = trajectories[:, : shape.history]
    model.eval()

    def roll(lo: int) -> Tensor:
        batch = inputs[lo : lo + batch_size].to(device)
        return predict_physical(model, normalizer, batch, calls, shape.spatial_dims).cpu()

    with torch.inference_mode():
        predicted = run_pieces(roll, list(range(0, inputs.shape[0], batch_size)), workers_for(device))
    return Rollouts(
        inputs=inputs,
        predicted=torch.cat(predicted)[:, :frames],
        truth=trajectories[:, shape.history : shape.history + frames],
    )
