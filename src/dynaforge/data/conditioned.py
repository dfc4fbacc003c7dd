"""Windows that carry what a step is conditioned on (system parameters, time step), and long-time states.

Used by the staged latent stack (`dynaforge.train.stages`). Parameters are normalised with the train
split's mean and standard deviation per parameter (a parameter that does not vary is only shifted, so it
becomes 0); the model time step is `stride` times the stored frame spacing.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor
from torch.utils.data import Dataset

from dynaforge.data.normalize import MIN_STD, Normalizer
from dynaforge.data.windows import MemoryTrajectories, WindowDataset
from dynaforge.errors import ConfigError, DatasetError, RunError
from dynaforge.store import DatasetFolder
from dynaforge.store.format import SplitArrays
from dynaforge.store.layout import fields_from_disk


class StageWindow(NamedTuple):
    """One example of a stage (a batch of them after collation)."""

    inputs: Float[Tensor, "history channels *space"]
    targets: Float[Tensor, "targets channels *space"]
    params: Float[Tensor, " parameters"]
    dt: Float[Tensor, ""]


class ParameterNormalizer:
    """(p - mean) / std per parameter, with the train split's statistics (plain lists)."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        self.mean = [float(m) for m in mean]
        self.std = [float(s) if s > MIN_STD else 1.0 for s in std]

    @classmethod
    def from_params(cls, params: np.ndarray) -> ParameterNormalizer:
        """From a split's (N, P) parameter array."""
        return cls(params.mean(axis=0).tolist(), params.std(axis=0).tolist())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ParameterNormalizer:
        return cls(data["mean"], data["std"])

    def to_dict(self) -> dict[str, list[float]]:
        return {"mean": list(self.mean), "std": list(self.std)}

    def normalize(self, params: np.ndarray | Tensor) -> Float[Tensor, "samples parameters"]:
        values = torch.as_tensor(np.asarray(params, dtype=np.float64), dtype=torch.float64)
        mean = torch.tensor(self.mean, dtype=torch.float64)
        std = torch.tensor(self.std, dtype=torch.float64)
        return ((values - mean) / std).to(torch.float32)


class ConditionedWindows(Dataset[StageWindow]):
    """The windows of a `WindowDataset`, each with its trajectory's normalised parameters and the dt."""

    def __init__(
        self, windows: WindowDataset, params: Float[Tensor, "samples parameters"], dt: float
    ) -> None:
        if params.shape[0] != windows.samples:
            raise ValueError(f"{params.shape[0]} parameter rows for {windows.samples} trajectories")
        self.windows, self.params = windows, params
        self.dt = torch.tensor(dt, dtype=torch.float32)
        self.spatial_dims = windows.spatial_dims

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> StageWindow:
        window = self.windows[index]
        sample = index // self.windows.windows_per_sample
        return StageWindow(window.inputs, window.targets, self.params[sample], self.dt)


class LongTimeStates(Dataset[StageWindow]):
    """The last `last_frames` frames of every trajectory, normalised, as (1-frame) inputs and targets."""

    def __init__(
        self,
        frames: Float[Tensor, "samples time channels *space"],
        normalizer: Normalizer,
        params: Float[Tensor, "samples parameters"],
        last_frames: int,
        dt: float,
    ) -> None:
        """`frames`: a split's trajectories in physical units, channels first."""
        if last_frames > frames.shape[1]:
            raise ConfigError(
                f"stages.steady_prior.last_frames={last_frames} is more than the {frames.shape[1]} stored "
                "frames per trajectory; lower stages.steady_prior.last_frames"
            )
        self.spatial_dims = frames.ndim - 3
        tail = frames[:, -last_frames:]  # (N, last, C, *space)
        self.states = normalizer.physical_to_normalized(tail, self.spatial_dims).flatten(0, 1)
        self.params = params.repeat_interleave(last_frames, dim=0)
        self.dt = torch.tensor(dt, dtype=torch.float32)

    def __len__(self) -> int:
        return self.states.shape[0]

    def __getitem__(self, index: int) -> StageWindow:
        state = self.states[index : index + 1]
        return StageWindow(state, state, self.params[index], self.dt)


def model_time_step(time: np.ndarray, stride: int) -> float:
    """The time between a model's input and output frames: `stride` stored frame spacings."""
    if time.shape[0] < 2:
        raise DatasetError("trajectories need at least 2 stored frames to define a time step")
    return float(time[1] - time[0]) * stride


def evenly_spaced(size: int, count: int) -> list[int]:
    """At most `count` indices spread evenly over range(size)."""
    if size <= count:
        return list(range(size))
    return np.linspace(0, size - 1, count).round().astype(int).tolist()


@dataclass
class StageData:
    """A dataset folder's splits (read once), with the statistics every stage normalises with."""

    root: Path
    stride: int
    splits: dict[str, SplitArrays] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.folder = DatasetFolder(self.root)
        self.normalizer = Normalizer.from_stats(self.folder.stats)
        train = self.split("train")
        self.parameters = ParameterNormalizer.from_params(train.params)
        self.dt = model_time_step(train.time, self.stride)

    def split(self, name: str) -> SplitArrays:
        if name not in self.splits:
            if self.folder.split_size(name) == 0:
                raise RunError(
                    f"the {name} split of {self.root} is empty; generate it with dataset.n_{name} > 0"
                )
            self.splits[name] = self.folder.read_split(name)
        return self.splits[name]

    @property
    def n_parameters(self) -> int:
        return len(self.parameters.mean)

    def windows(self, split: str, history: int, targets: int) -> ConditionedWindows:
        arrays = self.split(split)
        frames = MemoryTrajectories.normalized(fields_from_disk(arrays.fields), self.normalizer)
        windows = WindowDataset(frames, history, targets, self.stride)
        return ConditionedWindows(windows, self.parameters.normalize(arrays.params), self.dt)

    def max_targets(self, history: int) -> int:
        """Frames predictable after `history` input frames in one stored trajectory."""
        frames = self.split("val").fields.shape[1]
        return len(range(0, frames, self.stride)) - history

    def extras(self) -> dict[str, Any]:
        return {"parameter_normalization": self.parameters.to_dict(), "dt": self.dt}
