"""Where training windows come from, decided in one place: `window_sources`.

`data.source: stream` generates the train trajectories while training runs (`dynaforge.data.stream`);
otherwise they are a dataset folder's train split, held in memory or read lazily through a bounded buffer
(`data.reading`; `auto` reads lazily when the splits would not fit `data.memory_budget_mib`). Validation
windows are the folder's val split (held or read like the train split), or the val split generated in
memory when streaming without a folder. Every source is cut into windows by the one `WindowDataset` and
ordered by the one `EpochOrder`; what the trainer gets (`WindowSources`) is the same whichever it is.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from torch.utils.data import DataLoader, Dataset

from dynaforge.config import Config
from dynaforge.data.boundary import (
    boundary_normalizer,
    boundary_parameters_of,
    check_parameter_channels,
    split_frames_with_boundary,
)
from dynaforge.data.identity import DataIdentity, check_config_matches_data, data_fingerprint, data_identity
from dynaforge.data.lazy import LazyTrajectories
from dynaforge.data.loader import make_loader
from dynaforge.data.mixture import mixture_plan
from dynaforge.data.normalize import Normalizer
from dynaforge.data.order import EpochOrder
from dynaforge.data.stream import generated_val, stream_identity, stream_normalizer
from dynaforge.data.stream_workers import streamed_windows
from dynaforge.data.windows import MemoryTrajectories, TrajectorySource, WindowDataset
from dynaforge.errors import DATA, ConfigError, RunError
from dynaforge.store import DatasetFolder
from dynaforge.store.format import held_channels

SplitWindows = Callable[[DatasetFolder, str], Dataset]
"""A task's own windows of a split of a folder, held in memory (the latent stack's stages)."""


@dataclass
class WindowSources:
    """The train and val windows of a run, their order and loaders, and what the run records of them."""

    train: Dataset
    val: Dataset
    order: EpochOrder
    train_loader: DataLoader
    val_loader: DataLoader
    normalizer: Normalizer
    identity: DataIdentity
    fingerprint: str
    spatial_dims: int
    held: tuple[int, ...]
    """Channels the model is given but does not predict (an obstacle mask, `store.format.held_channels`;
    the boundary channels)."""
    windows_per_epoch: int
    """Train windows of an epoch (streaming: this process's)."""
    examples: Dataset
    """Windows to try the compiled model on (the stream's are generated only as training draws them)."""
    reading: str
    """`lazy` when the train windows are read from the shards, else `memory` (the run's header)."""
    kind: str
    """How the train windows are described in the log: ``, `streamed `."""
    loaded_measure: str | None
    """The measure of trajectories made available per second: generated (stream) or read (lazy, in this
    process); None when nothing is loaded while training."""
    advice: str
    """What to change when training waits for these windows."""
    trajectories: TrajectorySource | None = None
    """The train windows' source (None: a task's own windows)."""
    boundary: tuple[str, ...] = ()
    """The boundary parameters given as channels after the physical ones (`data.boundary_channels`)."""
    parameters: tuple[str, ...] = ()
    """The coefficients given as channels after the boundary ones (`data.parameter_channels`)."""

    def loaded(self) -> int:
        """Train trajectories generated or read so far in this process."""
        return self.trajectories.loaded if self.trajectories is not None else 0

    def close(self) -> None:
        """Stop the stream's generator thread or processes, if any."""
        if self.trajectories is not None:
            self.trajectories.close()


def window_sources(
    config: Config,
    data_root: Path | None,
    device: torch.device,
    seed: int,
    epochs: int,
    rank: int = 0,
    world_size: int = 1,
    drop_last: bool = False,
    windows: SplitWindows | None = None,
    normalizer: Normalizer | None = None,
) -> WindowSources:
    """The train and val windows of `config` (see the module docstring) for rank `rank` of `world_size`
    training `epochs` epochs on `device`, ordered by `seed`; `drop_last`: the train loader drops a last
    partial batch. `windows`: a task's own windows of a folder's splits instead of the config's (held in
    memory, ordered like them). `normalizer`: the statistics to normalise with instead of the data's own (a
    fine-tuning run keeps its pretrained run's, `data.finetune_normalize`); as many channels as the data."""
    streaming = config.data.source == "stream"
    if data_root is None and not streaming:
        raise ConfigError(
            f"training reads a dataset folder: pass {DATA}, or train from the simulator with data.source=stream"
        )
    if config.mixture and data_root is not None:
        raise ConfigError(
            f"a mixture generates its val split in memory from its systems: drop {DATA} (or drop `mixture` "
            "to train on the folder's system)"
        )
    folder = DatasetFolder(data_root) if data_root is not None else None
    if folder is not None:
        folder.verify_shards()
        check_config_matches_data(config, folder)
        identity, fingerprint = data_identity(folder), data_fingerprint(folder)
    else:
        identity, fingerprint = stream_identity(config)
    parameters = tuple(config.data.parameter_channels)
    if parameters:
        check_parameter_source(config, folder, windows)
    # a stream's normaliser counts its coefficient channels: `MixturePlan.rows` appends them
    own = stream_normalizer(config) if streaming else folder_normalizer(folder)
    boundary: tuple[str, ...] = ()
    if config.data.boundary_channels:
        check_boundary_source(config, folder, windows)
    if folder is not None and not streaming and (config.data.boundary_channels or parameters):
        train_params = folder.read_split("train")
        if config.data.boundary_channels:
            boundary = boundary_parameters_of(train_params.param_names, train_params.params)
        own = boundary_normalizer(own, train_params.params, train_params.param_names, boundary, parameters)
    if normalizer is not None and normalizer.channels != own.channels:
        raise ConfigError(
            f"the pretrained model normalises {normalizer.channels} channel(s), this config's data has "
            f"{own.channels}: fine-tune on a system of as many channels, with the pretrained run's "
            "data.boundary_channels and data.parameter_channels"
        )
    if normalizer is None:
        normalizer = Normalizer.identity(own.channels) if config.data.normalize == "none" else own

    data = config.data
    targets = data.horizon * config.train.rollout_steps
    lazily = folder is not None and windows is None and reads_lazily(config, folder)

    def split(name: str) -> tuple[Dataset, TrajectorySource | None]:
        assert folder is not None
        if folder.split_size(name) == 0:
            raise RunError(
                f"the {name} split of {folder.root} is empty; generate it with dataset.n_{name} > 0"
            )
        if windows is not None:
            return windows(folder, name), None
        source: TrajectorySource
        if lazily:
            source = LazyTrajectories(folder.trajectory_reader(name), normalizer, buffer=data.buffer)
        else:
            source = MemoryTrajectories.normalized(
                split_frames_with_boundary(folder, name, boundary, parameters), normalizer
            )
        return WindowDataset(source, data.history, targets, data.stride), source

    if folder is not None:
        val, _ = split("val")
    else:
        val = WindowDataset(generated_val(config, normalizer), data.history, targets, data.stride)
    if streaming:
        train, trajectories, order = streamed_windows(config, normalizer, seed, epochs, rank, world_size)
    else:
        train, trajectories = split("train")
        if isinstance(train, WindowDataset):
            block = data.buffer if lazily else len(train.source)
            order = EpochOrder(train.samples, train.windows_per_sample, block, seed, rank, world_size)
        else:
            order = EpochOrder(len(train), 1, len(train), seed, rank, world_size)
    # The stream's generator thread lives in this process and may hand over tensors on a GPU (not pinnable).
    train_data = dataclasses.replace(data, num_workers=0, pin_memory=False) if streaming else data
    train_loader = make_loader(train, train_data, device, shuffle=False, sampler=order, drop_last=drop_last)
    # Validation: positions rank, rank + W, ... in order, unpadded (the ranks' sums are reduced).
    val_loader = make_loader(val, data, device, shuffle=False, sampler=range(rank, len(val), world_size))
    loaded, advice = loading_measure(
        "stream" if streaming else "lazy" if lazily else "memory", data.num_workers
    )
    return WindowSources(
        train=train,
        val=val,
        order=order,
        train_loader=train_loader,
        val_loader=val_loader,
        normalizer=normalizer,
        identity=identity,
        fingerprint=fingerprint,
        spatial_dims=len(identity.space),
        held=held_channels(
            folder.channel_names
            if folder is not None
            else mixture_plan(config).members[0].system.channel_names
        )
        + tuple(range(own.channels - len(boundary) - len(parameters), own.channels)),
        windows_per_epoch=order.num_samples if streaming else len(train),
        examples=val if streaming else train,
        reading="lazy" if lazily else "memory",
        kind="streamed " if streaming else "",
        loaded_measure=loaded,
        advice=advice,
        trajectories=trajectories,
        boundary=boundary,
        parameters=parameters,
    )


def check_boundary_source(config: Config, folder: DatasetFolder | None, windows: SplitWindows | None) -> None:
    """`data.boundary_channels` reads the splits whole from a dataset folder, for the window task."""
    if folder is None or config.data.source == "stream":
        raise ConfigError(
            "data.boundary_channels reads each sample's boundary values from a dataset folder: train on a "
            f"stored dataset ({DATA}, data.source=store) or set it false"
        )
    if windows is not None:
        raise ConfigError(
            "data.boundary_channels is read by the window task only: set it false for this task"
        )
    if reads_lazily(config, folder):
        raise ConfigError(
            "data.boundary_channels reads the splits whole: set data.reading=memory (or raise "
            "data.memory_budget_mib), or set it false"
        )


def check_parameter_source(
    config: Config, folder: DatasetFolder | None, windows: SplitWindows | None
) -> None:
    """`data.parameter_channels` from a dataset folder: names its system records, and the window task
    reading the splits whole (a stream's systems are checked where its plan is built, `mixture_plan`)."""
    if folder is None:
        return
    names = folder.read_split("train", 1).param_names
    check_parameter_channels(config.data.parameter_channels, [(folder.system, names)])
    if windows is not None:
        raise ConfigError("data.parameter_channels is read by the window task only: set it [] for this task")
    if reads_lazily(config, folder):
        raise ConfigError(
            "data.parameter_channels reads the splits whole: set data.reading=memory (or raise "
            "data.memory_budget_mib), or set it []"
        )


def folder_normalizer(folder: DatasetFolder | None) -> Normalizer:
    """The statistics of the folder's train split."""
    assert folder is not None, "window_sources refuses to train from stored data without a folder"
    return Normalizer.from_stats(folder.stats)


def loading_measure(reading: str, num_workers: int) -> tuple[str | None, str]:
    """The measure of trajectories loaded per second for windows held in memory, read lazily or streamed
    (None: nothing is loaded while training, or workers load out of sight), and what to change when
    training waits for them."""
    if reading == "stream":
        return "trajectories_generated_per_s", (
            "the solver does not keep up: raise data.stream.reuse (each trajectory drawn more often), "
            "generate on a GPU (dataset.device=cuda) or store a dataset and train on it"
        )
    if reading == "lazy":
        return "trajectories_read_per_s" if num_workers == 0 else None, (
            "reading from the shards does not keep up: raise data.num_workers, raise data.buffer, or "
            "set data.reading=memory if the splits fit in memory"
        )
    return None, "raise data.num_workers"


def reads_lazily(config: Config, folder: DatasetFolder) -> bool:
    """`data.reading`: lazily when asked, or (auto) when holding the train and val splits would take more
    than `data.memory_budget_mib` (reading a split whole peaks at about 3x its float32 bytes)."""
    data = config.data
    if data.reading != "auto":
        return data.reading == "lazy"
    held = 3 * (folder.split_bytes("train") + folder.split_bytes("val"))
    return held > data.memory_budget_mib * 2**20
