"""Shims for the store's channels-first reads, until the store provides them (issue 34's agreed seam).

`TrajectoryReader.frames(index)` and `DatasetFolder.split_frames(split, samples)` return float32
(T, C, *space) and (N, T, C, *space) tensors; data/ calls them only through these two functions, so that
the store's methods replace their bodies in one place.
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

from dynaforge.data.windows import fields_to_channels_first
from dynaforge.store import DatasetFolder, TrajectoryReader


def trajectory_frames(reader: TrajectoryReader, index: int) -> Float[Tensor, "time channels *space"]:
    """Trajectory `index` of `reader`, channels first (the store's `TrajectoryReader.frames`)."""
    return fields_to_channels_first(reader.read(index)[None])[0]


def split_frames(
    folder: DatasetFolder, split: str, samples: int | None = None
) -> Float[Tensor, "samples time channels *space"]:
    """The first `samples` (all: None) trajectories of `split`, channels first (`DatasetFolder.split_frames`)."""
    return fields_to_channels_first(folder.read_split(split, samples).fields)
