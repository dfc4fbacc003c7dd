"""Splits and the per-sample seed derivation, shared by generation, the store and the data loaders.

A sample's seed depends on (base seed, split, global index) alone, never on shards, batches, workers or
machines; the splits draw from independent streams (docs/format.md, "Splits, shards and seeds").
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

SPLITS = ("train", "val", "test")
SPLIT_IDS = {"train": 0, "val": 1, "test": 2}


def sample_seed(base_seed: int, split: str, index: int) -> int:
    """The seed of one sample, from (base seed, split, global index) alone (numpy SeedSequence mixing)."""
    sequence = np.random.SeedSequence(entropy=base_seed, spawn_key=(SPLIT_IDS[split], index))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


class Rows(NamedTuple):
    """Samples [start, stop) of one split of a dataset whose base seed is `base_seed`."""

    split: str
    start: int
    stop: int
    base_seed: int

    def seeds(self) -> list[int]:
        return [sample_seed(self.base_seed, self.split, i) for i in range(self.start, self.stop)]


def sample_rng(seed: int) -> np.random.Generator:
    """The generator a sample draws its parameters and initial field from."""
    return np.random.default_rng(seed)
