"""The stream's generator processes (`data.stream.workers` > 0), and the one place a stream is set up.

`WorkerStreamedTrajectories` keeps `StreamedTrajectories`' bookkeeping (rounds, one round of look-ahead,
dropping what no later round uses) but hands each generation block to a pool of spawned processes instead
of a thread of the trainer: a task is (local index, global index) of a block's first sample, a result is
that block, normalised, on the host. A block's bytes are a function of its index (`dynaforge.data.mixture`),
and results are filed under their index, so which worker made a block, or which finished first, changes
nothing: 0, 1 or 8 workers draw the same windows, and a resumed run regenerates exactly what it needs.
Each worker runs its solver on one thread (the trainer keeps the cores it asked for).
"""

from __future__ import annotations

import math
import queue
import traceback
from typing import Any

import torch
import torch.multiprocessing as mp
from torch import Tensor

from dynaforge.config import Config
from dynaforge.data.mixture import mixture_plan
from dynaforge.data.normalize import Normalizer
from dynaforge.data.order import EpochOrder, Rounds
from dynaforge.data.stream import StreamedTrajectories, generating_device, normalized_block
from dynaforge.data.windows import WindowDataset

POLL_SECONDS = 1.0
"""How often a trainer waiting for a block checks that the workers are alive."""


def generate_in_worker(
    config: Config, stats: dict[str, Any], device: str, block: int, tasks: Any, results: Any
) -> None:
    """A generator process: blocks of `block` train samples of `config`'s stream, until a None task or the
    trainer's end (a SIGKILLed trainer sends nothing: the worker sees its parent gone and leaves)."""
    torch.set_num_threads(1)
    parent = mp.parent_process()
    try:
        plan, normalizer = mixture_plan(config), Normalizer.from_stats(stats)
        while True:
            try:
                task = tasks.get(timeout=POLL_SECONDS)
            except queue.Empty:
                if parent is not None and not parent.is_alive():
                    return
                continue
            if task is None:
                return
            local, first = task
            frames = normalized_block(plan, normalizer, first, block, torch.device(device))
            results.put((local, frames.cpu()))
    except BaseException:  # reported to the trainer, which raises it
        results.put((-1, traceback.format_exc()))


class WorkerStreamedTrajectories(StreamedTrajectories):
    """One rank's streamed trajectories made by `workers` generator processes (see the module docstring)."""

    def __init__(self, config: Config, workers: int, **stream: Any) -> None:
        super().__init__(**stream)
        self.config, self.workers = config, workers
        self.processes: list[Any] = []
        self.tasks: Any = None
        self.results: Any = None

    def start_workers(self) -> None:
        context = mp.get_context("spawn")
        self.tasks, self.results = context.Queue(), context.Queue()
        stats = self.normalizer.to_dict()
        for index in range(self.workers):
            process = context.Process(
                target=generate_in_worker,
                args=(self.config, stats, str(self.device), self.block, self.tasks, self.results),
                name=f"dynaforge-stream-{index}",
                daemon=True,
            )
            process.start()
            self.processes.append(process)

    def enter_round(self, k: int) -> None:
        """Training has reached round `k`: drop what no later round uses, hand the workers the blocks up to
        the end of round k + 1 (starting, the first time, at round k's first trajectory)."""
        first = k * self.replaced
        self.round = k
        for old in [m for m in self.samples if m < first]:
            del self.samples[old]
        self.limit = first + self.buffer + self.replaced
        if not self.processes:
            self.next_local = first // self.block * self.block
            self.start_workers()
        while self.next_local < self.limit:
            self.tasks.put((self.next_local, self.global_sample(self.next_local)))
            self.next_local += self.block

    def file(self, local: int, frames: Tensor | str) -> None:
        """File a worker's block under its index (dropping samples of rounds training has left)."""
        if isinstance(frames, str):
            raise RuntimeError(f"the stream's generator process failed:\n{frames}")
        first = self.round * self.replaced
        self.samples.update({local + i: frames[i] for i in range(self.block) if local + i >= first})
        self.loaded += self.block

    def collect(self, wait: bool) -> None:
        """File the blocks the workers have finished (waiting up to `POLL_SECONDS` for one when `wait`)."""
        try:
            self.file(*self.results.get(timeout=POLL_SECONDS) if wait else self.results.get_nowait())
        except queue.Empty:
            dead = [p.name for p in self.processes if not p.is_alive()]
            if wait and dead:
                raise RuntimeError(f"the stream's generator process(es) {', '.join(dead)} died") from None
            return
        while True:
            try:
                self.file(*self.results.get_nowait())
            except queue.Empty:
                return

    def trajectory(self, index: int) -> Tensor:
        """Local trajectory `index`, normalised (T, C, *space); waits for the workers if need be."""
        earliest = max(0, -(-(index + 1 - self.buffer) // self.replaced))  # the earliest round using it
        if earliest > self.round:
            self.enter_round(earliest)
        self.collect(wait=False)
        while index not in self.samples:
            self.collect(wait=True)
        return self.samples[index]

    def close(self) -> None:
        """Stop the workers (a None task each; those that do not leave in time are terminated)."""
        for _ in self.processes:
            self.tasks.put(None)
        for process in self.processes:
            process.join(timeout=10)
            if process.is_alive():
                process.terminate()
                process.join()
        self.processes = []
        for channel in (self.tasks, self.results):
            if channel is not None:
                channel.cancel_join_thread()
                channel.close()
        self.tasks = self.results = None


OPEN_ENDED_EPOCHS = 1 << 20
"""Epochs a time-budget run's stream is sized for (its length is a bound, nothing is made in advance)."""


def streamed_windows(
    config: Config, normalizer: Normalizer, seed: int, epochs: int, rank: int, world_size: int
) -> tuple[WindowDataset, StreamedTrajectories, EpochOrder]:
    """The stream's windows and order for rank `rank` of `world_size`: an epoch generates about
    `dataset.n_train` new samples across the ranks, in a thread or in `data.stream.workers` processes."""
    data, stream = config.data, config.data.stream
    if config.train.time_budget is not None:
        # A time-budget run plans its epochs after this (`train.budget`), often more than `train.epochs`:
        # its stream is open-ended (the length only bounds the window indices an epoch may draw).
        epochs = OPEN_ENDED_EPOCHS
    targets = data.horizon * config.train.rollout_steps
    replaced = stream.buffer // stream.reuse
    rounds = Rounds(stream.reuse, max(1, math.ceil(config.dataset.n_train / (world_size * replaced))))
    frames = (config.mixture[0].system if config.mixture else config.system).n_frames
    settings: dict[str, Any] = dict(
        plan=mixture_plan(config),
        normalizer=normalizer,
        device=generating_device(config),
        buffer=stream.buffer,
        reuse=stream.reuse,
        rank=rank,
        world_size=world_size,
        block=config.dataset.batch_size,
        frames=frames,
        trajectories=(epochs * rounds.per_epoch - 1) * replaced + stream.buffer,
    )
    trajectories = (
        WorkerStreamedTrajectories(config, stream.workers, **settings)
        if stream.workers > 0
        else StreamedTrajectories(**settings)
    )
    windows = WindowDataset(trajectories, data.history, targets, data.stride)
    order = EpochOrder(0, windows.windows_per_sample, stream.buffer, seed, rank, world_size, rounds)
    return windows, trajectories, order
