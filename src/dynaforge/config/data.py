"""The `dataset` (what is generated) and `data` (training windows and batching) sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynaforge.config.base import AT_LEAST_ONE, NON_NEGATIVE, check_values, checked


@dataclass
class DatasetConfig:
    """How many trajectories to generate, how they are split into shards, and where they run."""

    n_train: int = checked(
        64, check=AT_LEAST_ONE.because("training and the normalisation statistics read it")
    )
    """Trajectories in the train split."""
    n_val: int = checked(16, check=NON_NEGATIVE)
    """Trajectories in the validation split (training refuses an empty one, naming dataset.n_val)."""
    n_test: int = checked(16, check=NON_NEGATIVE)
    """Trajectories in the test split (evaluation refuses an empty one)."""
    shard_size: int = checked(64, check=AT_LEAST_ONE)
    """Trajectories per HDF5 shard (the unit of resumption and of parallel generation)."""
    batch_size: int = checked(64, check=AT_LEAST_ONE)
    """Trajectories stepped together by the solver."""
    seed: int = checked(0, check=NON_NEGATIVE.because("numpy seed entropy"))
    """Base seed; each sample's seed derives from (seed, split, global index) alone."""
    device: str = "cpu"
    """Where the solver runs: `cpu`, `cuda`, `cuda:1` or `auto`."""

    def __post_init__(self) -> None:
        check_values(self)

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclass
class DataConfig:
    """Training windows cut from a dataset folder, and how they are batched.

    A window is `history` input frames followed by the frames the model must predict, all `stride` stored
    frames apart. Fields are normalised per channel with the train split's mean and standard deviation.
    """

    history: int = checked(1, check=AT_LEAST_ONE)
    """Input frames the model sees per call."""
    horizon: int = checked(1, check=AT_LEAST_ONE)
    """Frames the model predicts per call."""
    stride: int = checked(1, check=AT_LEAST_ONE)
    """Take every `stride`-th stored frame (the model's time step is stride x the stored frame spacing)."""
    batch_size: int = checked(32, check=AT_LEAST_ONE)
    """Windows per optimiser step (and per evaluation batch)."""
    num_workers: int = checked(0, check=NON_NEGATIVE)
    """DataLoader worker processes; 0 reads in the main process (the splits are held in memory)."""
    pin_memory: bool | None = None
    """Page-locked host batches for fast copies to a GPU; null means yes when training on CUDA."""
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    """How DataLoader workers start; `fork` is unsafe with threads, CUDA or open HDF5 files."""

    def __post_init__(self) -> None:
        check_values(self)
