"""Surrogates trained on the windows of a dataset folder: the engine's most common task (`WindowTask`).

Windows come from the dataset folder's train and val splits, normalised with the train statistics. With
`train.rollout_steps` > 1 the model is unrolled autoregressively on its own predictions, and the loss
covers every predicted frame (gradients flow through the whole unroll). The loss is computed in fp32
whatever the prediction's precision; validation is the same loss over the validation windows, summed
across processes. The latent stack's stages (`train/stages.py`) are windows tasks too: they change the
windows, the loss and the validation metric.

The data order of an epoch depends on (seed, epoch) alone, and rank r of W takes every W-th window of it,
so W processes with `data.batch_size=B` train like one process with batch W x B, and a resumed run skips
exactly the windows it had trained on.

Where the train windows come from (`data.source`, `data.reading`; README, "When to stream, when to store"):
a split held in memory (`WindowDataset`), windows read from the shards through a bounded buffer
(`LazyWindowDataset`, ordered by `BufferShuffleSampler`), or trajectories generated while training runs
(`TrajectoryStream`, whose order is its `StreamPlan`'s). Each batch's wait for data is measured and logged
(`data_measures`).
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from dynaforge.config import Config, ConfigError, config_to_dict, resolve_device
from dynaforge.data import (
    DataIdentity,
    Normalizer,
    Window,
    WindowDataset,
    check_config_matches_data,
    data_fingerprint,
    data_identity,
    make_loader,
)
from dynaforge.data.lazy import BufferShuffleSampler, LazyWindowDataset
from dynaforge.data.stream import TrajectoryStream, generate_samples, statistics_of, stream_plan
from dynaforge.errors import DATA, Option, RunError
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.store import DatasetFolder
from dynaforge.systems import System, build_system
from dynaforge.train.capture import compile_model
from dynaforge.train.distributed import EpochSampler, ShardSampler, sum_across_ranks
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.losses import LOSSES
from dynaforge.train.task import EngineContext, StepLoss

log = logging.getLogger(__name__)

SLOW_DATA_SHARE = 0.2
SLOW_DATA_SECONDS = 1.0
"""Training that waits for data more than this share of a logging window's wall time, and more than these
seconds in it (start-up waits are short), is told so."""


class WindowTask:
    """Train `config.model` on the windows of dataset folder `data` (see the module docstring)."""

    kind: str | None = None
    capturable = True
    data_parallel = True

    def __init__(self, config: Config, data: str | Path | None) -> None:
        self.config = config
        self.streaming = config.data.source == "stream"
        if data is None and not self.streaming:
            raise ConfigError(
                f"training reads a dataset folder: pass {DATA}, or train from the simulator with "
                "data.source=stream"
            )
        self.data_root = Path(data).resolve() if data is not None else None
        self.loss_fn = LOSSES[config.train.loss]
        self.stream: TrajectoryStream | None = None
        self.waited = 0.0
        self.windows_read = 0
        self.clock = time.perf_counter()
        self.warned_slow = False
        self.generated_before = 0
        self.reads_before = 0

    # ---- set-up ------------------------------------------------------------------------------------

    def setup(self, context: EngineContext) -> None:
        self.context = context
        dataset = DatasetFolder(self.data_root) if self.data_root is not None else None
        if self.streaming:
            self.normalizer = self.stream_normalizer()
        if dataset is not None:
            dataset.verify_shards()
            check_config_matches_data(self.config, dataset)
            self.identity = data_identity(dataset)
            self.fingerprint = data_fingerprint(dataset)
            if not self.streaming:
                self.normalizer = Normalizer.from_stats(dataset.stats)
            if self.config.data.normalize == "none":
                self.normalizer = Normalizer.identity(self.normalizer.channels)
            self.val_set = self.split_windows(dataset, "val")
        else:
            self.setup_without_folder()
        if self.streaming:
            self.setup_stream()
        else:
            assert dataset is not None
            self.train_set = self.split_windows(dataset, "train")
        self.shape = ModelShape(
            channels=self.normalizer.channels,
            history=self.config.data.history,
            horizon=self.config.data.horizon,
            spatial_dims=self.val_set.spatial_dims,
        )
        if not self.streaming:
            self.train_sampler = self.window_sampler(self.train_set, context)
            self.train_loader = make_loader(
                self.train_set,
                self.config.data,
                context.device,
                shuffle=False,
                sampler=self.train_sampler,
                drop_last=context.capturing,  # a captured graph has one batch shape
            )
            self.batches_per_epoch = len(self.train_loader)
        self.val_loader = make_loader(
            self.val_set,
            self.config.data,
            context.device,
            shuffle=False,
            sampler=ShardSampler(len(self.val_set), context.cluster),
        )

    def window_sampler(self, windows: Dataset, context: EngineContext) -> EpochSampler | BufferShuffleSampler:
        cluster, seed = context.cluster, context.settings.seed
        if isinstance(windows, LazyWindowDataset):
            return BufferShuffleSampler(windows, cluster.rank, cluster.world_size, seed)
        return EpochSampler(windows, cluster, seed=seed)

    def stream_normalizer(self) -> Normalizer:
        """Streaming: the statistics of the first min(dataset.n_train, data.stream.buffer) train samples,
        generated here (a stored dataset of that many train samples has the same statistics, bit for bit)."""
        config = self.config
        first = generate_samples(
            self.stream_system(),
            config.dataset.seed,
            "train",
            0,
            min(config.dataset.n_train, config.data.stream.buffer),
            torch.device(resolve_device(config.dataset.device)),
        )
        return Normalizer.from_stats(statistics_of(first))

    def setup_without_folder(self) -> None:
        """Streaming with no --data: the val split generated in memory (the samples `dynaforge generate`
        would store)."""
        config = self.config
        if config.dataset.n_val == 0:
            raise ConfigError(
                f"streaming without {Option('data')} generates the val split in memory: set dataset.n_val > 0"
            )
        system = self.stream_system()
        device = torch.device(resolve_device(config.dataset.device))
        self.identity = DataIdentity(config.system.name, tuple(system.shape), system.channels)
        described = repr(sorted(config_to_dict(config)["system"].items())) + repr(config.dataset.seed)
        self.fingerprint = "stream:" + hashlib.sha256(described.encode()).hexdigest()
        val = generate_samples(system, config.dataset.seed, "val", 0, config.dataset.n_val, device)
        data = config.data
        self.val_set = WindowDataset(
            val,
            self.normalizer,
            history=data.history,
            targets=data.horizon * config.train.rollout_steps,
            stride=data.stride,
        )

    def stream_system(self) -> System:
        system_config = self.config.system
        if system_config.name == "nbody" and system_config.control.kind == "learned":
            raise ConfigError(
                "data.source=stream cannot run a learned step controller; generate a dataset and train on it"
            )
        return build_system(system_config)

    def setup_stream(self) -> None:
        config, context = self.config, self.context
        data = config.data
        targets = data.horizon * config.train.rollout_steps
        span = (data.history + targets - 1) * data.stride + 1
        windows_per_sample = config.system.n_frames - span + 1
        if windows_per_sample < 1:
            raise ConfigError(
                f"trajectories of {config.system.n_frames} frames are too short for windows of {span} frames; "
                "lower data.history, data.horizon, data.stride or train.rollout_steps"
            )
        cluster = context.cluster
        plan = stream_plan(config, cluster.rank, cluster.world_size, windows_per_sample, context.capturing)
        self.stream = TrajectoryStream(
            plan,
            self.stream_system(),
            self.normalizer,
            config.dataset.seed,
            torch.device(resolve_device(config.dataset.device)),
            data.history,
            targets,
            data.stride,
        )
        self.batches_per_epoch = plan.batches_per_epoch

    def split_windows(self, dataset: DatasetFolder, split: str) -> Dataset:
        if dataset.split_size(split) == 0:
            raise RunError(
                f"the {split} split of {dataset.root} is empty; generate it with dataset.n_{split} > 0"
            )
        return self.dataset(dataset, split)

    def reads_lazily(self, folder: DatasetFolder) -> bool:
        """`data.reading`: lazily when asked, or (auto) when holding the train and val splits would take
        more than `data.memory_budget_mib` (reading a split whole peaks at about 3x its float32 bytes)."""
        data = self.config.data
        if data.reading != "auto":
            return data.reading == "lazy"
        held = 3 * (folder.split_bytes("train") + folder.split_bytes("val"))
        return held > data.memory_budget_mib * 2**20

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset:
        """The windows of `split` (a stage task overrides this)."""
        data = self.config.data
        targets = data.horizon * self.config.train.rollout_steps
        if self.reads_lazily(folder):
            return LazyWindowDataset(
                folder.trajectory_reader(split),
                self.normalizer,
                history=data.history,
                targets=targets,
                stride=data.stride,
                buffer=data.buffer,
            )
        return WindowDataset(
            folder.read_split(split).fields,
            self.normalizer,
            history=data.history,
            targets=targets,
            stride=data.stride,
        )

    def build_model(self) -> nn.Module:
        return build_model(self.config.model, self.shape)

    def epochs(self) -> int:
        return self.context.settings.epochs

    def micro_batches(self, epoch: int) -> int:
        return self.batches_per_epoch

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]:
        """This process's micro-batches of `epoch` on the device, after the first `skip`; the time spent
        waiting for each is added to `waited`."""
        self.clock, self.waited, self.windows_read = time.perf_counter(), 0.0, 0  # validation is not reading
        if self.stream is not None:
            batches: Iterator[Any] = self.stream.batches(epoch, skip)
        else:
            self.train_sampler.start(epoch, skip=skip * self.config.data.batch_size)
            batches = iter(self.train_loader)
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            self.waited += time.perf_counter() - asked
            if batch is None:
                return
            self.windows_read += batch[0].shape[0]
            yield self.to_device(batch)

    def data_measures(self) -> dict[str, float]:
        """Since the last call: windows consumed per second, trajectories generated (stream) or read
        (lazy, main process) per second, and the seconds and share of wall time training waited for data.
        Says once in the log when the source does not keep up, and what to change."""
        now = time.perf_counter()
        seconds = max(now - self.clock, 1e-9)
        measures = {
            "windows_per_s": self.windows_read / seconds,
            "data_wait_s": self.waited,
            "data_wait_share": min(self.waited / seconds, 1.0),
        }
        if self.stream is not None:
            generated = self.stream.generated
            measures["trajectories_generated_per_s"] = (generated - self.generated_before) / seconds
            self.generated_before = generated
        elif isinstance(self.train_set, LazyWindowDataset) and self.config.data.num_workers == 0:
            reads = self.train_set.reads
            measures["trajectories_read_per_s"] = (reads - self.reads_before) / seconds
            self.reads_before = reads
        slow = measures["data_wait_share"] > SLOW_DATA_SHARE and self.waited > SLOW_DATA_SECONDS
        if slow and not self.warned_slow:
            self.warned_slow = True
            log.warning(
                "training waited for data %.0f%% of the time (%.2f s); %s",
                100 * measures["data_wait_share"],
                self.waited,
                self.slow_data_advice(),
            )
        self.clock, self.waited, self.windows_read = now, 0.0, 0
        return measures

    def slow_data_advice(self) -> str:
        if self.stream is not None:
            return (
                "the solver does not keep up: raise data.stream.reuse (each trajectory drawn more often), "
                "generate on a GPU (dataset.device=cuda) or store a dataset and train on it"
            )
        if isinstance(self.train_set, LazyWindowDataset):
            return (
                "reading from the shards does not keep up: raise data.num_workers, raise data.buffer, or "
                "set data.reading=memory if the splits fit in memory"
            )
        return "raise data.num_workers"

    def to_device(self, batch: Window | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Every tensor of the batch (inputs, targets, and whatever a task's batches add) on the device."""
        device = self.context.device
        non_blocking = device.type == "cuda"  # the loader pins host batches on CUDA
        return tuple(t.to(device, non_blocking=non_blocking) for t in batch)

    # ---- the step and its measures -------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        """The model unrolled `rollout_steps` times from the inputs, against all target frames."""
        inputs, targets = batch[0], batch[1]
        predicted = autoregressive_rollout(model, ModelInput(frames=inputs), self.config.train.rollout_steps)
        with torch.autocast(self.context.device.type, enabled=False):
            loss = self.loss_fn(predicted, targets)  # in fp32 whatever the prediction's dtype
        return StepLoss(loss, loss)

    def validate(self, model: nn.Module) -> float:
        """Mean loss over the validation windows, unrolled as in training, summed across processes."""
        device = self.context.device
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        for batch in self.val_loader:
            inputs, targets = self.to_device(batch)[:2]
            predicted = autoregressive_rollout(
                model, ModelInput(frames=inputs), self.config.train.rollout_steps
            )
            total = total + self.loss_fn(predicted, targets).to(torch.float64) * inputs.shape[0]
            count += inputs.shape[0]
        sums = torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=device)])
        loss_sum, count = sum_across_ranks(sums, self.context.cluster).tolist()
        return loss_sum / max(count, 1.0)

    def validation_details(self) -> dict[str, float]:
        return {}  # the loss is the one figure of validation

    def compiled(self, model: nn.Module) -> nn.Module | None:
        """torch.compile of the stepped model, tried on the batch sizes training will see (the full one and
        the last, partial one, which may need a recompilation), so that compilation fails here if at all."""
        compiled = compile_model(model, self.context.settings.compile)
        batch_size = self.config.data.batch_size
        examples = self.val_set if self.stream is not None else self.train_set
        windows = (
            self.stream.plan.windows_per_epoch if self.stream is not None else self.train_sampler.num_samples
        )
        last = windows % batch_size
        sizes = [min(batch_size, len(examples))] + ([last] if last and not self.context.capturing else [])
        for size in sizes:
            batch = self.to_device(default_collate([examples[i] for i in range(size)]))
            with self.context.precision.autocast():
                loss = self.loss(compiled, batch)
            loss.objective.backward()
        return compiled

    # ---- what the run records -----------------------------------------------------------------------

    def reads_from_shards(self) -> bool:
        return isinstance(getattr(self, "train_set", None), LazyWindowDataset)  # no train_set when streaming

    def train_windows(self) -> int:
        """Windows per epoch (streaming: this process's)."""
        return self.stream.plan.windows_per_epoch if self.stream is not None else len(self.train_set)

    def describe(self) -> str:
        source = "streamed " if self.stream is not None else ""
        reading = " (read from the shards)" if self.reads_from_shards() else ""
        return f"{self.config.model.name} on {self.train_windows()} {source}windows{reading}"

    def header(self) -> dict[str, Any]:
        return {
            "data": str(self.data_root) if self.data_root is not None else None,
            "source": self.config.data.source,
            "reading": "lazy" if self.reads_from_shards() else "memory",
            "model": self.config.model.name,
            "train_windows": self.train_windows(),
            "val_windows": len(self.val_set),
        }

    def checkpoint_extras(self) -> dict[str, Any]:
        return {
            "model_shape": self.shape._asdict(),
            "normalization": self.normalizer.to_dict(),
            "data": str(self.data_root) if self.data_root is not None else None,
            "data_identity": self.identity.to_dict(),
            "data_fingerprint": self.fingerprint,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing beyond what the engine restores: the windows are read (or generated) again, their order
        a function of the epoch and position."""

    def close(self) -> None:
        """Stop the stream's generator thread (training is over)."""
        if self.stream is not None:
            self.stream.close()


def window_engine(
    config: Config,
    data: str | Path | None,
    out: str | Path,
    progress: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    profile_steps: int = 0,
) -> Engine:
    """The engine set up to train `config.model` on dataset folder `data` into run folder `out` (`data` may be
    None with `data.source: stream`)."""
    return Engine(
        config,
        WindowTask(config, data),
        out,
        progress=progress,
        overwrite=overwrite,
        resume=resume,
        profile_steps=profile_steps,
    )


def train(config: Config, data: str | Path | None, out: str | Path, **options: Any) -> TrainSummary:
    """Train `config` on dataset folder `data` into run folder `out` (see `WindowTask`, `Engine`); `options`
    are `window_engine`'s (progress, overwrite, resume, profile_steps)."""
    engine = window_engine(config, data, out, **options)
    try:
        return engine.fit()
    finally:
        engine.task.close()
