"""Training windows streamed from the simulator while the model trains: no dataset on disk.

Which samples: training sample j is the sample the store would hold at index j of the train split, made
from `seeds.sample_seed(dataset.seed, "train", j)` by the same `System.sample_rows`, so streamed sample j is
byte-identical to sample j of `dynaforge generate` (for j < dataset.n_train; the stream goes on past it).
Rank w of W generates the blocks of `dataset.batch_size` consecutive samples numbered w, w + W, ...: the
ranks' samples are disjoint and together cover 0, 1, 2, ... without gaps.

How they are used (`StreamPlan`): each rank keeps `buffer` trajectories. Round k draws every window of
its local samples [k r, k r + buffer) once, r = buffer / reuse, in an order fixed by (seed, rank, k); the
next round drops the oldest r and adds r new ones, so each sample is drawn in `reuse` rounds (the first
buffer - r samples, present from the start, in fewer). An epoch is `rounds_per_epoch` rounds. Everything
is a function of (config, epoch, position), so a resumed run regenerates what it needs and draws the same
windows in the same order.

Generation runs in a background thread (`TrajectoryStream`) at most one round ahead of training, so
memory holds about buffer + 2 r trajectories; the trainer measures the time it waits for a batch
(`dynaforge.train.window.WindowTask.data_measures`).
"""

from __future__ import annotations

import logging
import math
import threading
from collections.abc import Iterator
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from dynaforge.config import Config
from dynaforge.data.normalize import Normalizer
from dynaforge.data.windows import Window, fields_to_channels_first
from dynaforge.seeds import Rows
from dynaforge.store.layout import fields_to_disk
from dynaforge.store.stats import SampleMoments
from dynaforge.systems import System

log = logging.getLogger(__name__)


class StreamPlan(NamedTuple):
    """Which windows one rank draws, in which order (see the module docstring); pure functions only."""

    buffer: int
    reuse: int
    rank: int
    world_size: int
    block: int
    """Consecutive samples generated together (`dataset.batch_size`)."""
    windows_per_sample: int
    rounds_per_epoch: int
    batch_size: int
    seed: int
    drop_last: bool = False

    @property
    def replaced(self) -> int:
        """Samples replaced per round (r)."""
        return self.buffer // self.reuse

    @property
    def windows_per_round(self) -> int:
        return self.buffer * self.windows_per_sample

    @property
    def windows_per_epoch(self) -> int:
        return self.rounds_per_epoch * self.windows_per_round

    @property
    def batches_per_epoch(self) -> int:
        whole, rest = divmod(self.windows_per_epoch, self.batch_size)
        return whole + (1 if rest and not self.drop_last else 0)

    def global_sample(self, local: int) -> int:
        """The train-split index of this rank's `local`-th sample."""
        block, within = divmod(local, self.block)
        return (self.rank + self.world_size * block) * self.block + within

    def round_order(self, round_index: int) -> np.ndarray:
        """(windows, 2) int64: (local sample, window offset) of round `round_index`, in drawing order."""
        rng = np.random.default_rng(
            np.random.SeedSequence(entropy=self.seed, spawn_key=(self.rank, round_index))
        )
        first = round_index * self.replaced
        flat = rng.permutation(self.windows_per_round)
        samples, offsets = np.divmod(flat, self.windows_per_sample)
        return np.stack([samples + first, offsets], axis=1).astype(np.int64)

    def epoch_batches(self, epoch: int, skip: int = 0) -> Iterator[tuple[int, np.ndarray]]:
        """(round of its first window, (local sample, offset) rows) of each micro-batch of `epoch`, after the
        first `skip` batches. A batch may straddle two rounds."""
        first_round = epoch * self.rounds_per_epoch
        order = np.concatenate([self.round_order(first_round + q) for q in range(self.rounds_per_epoch)])
        for b in range(skip, self.batches_per_epoch):
            position = b * self.batch_size
            yield (
                first_round + position // self.windows_per_round,
                order[position : position + self.batch_size],
            )


def stream_plan(
    config: Config, rank: int, world_size: int, windows_per_sample: int, drop_last: bool
) -> StreamPlan:
    """The plan of `config` for rank `rank` of `world_size`: an epoch generates about `dataset.n_train`
    new samples across the ranks."""
    stream = config.data.stream
    replaced = stream.buffer // stream.reuse
    rounds = max(1, math.ceil(config.dataset.n_train / (world_size * replaced)))
    return StreamPlan(
        buffer=stream.buffer,
        reuse=stream.reuse,
        rank=rank,
        world_size=world_size,
        block=config.dataset.batch_size,
        windows_per_sample=windows_per_sample,
        rounds_per_epoch=rounds,
        batch_size=config.data.batch_size,
        seed=config.train.seed,
        drop_last=drop_last,
    )


def generate_samples(
    system: System, base_seed: int, split: str, start: int, stop: int, device: torch.device
) -> np.ndarray:
    """Samples [start, stop) of `split`, (n, T, *space, C) float32: what the store's writer would write."""
    return fields_to_disk(system.sample_rows(Rows(split, start, stop, base_seed), device).fields)


def statistics_of(fields: np.ndarray) -> dict[str, list[float] | int]:
    """Normalisation statistics of channels-last samples, computed as the store computes them."""
    return SampleMoments.of(fields).merged().summary()


class TrajectoryStream:
    """Normalised training samples of one rank, generated in a background thread (see the module
    docstring); `batches(epoch, skip)` yields the micro-batches of `StreamPlan.epoch_batches` as Windows."""

    def __init__(
        self,
        plan: StreamPlan,
        system: System,
        normalizer: Normalizer,
        base_seed: int,
        device: torch.device,
        history: int,
        targets: int,
        stride: int,
    ) -> None:
        self.plan, self.system, self.normalizer = plan, system, normalizer
        self.base_seed, self.device = base_seed, device
        self.history, self.targets, self.stride = history, targets, stride
        self.spatial_dims = len(system.shape)
        self.samples: dict[int, Tensor] = {}
        self.condition = threading.Condition()
        self.next_local = 0
        """The next local sample the generator makes (a multiple of the plan's block)."""
        self.limit = 0
        """The generator may make samples below this (one round ahead of training)."""
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None
        self.stopping = False
        self.generated = 0
        """Samples generated so far (the trainer logs the rate)."""

    # ---- the generator thread -------------------------------------------------------------------

    def start_at(self, local: int) -> None:
        """Start generating at the block holding local sample `local` (once: later rounds follow on)."""
        if self.thread is not None:
            return
        self.next_local = local // self.plan.block * self.plan.block
        self.thread = threading.Thread(target=self.generate_forever, name="dynaforge-stream", daemon=True)
        self.thread.start()

    def generate_forever(self) -> None:
        try:
            while True:
                with self.condition:
                    self.condition.wait_for(lambda: self.stopping or self.next_local < self.limit)
                    if self.stopping:
                        return
                    lo = self.next_local
                    self.next_local += self.plan.block
                first = self.plan.global_sample(lo)
                fields = generate_samples(
                    self.system, self.base_seed, "train", first, first + self.plan.block, self.device
                )
                frames = self.normalizer.physical_to_normalized(
                    fields_to_channels_first(fields), self.spatial_dims
                )
                with self.condition:
                    for i in range(self.plan.block):
                        self.samples[lo + i] = frames[i]
                    self.generated += self.plan.block
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

    def sample(self, local: int) -> Tensor:
        """Local sample `local`, normalised (T, C, *space); waits for the generator if need be."""
        frames = self.samples.get(local)
        if frames is not None:
            return frames
        with self.condition:
            self.condition.wait_for(lambda: local in self.samples or self.error is not None)
            if self.error is not None:
                raise RuntimeError(f"the stream's generator failed: {self.error}") from self.error
            return self.samples[local]

    def enter_round(self, round_index: int) -> None:
        """Drop the samples no later round uses; let the generator run to the end of the next round."""
        plan = self.plan
        first = round_index * plan.replaced
        with self.condition:
            for local in [m for m in self.samples if m < first]:
                del self.samples[local]
            self.limit = first + plan.buffer + plan.replaced
            self.condition.notify_all()

    def batches(self, epoch: int, skip: int = 0) -> Iterator[Window]:
        """The micro-batches of `epoch` after the first `skip`, collated (B, frames, C, *space)."""
        plan = self.plan
        span = (self.history + self.targets - 1) * self.stride + 1
        for round_index, rows in plan.epoch_batches(epoch, skip):
            self.enter_round(round_index)
            self.start_at(round_index * plan.replaced)
            windows = []
            for local, start in rows.tolist():  # a window's offset is its start frame (`window_starts`)
                windows.append(self.sample(local)[start : start + span : self.stride])
            frames = torch.stack(windows)
            yield Window(inputs=frames[:, : self.history], targets=frames[:, self.history :])
