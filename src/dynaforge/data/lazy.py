"""Trajectories read from the shards as training asks for them: memory bounded by a buffer, not by the split.

`LazyTrajectories` holds at most `buffer` normalised trajectories, read one at a time through a
`dynaforge.store.TrajectoryReader` (one HDF5 handle per process, opened in the process that reads), so a
`WindowDataset` over it gives the same windows as over the split held in memory (same index -> same
window, bit for bit). `dynaforge.data.order.EpochOrder` with `block=buffer` orders an epoch so that this
buffer suffices: each trajectory is read once per epoch.
"""

from __future__ import annotations

from collections import OrderedDict

from torch import Tensor

from dynaforge.data.normalize import Normalizer
from dynaforge.store import TrajectoryReader


class LazyTrajectories:
    """A split's normalised trajectories, read one by one and kept in an LRU of `buffer`."""

    def __init__(self, reader: TrajectoryReader, normalizer: Normalizer, buffer: int = 32) -> None:
        if buffer < 1:
            raise ValueError(f"buffer must be >= 1, got {buffer}")
        self.reader, self.normalizer, self.buffer = reader, normalizer, buffer
        first = reader.frames(0)  # (T, C, *space)
        self.frames = first.shape[0]
        self.spatial_dims = first.ndim - 2
        self.cache: OrderedDict[int, Tensor] = OrderedDict()
        self.loaded = 0
        """Trajectories read from disk by this process (a measure for the logs)."""

    def __len__(self) -> int:
        return len(self.reader)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "cache": OrderedDict()}

    def trajectory(self, index: int) -> Tensor:
        """Trajectory `index` normalised, (T, C, *space), from the buffer or read (evicting the oldest used)."""
        if index in self.cache:
            self.cache.move_to_end(index)
            return self.cache[index]
        frames = self.normalizer.physical_to_normalized(self.reader.frames(index), self.spatial_dims)
        self.loaded += 1
        self.cache[index] = frames
        while len(self.cache) > self.buffer:
            self.cache.popitem(last=False)
        return frames

    def close(self) -> None:
        self.reader.close()
