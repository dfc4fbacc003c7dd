"""Windows read from the shards as training asks for them: memory bounded by a buffer, not by the split.

`LazyWindowDataset` gives the same windows as `WindowDataset` (same index -> same window, bit for bit)
but holds at most `buffer` normalised trajectories, read one at a time through a
`dynaforge.store.TrajectoryReader` (one HDF5 handle per process, opened in the process that reads).

`BufferShuffleSampler` orders an epoch so that this buffer suffices: the trajectories are shuffled, cut
into blocks of `buffer`, and the windows of each block are shuffled among themselves. The order is a pure
function of (seed, epoch), every window of the split appears exactly once per epoch, and rank r of W
takes the positions r, r + W, ... of it (padded like `DistributedSampler`), so ranks are disjoint and a
resumed run skips exactly what it had trained on.
"""

from __future__ import annotations

import itertools
from collections import OrderedDict
from collections.abc import Iterator

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset, Sampler

from dynaforge.data.normalize import Normalizer
from dynaforge.data.windows import Window, fields_to_channels_first, training_window_starts
from dynaforge.store import TrajectoryReader


class LazyWindowDataset(Dataset[Window]):
    """Normalised windows of one split, read trajectory by trajectory and kept in an LRU of `buffer`."""

    def __init__(
        self,
        reader: TrajectoryReader,
        normalizer: Normalizer,
        history: int,
        targets: int,
        stride: int = 1,
        buffer: int = 32,
    ) -> None:
        if history < 1 or targets < 1 or stride < 1 or buffer < 1:
            raise ValueError(
                f"history, targets, stride and buffer must be >= 1, got {history}, {targets}, {stride}, {buffer}"
            )
        self.reader, self.normalizer, self.buffer = reader, normalizer, buffer
        self.history, self.targets, self.stride = history, targets, stride
        first = reader.read(0)  # (T, *space, C)
        self.spatial_dims = first.ndim - 2
        n_frames = first.shape[0]
        self.starts = training_window_starts(n_frames, history, targets, stride)
        self.cache: OrderedDict[int, Tensor] = OrderedDict()
        self.reads = 0
        """Trajectories read from disk by this process (a measure for the logs)."""

    @property
    def windows_per_sample(self) -> int:
        return len(self.starts)

    @property
    def samples(self) -> int:
        return len(self.reader)

    def __len__(self) -> int:
        return self.samples * self.windows_per_sample

    def __getstate__(self) -> dict:
        return {**self.__dict__, "cache": OrderedDict()}

    def trajectory(self, sample: int) -> Tensor:
        """Sample `sample` normalised, (T, C, *space), from the buffer or read (evicting the oldest used)."""
        if sample in self.cache:
            self.cache.move_to_end(sample)
            return self.cache[sample]
        fields = fields_to_channels_first(self.reader.read(sample)[None])  # (1, T, C, *space)
        frames = self.normalizer.physical_to_normalized(fields, self.spatial_dims)[0]
        self.reads += 1
        self.cache[sample] = frames
        while len(self.cache) > self.buffer:
            self.cache.popitem(last=False)
        return frames

    def __getitem__(self, index: int) -> Window:
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} out of range [0, {len(self)})")
        sample, offset = divmod(index, self.windows_per_sample)
        start = self.starts[offset]
        stop = start + (self.history + self.targets - 1) * self.stride + 1
        frames = self.trajectory(sample)[start : stop : self.stride]
        return Window(inputs=frames[: self.history], targets=frames[self.history :])


def buffered_blocks(
    samples: int, windows_per_sample: int, buffer: int, seed: int, epoch: int
) -> Iterator[np.ndarray]:
    """The window indices of an epoch, block by block: the trajectories are shuffled and cut into blocks of
    `buffer`, and each block's windows are shuffled among themselves. A pure function of its arguments;
    one block (buffer x windows_per_sample int64) is held at a time, so the order of an epoch costs 8 bytes
    per trajectory (the shuffled trajectories), not per window."""
    rng = np.random.default_rng(np.random.SeedSequence(entropy=seed, spawn_key=(epoch,)))
    trajectories = rng.permutation(samples)
    offsets = np.arange(windows_per_sample, dtype=np.int64)
    for lo in range(0, samples, buffer):
        block = trajectories[lo : lo + buffer].astype(np.int64)
        yield rng.permutation((block[:, None] * windows_per_sample + offsets[None, :]).ravel())


def buffered_order(samples: int, windows_per_sample: int, buffer: int, seed: int, epoch: int) -> np.ndarray:
    """Every window index of `samples` trajectories once, shuffled so that each run of
    buffer x windows_per_sample consecutive positions draws from `buffer` trajectories only: the blocks of
    `buffered_blocks` end to end (int64; for tests and small splits, the sampler never forms it)."""
    return np.concatenate(list(buffered_blocks(samples, windows_per_sample, buffer, seed, epoch)))


class BufferShuffleSampler(Sampler[int]):
    """`buffered_order` of each epoch, split across ranks and resumable mid-epoch (see the module
    docstring). Call `start(epoch, skip)` before each epoch, as with `train.distributed.EpochSampler`.

    With W ranks each rank reads the same blocks (a window's trajectory is read by the rank that takes
    it), so each holds at most `buffer` trajectories: ranks share the reading of a block, not its memory.
    """

    def __init__(
        self, dataset: LazyWindowDataset, rank: int, world_size: int, seed: int, buffer: int | None = None
    ) -> None:
        self.samples, self.windows_per_sample = dataset.samples, dataset.windows_per_sample
        self.buffer = buffer or dataset.buffer
        self.rank, self.world_size, self.seed = rank, world_size, seed
        total = self.samples * self.windows_per_sample
        self.num_samples = -(-total // world_size)
        self.epoch, self.skip = 0, 0

    def start(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    def blocks(self) -> Iterator[np.ndarray]:
        """The epoch's `buffered_blocks`, then its first positions again as `DistributedSampler` pads (so
        that every rank takes `num_samples`)."""
        args = (self.samples, self.windows_per_sample, self.buffer, self.seed, self.epoch)
        yield from buffered_blocks(*args)
        left = self.num_samples * self.world_size - self.samples * self.windows_per_sample
        for block in buffered_blocks(*args) if left > 0 else ():
            yield block[:left]
            left -= min(left, len(block))
            if left == 0:
                break

    def rank_positions(self) -> Iterator[int]:
        """Positions rank, rank + W, ... of the padded order, produced block by block."""
        position = 0
        for block in self.blocks():
            first = (self.rank - position) % self.world_size
            yield from block[first :: self.world_size].tolist()
            position += len(block)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self.rank_positions(), self.skip, None)

    def __len__(self) -> int:
        return max(self.num_samples - self.skip, 0)


def resident_bytes(dataset: Dataset) -> int:
    """Bytes of normalised trajectories a window dataset holds now (its buffer, or its whole split)."""
    if isinstance(dataset, LazyWindowDataset):
        return sum(t.numel() * t.element_size() for t in dataset.cache.values())
    frames = getattr(dataset, "frames", None)
    return int(frames.numel() * frames.element_size()) if isinstance(frames, torch.Tensor) else 0
