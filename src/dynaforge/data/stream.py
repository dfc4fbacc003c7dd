"""Training trajectories streamed from the simulator while the model trains: no dataset on disk.

Which samples: training sample j is the sample the store would hold at index j of the train split, made
from `seeds.sample_seed(dataset.seed, "train", j)` by the same `System.sample_rows`, so streamed sample j is
byte-identical to sample j of `dynaforge generate` (for j < dataset.n_train; the stream goes on past it).
Rank w of W generates the blocks of `dataset.batch_size` consecutive samples numbered w, w + W, ...: the
ranks' samples are disjoint and together cover 0, 1, 2, ... without gaps. A rank's own samples are its
*local* trajectories 0, 1, 2, ...

How they are used: `dynaforge.data.order.EpochOrder` with `rounds` draws, in round k, every window of the
local trajectories [k r, k r + buffer) once (r = buffer / reuse). Everything is a function of (config,
epoch, position), so a resumed run regenerates what it needs and draws the same windows in the same order.

`StreamedTrajectories` generates them in a background thread, at most one round ahead of training: a
request for local trajectory m shows that training has reached round ceil((m + 1 - buffer) / r) at least
(windows are drawn round by round), so the trajectories before that round are dropped and the generator
may run to the end of the next one;
memory holds at most buffer + r trajectories (and a generation block). Trajectories stay on the
generating device, normalised there. The trainer measures the time it waits for a batch
(`dynaforge.train.window.WindowTask.data_measures`).
"""

from __future__ import annotations

import hashlib
import logging
import math
import threading

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import Config, config_to_dict, resolve_device
from dynaforge.data.identity import DataIdentity
from dynaforge.data.normalize import Normalizer
from dynaforge.data.order import EpochOrder, Rounds
from dynaforge.data.windows import MemoryTrajectories, WindowDataset
from dynaforge.errors import ConfigError, Option
from dynaforge.seeds import Rows
from dynaforge.store.layout import fields_to_disk
from dynaforge.store.stats import SampleMoments
from dynaforge.systems import System, build_system

log = logging.getLogger(__name__)


def generate_frames(
    system: System, rows: Rows, device: torch.device
) -> Float[Tensor, "samples time channels *space"]:
    """Samples `rows`, (N, T, C, *space) float32 on `device`: what the store's writer would write (the
    system's own channels-first tensor, which never visits the host on its way to the trainer)."""
    return system.sample_rows(rows, device).fields


def statistics_of(frames: Float[Tensor, "samples time channels *space"]) -> dict[str, list[float] | int]:
    """Normalisation statistics of samples, computed as the store computes them (on its layout)."""
    return SampleMoments.of(fields_to_disk(frames)).merged().summary()


class StreamedTrajectories:
    """One rank's normalised training trajectories, generated in a background thread (see the module
    docstring); `trajectory(m)` is local trajectory m, (T, C, *space) on the generating device."""

    def __init__(
        self,
        system: System,
        normalizer: Normalizer,
        base_seed: int,
        device: torch.device,
        buffer: int,
        reuse: int,
        rank: int,
        world_size: int,
        block: int,
        frames: int,
        trajectories: int,
    ) -> None:
        """`block`: consecutive samples generated together (`dataset.batch_size`); `frames`: per trajectory;
        `trajectories`: local trajectories training draws from (its `len`)."""
        self.system, self.normalizer = system, normalizer
        self.base_seed, self.device = base_seed, device
        self.buffer, self.replaced = buffer, buffer // reuse
        self.rank, self.world_size, self.block = rank, world_size, block
        self.size = trajectories
        self.spatial_dims = len(system.shape)
        self.frames = frames
        self.samples: dict[int, Tensor] = {}
        self.condition = threading.Condition()
        self.next_local = 0
        """The next local sample the generator makes (a multiple of `block`)."""
        self.limit = 0
        """The generator may make samples below this (one round ahead of training)."""
        self.round = -1
        """The latest round training is known to have reached."""
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.loaded = 0
        """Samples generated so far (the trainer logs the rate)."""

    def __len__(self) -> int:
        return self.size

    def global_sample(self, local: int) -> int:
        """The train-split index of this rank's `local`-th sample."""
        block, within = divmod(local, self.block)
        return (self.rank + self.world_size * block) * self.block + within

    # ---- the generator thread -------------------------------------------------------------------

    def generate_forever(self) -> None:
        try:
            while True:
                with self.condition:
                    self.condition.wait_for(lambda: self.stopping or self.next_local < self.limit)
                    if self.stopping:
                        return
                    lo = self.next_local
                    self.next_local += self.block
                first = self.global_sample(lo)
                rows = Rows("train", first, first + self.block, self.base_seed)
                physical = generate_frames(self.system, rows, self.device)
                frames = self.normalizer.physical_to_normalized(physical, self.spatial_dims)
                with self.condition:
                    for i in range(self.block):
                        self.samples[lo + i] = frames[i]
                    self.loaded += self.block
                    self.condition.notify_all()
        except BaseException as error:  # handed to the training thread, which raises it
            with self.condition:
                self.error = error
                self.condition.notify_all()

    def close(self) -> None:
        with self.condition:
            self.stopping = True
            self.condition.notify_all()
        if self.thread is not None:
            self.thread.join()
            self.thread = None

    # ---- what training reads --------------------------------------------------------------------

    def enter_round(self, k: int) -> None:
        """Training has reached round `k`: drop what no later round uses, let the generator run to the end
        of round k + 1 (starting, the first time, at round k's first trajectory)."""
        first = k * self.replaced
        with self.condition:
            self.round = k
            for old in [m for m in self.samples if m < first]:
                del self.samples[old]
            self.limit = first + self.buffer + self.replaced
            if self.thread is None:
                self.next_local = first // self.block * self.block
                self.thread = threading.Thread(
                    target=self.generate_forever, name="dynaforge-stream", daemon=True
                )
                self.thread.start()
            self.condition.notify_all()

    def trajectory(self, index: int) -> Tensor:
        """Local trajectory `index`, normalised (T, C, *space); waits for the generator if need be."""
        earliest = max(0, -(-(index + 1 - self.buffer) // self.replaced))  # the earliest round using it
        if earliest > self.round:
            self.enter_round(earliest)
        frames = self.samples.get(index)
        if frames is not None:
            return frames
        with self.condition:
            self.condition.wait_for(lambda: index in self.samples or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"the stream's generator failed: {self.error}") from self.error
            return self.samples[index]


# ---- what a run streams ----------------------------------------------------------------------------


def stream_system(config: Config) -> System:
    system_config = config.system
    if system_config.name == "nbody" and system_config.control.kind == "learned":
        raise ConfigError(
            "data.source=stream cannot run a learned step controller; generate a dataset and train on it"
        )
    return build_system(system_config)


def generating_device(config: Config) -> torch.device:
    return torch.device(resolve_device(config.dataset.device))


def stream_identity(config: Config) -> tuple[DataIdentity, str]:
    """Streaming with no folder: the data's identity, and a fingerprint of what generates it."""
    system = stream_system(config)
    described = repr(sorted(config_to_dict(config)["system"].items())) + repr(config.dataset.seed)
    fingerprint = "stream:" + hashlib.sha256(described.encode()).hexdigest()
    return DataIdentity(config.system.name, tuple(system.shape), system.channels), fingerprint


def stream_normalizer(config: Config) -> Normalizer:
    """The statistics of the first min(dataset.n_train, data.stream.buffer) train samples, generated here (a
    stored dataset of that many train samples has the same statistics, bit for bit)."""
    first = Rows("train", 0, min(config.dataset.n_train, config.data.stream.buffer), config.dataset.seed)
    return Normalizer.from_stats(
        statistics_of(generate_frames(stream_system(config), first, generating_device(config)))
    )


def generated_val(config: Config, normalizer: Normalizer) -> MemoryTrajectories:
    """Streaming with no folder: the val split generated in memory (the samples `dynaforge generate` would
    store)."""
    if config.dataset.n_val == 0:
        raise ConfigError(
            f"streaming without {Option('data')} generates the val split in memory: set dataset.n_val > 0"
        )
    rows = Rows("val", 0, config.dataset.n_val, config.dataset.seed)
    return MemoryTrajectories.normalized(
        generate_frames(stream_system(config), rows, generating_device(config)), normalizer
    )


def streamed_windows(
    config: Config, normalizer: Normalizer, seed: int, epochs: int, rank: int, world_size: int
) -> tuple[WindowDataset, StreamedTrajectories, EpochOrder]:
    """The stream's windows and order for rank `rank` of `world_size`: an epoch generates about
    `dataset.n_train` new samples across the ranks."""
    data, stream = config.data, config.data.stream
    targets = data.horizon * config.train.rollout_steps
    replaced = stream.buffer // stream.reuse
    rounds = Rounds(stream.reuse, max(1, math.ceil(config.dataset.n_train / (world_size * replaced))))
    trajectories = StreamedTrajectories(
        stream_system(config),
        normalizer,
        config.dataset.seed,
        generating_device(config),
        buffer=stream.buffer,
        reuse=stream.reuse,
        rank=rank,
        world_size=world_size,
        block=config.dataset.batch_size,
        frames=config.system.n_frames,
        trajectories=(epochs * rounds.per_epoch - 1) * replaced + stream.buffer,
    )
    windows = WindowDataset(trajectories, data.history, targets, data.stride)
    order = EpochOrder(0, windows.windows_per_sample, stream.buffer, seed, rank, world_size, rounds)
    return windows, trajectories, order
