"""The `dataset` (what is generated) and `data` (training windows and batching) sections."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynaforge.config.base import AT_LEAST_ONE, NON_NEGATIVE, POSITIVE, ConfigError, check_values, checked


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
class StreamConfig:
    """Training trajectories generated while the model trains (`data.source: stream`), no dataset on disk.

    The stream holds `buffer` trajectories; each round of training draws every window of the buffer once,
    in an order fixed by (train seed, rank, round), then the oldest `buffer / reuse` trajectories are
    replaced by new ones, so each trajectory is seen `reuse` rounds before it leaves (README, "When to
    stream, when to store").
    """

    buffer: int = checked(64, check=AT_LEAST_ONE)
    """Trajectories held at once (per training process); memory is about (buffer + buffer / reuse)
    trajectories."""
    reuse: int = checked(4, check=AT_LEAST_ONE)
    """Rounds each trajectory is drawn in before it is replaced; must divide `buffer`."""
    workers: int = checked(0, check=NON_NEGATIVE.because("generator processes"))
    """Processes that generate the trajectories (spawned, one solver thread each); 0 generates in a thread
    of the training process. The trajectories do not depend on it."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.buffer % self.reuse:
            raise ConfigError(
                f"data.stream.buffer={self.buffer} is not a multiple of data.stream.reuse={self.reuse}: each "
                "round replaces buffer / reuse trajectories; choose a buffer that reuse divides"
            )


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
    normalize: Literal["train_stats", "none"] = "train_stats"
    """`train_stats`: every channel minus the train split's mean, over its standard deviation (all frames
    pooled); `none`: the model reads and predicts physical units (mean 0, std 1 saved in the checkpoint).
    Read by the window task trained from a dataset folder (not by the latent stack's stages)."""
    finetune_normalize: Literal["pretrained", "data"] = "pretrained"
    """Fine-tuning (`dynaforge train --from RUN`): `pretrained` normalises with the pretrained run's
    statistics, so the pretrained weights read fields on the scale they were trained on (and the fine-tuned
    checkpoint keeps them); `data` renormalises with this data's own (as `normalize` says). Keeping the
    pretrained statistics cut a viscous-Burgers fine-tuning's 10-step rollout error 1.9x (docs/mixture.md)."""
    num_workers: int = checked(0, check=NON_NEGATIVE)
    """DataLoader worker processes; 0 reads in the main process (with `reading: lazy` each worker opens its
    own HDF5 handles and holds its own buffer). Not used by the stream, which has `data.stream.workers`."""
    pin_memory: bool | None = None
    """Page-locked host batches for fast copies to a GPU; null means yes when training on CUDA."""
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    """How DataLoader workers start; `fork` is unsafe with threads, CUDA or open HDF5 files."""
    source: Literal["store", "stream"] = "store"
    """Where training trajectories come from: `store`, a dataset folder (`--data`); `stream`, generated from
    `system` and `dataset` while training runs (validation stays fixed: the folder's, or generated in memory)."""
    reading: Literal["auto", "memory", "lazy"] = "auto"
    """How stored splits are read: whole into memory (`memory`), window by window from the shards with a
    bounded shuffle buffer (`lazy`), or in memory when the train and val splits together fit in
    `memory_budget_mib` (`auto`)."""
    memory_budget_mib: float = checked(2048.0, check=POSITIVE)
    """The memory `reading: auto` may spend on holding splits, in MiB."""
    buffer: int = checked(32, check=AT_LEAST_ONE)
    """Trajectories held per reading process when windows are read from the shards: the shuffle draws
    the windows of `buffer` trajectories at a time (`reading: lazy`), so memory is about buffer x one trajectory."""
    stream: StreamConfig = field(default_factory=StreamConfig)
    """The stream source (`source: stream`)."""
    boundary_channels: bool = False
    """Give the model each sample's boundary values as input channels: every boundary parameter that
    differs between the train samples (`left_value`, `left_amplitude`, `left_frequency`, ..., `lid_speed`, `inflow_peak`)
    becomes one constant field, normalised by its train mean and std, held from the input like an
    obstacle mask (not predicted, not scored; docs/bounded.md). Read with `reading: memory` or `auto` from a
    dataset folder (not `lazy`, not a stream)."""
    parameter_channels: list[str] = field(default_factory=list)
    """Parameters (coefficients) to give the model as input channels, by name (`[viscosity, diffusivity]`):
    each becomes one constant field of the sample's value after the boundary channels, normalised and held
    like them, and is 0 for a system that lacks that parameter (a mixture's Kuramoto-Sivashinsky member has
    no `viscosity`). A stream (a mixture too) or a dataset folder read with `reading: memory` or `auto`;
    every name must be a parameter of at least one of the systems (docs/mixture.md)."""

    def __post_init__(self) -> None:
        check_values(self)
