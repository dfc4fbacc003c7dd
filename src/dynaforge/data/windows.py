"""Training windows cut from stored trajectories: `history` input frames, then the frames to predict.

Conventions:
- The store holds (N, T, *space, C) float32, channels last; models take channels first, so a window's
  frames are (frames, C, *space) and a batch (B, frames, C, *space).
- A window starting at stored frame s uses frames s, s + stride, s + 2 stride, ...: the first `history`
  are inputs, the next `targets` are what the model must predict (horizon x rollout steps).
- Every start s with all frames inside the trajectory is a window; windows are enumerated trajectory by
  trajectory, start by start.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.data import Dataset

from dynaforge.data.normalize import Normalizer


class Window(NamedTuple):
    """One training example (a batch of them after collation: a leading batch axis)."""

    inputs: Float[Tensor, "history channels *space"]
    targets: Float[Tensor, "targets channels *space"]


def fields_to_channels_first(fields: np.ndarray) -> Float[Tensor, "samples time channels *space"]:
    """(N, T, *space, C) stored fields -> (N, T, C, *space) float32 tensor (a copy, contiguous)."""
    if fields.ndim < 4:
        raise ValueError(f"stored fields are (samples, time, *space, channels), got shape {fields.shape}")
    tensor = torch.as_tensor(np.ascontiguousarray(fields), dtype=torch.float32)
    return torch.movedim(tensor, -1, 2).contiguous()


def channels_first_to_last(fields: Tensor, spatial_dims: int) -> Tensor:
    """(..., C, *space) -> (..., *space, C), the stored layout."""
    return torch.movedim(fields, -1 - spatial_dims, -1)


def window_starts(n_frames: int, window_frames: int, stride: int) -> range:
    """Start frames of every window of `window_frames` frames `stride` apart inside `n_frames` frames."""
    span = (window_frames - 1) * stride
    return range(max(n_frames - span, 0))


def training_window_starts(n_frames: int, history: int, targets: int, stride: int) -> range:
    """`window_starts` of windows of `history` + `targets` frames; an error naming the settings to change
    when trajectories of `n_frames` frames hold none."""
    starts = window_starts(n_frames, history + targets, stride)
    if len(starts) == 0:
        raise ValueError(
            f"trajectories of {n_frames} frames are too short for windows of {history} + {targets} "
            f"frames {stride} apart (needs {(history + targets - 1) * stride + 1}); lower data.history, "
            "data.horizon, data.stride or train.rollout_steps, or generate longer trajectories"
        )
    return starts


class WindowDataset(Dataset[Window]):
    """Normalised windows over all trajectories of one split, held in memory."""

    def __init__(
        self,
        fields: np.ndarray,
        normalizer: Normalizer,
        history: int,
        targets: int,
        stride: int = 1,
    ) -> None:
        """`fields`: a split's stored array (N, T, *space, C); `targets`: predicted frames per window."""
        if history < 1 or targets < 1 or stride < 1:
            raise ValueError(f"history, targets and stride must be >= 1, got {history}, {targets}, {stride}")
        self.spatial_dims = fields.ndim - 3
        self.frames = normalizer.physical_to_normalized(
            fields_to_channels_first(fields), self.spatial_dims
        )  # (N, T, C, *space)
        self.history, self.targets, self.stride = history, targets, stride
        n_frames = self.frames.shape[1]
        self.starts = training_window_starts(n_frames, history, targets, stride)

    @property
    def windows_per_sample(self) -> int:
        return len(self.starts)

    def __len__(self) -> int:
        return self.frames.shape[0] * self.windows_per_sample

    def __getitem__(self, index: int) -> Window:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        sample, offset = divmod(index, self.windows_per_sample)
        start = self.starts[offset]
        stop = start + (self.history + self.targets - 1) * self.stride + 1
        frames = self.frames[sample, start : stop : self.stride]
        return Window(inputs=frames[: self.history], targets=frames[self.history :])
