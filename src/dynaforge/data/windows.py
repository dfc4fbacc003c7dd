"""Training windows cut from normalised trajectories: `history` input frames, then the frames to predict.

Conventions:
- A trajectory is (T, C, *space) float32, channels first, normalised; a window's frames are
  (frames, C, *space) and a batch (B, frames, C, *space). The store holds (N, T, *space, C), channels last;
  only its readers (and the shims in `dynaforge.data.sources`) convert.
- A window starting at frame s uses frames s, s + stride, s + 2 stride, ...: the first `history` are inputs,
  the next `targets` are what the model must predict (horizon x rollout steps).
- Every start s with all frames inside the trajectory is a window; windows are numbered trajectory by
  trajectory, start by start: window i is start i mod W of trajectory i div W (W windows per trajectory).

`WindowDataset` is the one dataset of windows. Where its trajectories come from is a `TrajectorySource`:
held in memory (`MemoryTrajectories`), read from the shards through a bounded buffer
(`dynaforge.data.lazy.LazyTrajectories`) or generated while training runs
(`dynaforge.data.stream.StreamedTrajectories`).
"""

from __future__ import annotations

from typing import NamedTuple, Protocol, runtime_checkable

from jaxtyping import Float
from torch import Tensor
from torch.utils.data import Dataset

from dynaforge.data.normalize import Normalizer
from dynaforge.errors import ConfigError


class Window(NamedTuple):
    """One training example (a batch of them after collation: a leading batch axis)."""

    inputs: Float[Tensor, "history channels *space"]
    targets: Float[Tensor, "targets channels *space"]


def window_starts(n_frames: int, window_frames: int, stride: int) -> range:
    """Start frames of every window of `window_frames` frames `stride` apart inside `n_frames` frames."""
    span = (window_frames - 1) * stride
    return range(max(n_frames - span, 0))


def training_window_starts(n_frames: int, history: int, targets: int, stride: int) -> range:
    """`window_starts` of windows of `history` + `targets` frames; an error naming the settings to change
    when trajectories of `n_frames` frames hold none."""
    starts = window_starts(n_frames, history + targets, stride)
    if len(starts) == 0:
        raise ConfigError(
            f"trajectories of {n_frames} frames are too short for windows of {history} + {targets} "
            f"frames {stride} apart (needs {(history + targets - 1) * stride + 1}); lower data.history, "
            "data.horizon, data.stride or train.rollout_steps, or generate longer trajectories "
            "(system.n_frames)"
        )
    return starts


@runtime_checkable
class TrajectorySource(Protocol):
    """Normalised trajectories, one at a time: what `WindowDataset` cuts windows from."""

    frames: int
    """Frames per trajectory (T)."""
    spatial_dims: int
    loaded: int
    """Trajectories generated or read so far in this process (a measure for the logs)."""

    def __len__(self) -> int:
        """Trajectories (an endless stream: those of one epoch's view, see its module)."""
        ...

    def trajectory(self, index: int) -> Float[Tensor, "time channels *space"]: ...

    def close(self) -> None:
        """Release what the source holds open (a generator thread, file handles)."""
        ...


class MemoryTrajectories:
    """A split's trajectories held whole, normalised: (N, T, C, *space)."""

    def __init__(self, frames: Float[Tensor, "samples time channels *space"]) -> None:
        self.all = frames
        self.frames = frames.shape[1]
        self.spatial_dims = frames.ndim - 3
        self.loaded = 0

    @classmethod
    def normalized(
        cls, physical: Float[Tensor, "samples time channels *space"], normalizer: Normalizer
    ) -> MemoryTrajectories:
        """From physical frames (N, T, C, *space), normalised with `normalizer`."""
        return cls(normalizer.physical_to_normalized(physical, physical.ndim - 3))

    def __len__(self) -> int:
        return self.all.shape[0]

    def trajectory(self, index: int) -> Tensor:
        return self.all[index]

    def close(self) -> None:
        """Nothing to release."""


class WindowDataset(Dataset[Window]):
    """Every window of the trajectories of `source` (see the module docstring)."""

    def __init__(self, source: TrajectorySource, history: int, targets: int, stride: int = 1) -> None:
        if history < 1 or targets < 1 or stride < 1:
            raise ValueError(f"history, targets and stride must be >= 1, got {history}, {targets}, {stride}")
        self.source = source
        self.spatial_dims = source.spatial_dims
        self.history, self.targets, self.stride = history, targets, stride
        self.starts = training_window_starts(source.frames, history, targets, stride)

    @property
    def windows_per_sample(self) -> int:
        return len(self.starts)

    @property
    def samples(self) -> int:
        return len(self.source)

    def __len__(self) -> int:
        return self.samples * self.windows_per_sample

    def __getitem__(self, index: int) -> Window:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        sample, offset = divmod(index, self.windows_per_sample)
        start = self.starts[offset]
        stop = start + (self.history + self.targets - 1) * self.stride + 1
        frames = self.source.trajectory(sample)[start : stop : self.stride]
        return Window(inputs=frames[: self.history], targets=frames[self.history :])
