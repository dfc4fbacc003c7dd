"""The one epoch order of training windows: a pure function of (seed, epoch, rank, world size, block).

Windows are numbered trajectory by trajectory (`dynaforge.data.windows`). An epoch visits the trajectories
in blocks of `block`, and shuffles the windows of each block among themselves, so that a reader holding
`block` trajectories at a time reads each one once:

- Stored trajectories (in memory or read lazily): the trajectories are shuffled by (seed, epoch) and cut
  into blocks of `block` (`data.buffer` when reading lazily). A block that holds them all is one shuffle
  of every window, drawn as `torch.utils.data.DistributedSampler` draws it (seed + epoch), the order
  in-memory training has always had. Rank r of W takes positions r, r + W, ... of the epoch's order,
  padded with its first positions (as DistributedSampler pads) so that every rank takes as many windows:
  ranks are disjoint, and W ranks with batch B train like one process with batch W x B.
- Streamed trajectories (`rounds`): each rank draws from its own endless sequence of trajectories
  (`dynaforge.data.stream`). Round k shuffles, by (seed, rank, k), every window of the rank's trajectories
  [k r, k r + block), r = block / reuse; an epoch is `rounds.per_epoch` rounds, so each trajectory is drawn
  in `reuse` rounds and at most block + 2 r are held.

`start(epoch, skip)` before each epoch passes over the first `skip` windows of the rank's share: a resumed
run skips exactly what it had trained on. One block of indices is held at a time (int64), never the order
of an epoch.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch.utils.data import Sampler


class Rounds(NamedTuple):
    """How a streamed order moves through its endless trajectories."""

    reuse: int
    """Rounds each trajectory is drawn in: each round replaces block / reuse trajectories."""
    per_epoch: int


class EpochOrder(Sampler[int]):
    """The windows one rank draws in an epoch, in order (see the module docstring)."""

    def __init__(
        self,
        trajectories: int,
        windows_per_trajectory: int,
        block: int,
        seed: int,
        rank: int = 0,
        world_size: int = 1,
        rounds: Rounds | None = None,
    ) -> None:
        """`trajectories`: stored trajectories (unused when streaming: `rounds` given)."""
        if block < 1 or not 0 <= rank < world_size:
            raise ValueError(f"need block >= 1 and 0 <= rank < world_size, got {block}, {rank}, {world_size}")
        self.trajectories, self.windows_per_trajectory = trajectories, windows_per_trajectory
        self.block, self.seed, self.rank, self.world_size = block, seed, rank, world_size
        self.rounds = rounds
        if rounds is None:
            self.num_samples = -(-trajectories * windows_per_trajectory // world_size)
        else:
            self.num_samples = rounds.per_epoch * block * windows_per_trajectory
        self.epoch, self.skip = 0, 0

    def start(self, epoch: int, skip: int = 0) -> None:
        self.epoch, self.skip = epoch, skip

    @property
    def replaced(self) -> int:
        """Trajectories replaced per round when streaming (r)."""
        return self.block // self.rounds.reuse if self.rounds is not None else self.block

    def blocks(self) -> Iterator[np.ndarray]:
        """The epoch's window indices block by block, before the split across ranks (streaming: the rank's)."""
        if self.rounds is not None:
            first = self.epoch * self.rounds.per_epoch
            yield from (self.round(k) for k in range(first, first + self.rounds.per_epoch))
        elif self.block >= self.trajectories:
            generator = torch.Generator()
            generator.manual_seed(self.seed + self.epoch)  # DistributedSampler's draw
            yield torch.randperm(self.trajectories * self.windows_per_trajectory, generator=generator).numpy()
        else:
            yield from self.shuffled_blocks()

    def shuffled_blocks(self) -> Iterator[np.ndarray]:
        """Stored trajectories shuffled by (seed, epoch), cut into blocks, each block's windows shuffled."""
        rng = np.random.default_rng(np.random.SeedSequence(entropy=self.seed, spawn_key=(self.epoch,)))
        order = rng.permutation(self.trajectories)
        offsets = np.arange(self.windows_per_trajectory, dtype=np.int64)
        for lo in range(0, self.trajectories, self.block):
            block = order[lo : lo + self.block].astype(np.int64)
            yield rng.permutation((block[:, None] * self.windows_per_trajectory + offsets[None, :]).ravel())

    def round(self, k: int) -> np.ndarray:
        """Streaming round `k`: every window of the rank's trajectories [k r, k r + block), shuffled."""
        assert self.rounds is not None
        rng = np.random.default_rng(np.random.SeedSequence(entropy=self.seed, spawn_key=(self.rank, k)))
        windows = self.block * self.windows_per_trajectory
        return k * self.replaced * self.windows_per_trajectory + rng.permutation(windows).astype(np.int64)

    def padded_blocks(self) -> Iterator[np.ndarray]:
        """`blocks`, then its first positions again until every rank has `num_samples` (stored only)."""
        yield from self.blocks()
        left = self.num_samples * self.world_size - self.trajectories * self.windows_per_trajectory
        while left > 0:
            for block in self.blocks():
                yield block[:left]
                left -= min(left, len(block))
                if left == 0:
                    break

    def rank_positions(self) -> Iterator[int]:
        """The rank's windows, block by block: positions rank, rank + W, ... of the padded order (streaming:
        the rank's own order, whole)."""
        if self.rounds is not None:
            for block in self.blocks():
                yield from block.tolist()
            return
        position = 0
        for block in self.padded_blocks():
            first = (self.rank - position) % self.world_size
            yield from block[first :: self.world_size].tolist()
            position += len(block)

    def __iter__(self) -> Iterator[int]:
        return itertools.islice(self.rank_positions(), self.skip, None)

    def __len__(self) -> int:
        return max(self.num_samples - self.skip, 0)
