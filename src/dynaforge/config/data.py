"""The `dataset` (what is generated) and `data` (training windows and batching) sections."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynaforge.config.base import ConfigError


@dataclass
class DatasetConfig:
    """How many trajectories to generate, how they are split into shards, and where they run."""

    n_train: int = 64
    """Trajectories in the train split."""
    n_val: int = 16
    """Trajectories in the validation split."""
    n_test: int = 16
    """Trajectories in the test split."""
    shard_size: int = 64
    """Trajectories per HDF5 shard (the unit of resumption and of parallel generation)."""
    batch_size: int = 64
    """Trajectories stepped together by the solver."""
    seed: int = 0
    """Base seed; each sample's seed derives from (seed, split, global index) alone."""
    device: str = "cpu"
    """Where the solver runs: `cpu`, `cuda`, `cuda:1` or `auto`."""

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.shard_size < 1 or self.batch_size < 1:
            raise ConfigError("shard_size and batch_size must be >= 1")

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


@dataclass
class DataConfig:
    """Training windows cut from a dataset folder, and how they are batched.

    A window is `history` input frames followed by the frames the model must predict, all `stride` stored
    frames apart. Fields are normalised per channel with the train split's mean and standard deviation.
    """

    history: int = 1
    """Input frames the model sees per call."""
    horizon: int = 1
    """Frames the model predicts per call."""
    stride: int = 1
    """Take every `stride`-th stored frame (the model's time step is stride x the stored frame spacing)."""
    batch_size: int = 32
    """Windows per optimiser step (and per evaluation batch)."""
    num_workers: int = 0
    """DataLoader worker processes; 0 reads in the main process (the splits are held in memory)."""
    pin_memory: bool | None = None
    """Page-locked host batches for fast copies to a GPU; null means yes when training on CUDA."""
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    """How DataLoader workers start; `fork` is unsafe with threads, CUDA or open HDF5 files."""

    def __post_init__(self) -> None:
        for name in ("history", "horizon", "stride", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {self.num_workers}")
