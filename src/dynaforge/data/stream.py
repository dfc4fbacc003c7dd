"""Training trajectories streamed from the simulator while the model trains: no dataset on disk.

Which samples: training sample j is the sample the store would hold at index j of the train split, made
from `seeds.sample_seed(dataset.seed, "train", j)` by the same `System.sample_rows`, so streamed sample j is
byte-identical to sample j of `dynaforge generate` (for j < dataset.n_train; the stream goes on past it).
With a `mixture`, sample j is drawn from one of its systems by (dataset.seed, j) alone
(`dynaforge.data.mixture`).
Rank w of W generates the blocks of `dataset.batch_size` consecutive samples numbered w, w + W, ...: the
ranks' samples are disjoint and together cover 0, 1, 2, ... without gaps. A rank's own samples are its
*local* trajectories 0, 1, 2, ...

How they are used: `dynaforge.data.order.EpochOrder` with `rounds` draws, in round k, every window of the
local trajectories [k r, k r + buffer) once (r = buffer / reuse). Everything is a function of (config,
epoch, position), so a resumed run regenerates what it needs and draws the same windows in the same order.

`StreamedTrajectories` generates them in a background thread (with `data.stream.workers` > 0, in generator
processes: `dynaforge.data.stream_workers`), at most one round ahead of training: a
request for local trajectory m shows that training has reached round ceil((m + 1 - buffer) / r) at least
(windows are drawn round by round), so the trajectories before that round are dropped and the generator
may run to the end of the next one;
memory holds at most buffer + r trajectories (and a generation block). Trajectories stay on the
generating device (the host, from generator processes), normalised there. The trainer measures the time it waits for a batch
(`dynaforge.train.window.WindowTask.data_measures`).
"""

from __future__ import annotations

import hashlib
import logging
import threading

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import Config, config_to_dict, resolve_device
from dynaforge.data.identity import DataIdentity
from dynaforge.data.mixture import MixturePlan, mixture_name, mixture_plan
from dynaforge.data.normalize import Normalizer
from dynaforge.data.windows import MemoryTrajectories
from dynaforge.errors import ConfigError, Option
from dynaforge.seeds import Rows
from dynaforge.store.layout import fields_to_disk
from dynaforge.store.stats import SampleMoments
from dynaforge.systems import System

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
        plan: MixturePlan,
        normalizer: Normalizer,
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
        self.plan, self.normalizer = plan, normalizer
        self.device = device
        self.buffer, self.replaced = buffer, buffer // reuse
        self.rank, self.world_size, self.block = rank, world_size, block
        self.size = trajectories
        self.spatial_dims = len(plan.shape)
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

    def make_block(self, lo: int) -> Float[Tensor, "block time channels *space"]:
        """Local samples [lo, lo + block), normalised, on the generating device."""
        first = self.global_sample(lo)
        return normalized_block(self.plan, self.normalizer, first, self.block, self.device)

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
                frames = self.make_block(lo)
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


def normalized_block(
    plan: MixturePlan, normalizer: Normalizer, first: int, block: int, device: torch.device
) -> Float[Tensor, "block time channels *space"]:
    """Train trajectories [first, first + block) of `plan`, normalised, on `device` (what the generator
    thread or a generator process makes)."""
    physical = plan.rows("train", first, first + block, device)
    return normalizer.physical_to_normalized(physical, len(plan.shape))


def generating_device(config: Config) -> torch.device:
    return torch.device(resolve_device(config.dataset.device))


def stream_identity(config: Config) -> tuple[DataIdentity, str]:
    """Streaming with no folder: the data's identity, and a fingerprint of what generates it (a mixture's
    members and weights, or the system)."""
    plan = mixture_plan(config)
    plain = config_to_dict(config)
    generating = plain["mixture"] if config.mixture else sorted(plain["system"].items())
    described = repr(generating) + repr(config.dataset.seed)
    fingerprint = "stream:" + hashlib.sha256(described.encode()).hexdigest()
    return DataIdentity(mixture_name(plan), plan.shape, plan.channels), fingerprint


def stream_normalizer(config: Config) -> Normalizer:
    """The statistics of the first min(dataset.n_train, data.stream.buffer) train samples, generated here (a
    stored dataset of that many train samples has the same statistics, bit for bit)."""
    count = min(config.dataset.n_train, config.data.stream.buffer)
    return Normalizer.from_stats(
        statistics_of(mixture_plan(config).rows("train", 0, count, generating_device(config)))
    )


def generated_val(config: Config, normalizer: Normalizer) -> MemoryTrajectories:
    """Streaming with no folder: the val split generated in memory (the samples `dynaforge generate` would
    store)."""
    if config.dataset.n_val == 0:
        raise ConfigError(
            f"streaming without {Option('data')} generates the val split in memory: set dataset.n_val > 0"
        )
    frames = mixture_plan(config).rows("val", 0, config.dataset.n_val, generating_device(config))
    return MemoryTrajectories.normalized(frames, normalizer)
