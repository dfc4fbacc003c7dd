"""The training loop. `Trainer.fit` is the loop, in order: forward, backward, clip, optimiser step, EMA,
schedule, log, validate, checkpoint, each a named method; everything else is set-up.

Windows come from the dataset folder's train and val splits, normalised with the train statistics. With
`train.rollout_steps` > 1 the model is unrolled autoregressively on its own predictions, and the loss
covers every predicted frame (gradients flow through the whole unroll).

What one optimiser step does (`train` config section):
- `accumulate` micro-batches of `data.batch_size` windows: each loss is divided by the number of
  micro-batches in its group, so the summed gradient is the gradient of the group's mean loss (exactly,
  when the micro-batches are full; the epoch's last, partial micro-batch weighs as much as a full one);
- the global gradient norm is measured (and logged) always, and clipped to `grad_clip` when set;
- a step whose loss or gradient norm is not finite is skipped on the device (no host sync: see
  `dynaforge.train.optim`) and counted; `max_bad_steps` skipped steps in a row stop the run (checked
  when the logging window is read, so at most `log_every` steps later);
- gradients are then freed (`zero_grad(set_to_none=True)`) and the EMA of the weights is updated.

Host syncs: losses and gradient norms stay on the device and are read once per logging window
(`log_every` steps) and once per epoch; the step path has none.

Other training stages (`dynaforge.train.stages`) reuse this loop through a `TrainTask`: it supplies the
split datasets (batches of any NamedTuple of tensors whose first two fields are inputs and targets), the
loss of a batch and the validation metric that chooses the best checkpoint; the model is still
`config.model`, built from the registry.

Checkpoints (`dynaforge.train.checkpoint`) hold everything needed to continue exactly: `resume=True`
(`dynaforge train ... --resume`) picks up from `checkpoints/last.pt`, in the middle of an epoch if
`checkpoint_every` wrote it there. With `deterministic` a resumed run ends with the same weights, bit for
bit, as one that was never interrupted.
"""

from __future__ import annotations

import contextlib
import logging
import math
import os
import random
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from torch import Tensor, nn
from torch.nn.utils import clip_grads_with_norm_, get_total_norm
from torch.utils.data import Dataset, default_collate
from tqdm import tqdm  # not tqdm.auto: its asyncio variant calls iter(loader) on construction

import dynaforge
from dynaforge.config import (
    Config,
    ConfigError,
    config_to_dict,
    load_config,
    resolve_device,
    save_config,
)
from dynaforge.data import Normalizer, Window, WindowDataset, make_loader
from dynaforge.errors import RunError
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.runs import (
    CHECKPOINT_VERSION,
    holds_run,
    load_checkpoint,
    run_folder,
    save_checkpoint,
    training_differences,
)
from dynaforge.store import DatasetFolder
from dynaforge.train.capture import StepGraph, compile_model, release_memory_if_short
from dynaforge.train.checkpoint import restore_rng_state, rng_state
from dynaforge.train.distributed import (
    EpochSampler,
    ShardSampler,
    barrier,
    check_ranks_agree,
    gather_objects,
    join_cluster,
    leave_cluster,
    rank_device,
    sum_across_ranks,
    wrap_data_parallel,
)
from dynaforge.train.ema import EMA
from dynaforge.train.log import MetricsLog, WandbLogger, WindowMeter, environment
from dynaforge.train.losses import LOSSES
from dynaforge.train.optim import build_optimizer, step_unless
from dynaforge.train.precision import Precision
from dynaforge.train.profile import StepProfiler
from dynaforge.train.schedule import build_scheduler, schedule_intervals

log = logging.getLogger(__name__)


class TrainingDiverged(RunError):
    """Training produced non-finite losses or gradients it could not skip past."""


class TrainSummary(NamedTuple):
    run: Path
    epochs: int
    steps: int
    best_val_loss: float
    last_val_loss: float
    seconds: float
    skipped_steps: int = 0


@runtime_checkable
class TrainTask(Protocol):
    """What the loop needs to train something other than a surrogate on plain windows (see the module
    docstring). Losses it returns are scalars in fp32; `validate` runs under eval mode and inference mode
    (and the run's autocast) and returns the metric to minimise, computed on the whole validation set by
    every process; `checkpoint_extras` adds plain data to every checkpoint."""

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset: ...

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> Tensor: ...

    def validate(self, model: nn.Module) -> float: ...

    def checkpoint_extras(self) -> dict[str, Any]: ...


class Trainer:
    """Trains `config.model` on the windows of dataset folder `data`, writing run folder `out`.

    `resume`: continue the run in `out` from its last checkpoint (a run of the same config), or start one
    there if it has no checkpoint yet. `overwrite`: replace whatever `out` holds. `profile_steps`: profile
    that many optimiser steps into `out/profile/`. `task`: train by a `TrainTask`'s data, loss and
    validation metric instead of the surrogate defaults.
    """

    def __init__(
        self,
        config: Config,
        data: str | Path,
        out: str | Path,
        progress: bool | None = None,
        overwrite: bool = False,
        resume: bool = False,
        profile_steps: int = 0,
        task: TrainTask | None = None,
    ) -> None:
        self.config = config
        self.task = task
        train = config.train
        self.run = run_folder(out)
        self.resume_from = self.checkpoint_to_resume(resume, overwrite)
        self.data_root = Path(data).resolve()
        self.progress = progress
        self.profile_steps = profile_steps
        self.device = torch.device(resolve_device(rank_device(train.device)))
        self.check_determinism_environment()
        self.cluster = join_cluster(self.device)
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.precision = Precision(train.precision, self.device)
        dataset = DatasetFolder(self.data_root)
        self.normalizer = Normalizer.from_stats(dataset.stats)
        self.train_set = self.windows(dataset, "train")
        self.val_set = self.windows(dataset, "val")
        self.shape = ModelShape(
            channels=self.normalizer.channels,
            history=config.data.history,
            horizon=config.data.horizon,
            spatial_dims=self.train_set.spatial_dims,
        )
        seed_everything(train.seed)
        self.model = build_model(config.model, self.shape).to(self.device)
        self.ema = EMA(self.model, train.ema.decay, train.ema.warmup) if train.ema.decay > 0 else None
        self.capturing = self.cuda_graph_possible()
        self.train_sampler = EpochSampler(self.train_set, self.cluster, seed=train.seed)
        self.train_loader = make_loader(
            self.train_set,
            config.data,
            self.device,
            shuffle=False,
            sampler=self.train_sampler,
            drop_last=self.capturing,  # a captured graph has one batch shape
        )
        self.val_loader = make_loader(
            self.val_set,
            config.data,
            self.device,
            shuffle=False,
            sampler=ShardSampler(len(self.val_set), self.cluster),
        )
        self.micro_batches = len(self.train_loader)
        if self.micro_batches == 0:
            raise RunError(
                f"{len(self.train_set)} training windows make no batch of {config.data.batch_size} on each of "
                f"{self.cluster.world_size} process(es); lower data.batch_size"
            )
        self.steps_per_epoch = math.ceil(self.micro_batches / train.accumulate)
        self.optimizer = build_optimizer(self.model, train, capturable=self.capturing)
        intervals = schedule_intervals(train.schedule, train.epochs, self.steps_per_epoch)
        self.scheduler = build_scheduler(self.optimizer, train, intervals)
        self.loss_fn = LOSSES[train.loss]
        self.step_model = wrap_data_parallel(self.model, self.cluster, self.device)
        self.graph = (
            StepGraph(self.captured_step, train.cuda_graph.warmup, self.free_gradients)
            if self.capturing
            else None
        )
        self.metrics = MetricsLog(self.run.metrics)
        self.meter = WindowMeter(self.device)
        self.wandb: WandbLogger | None = None
        self.profiler: StepProfiler | None = None
        self.bar: tqdm | None = None
        # Where training stands (restored by `resume`).
        self.step = 0
        self.epoch = 0
        self.batches_done = 0
        self.best_val_loss = math.inf
        self.val_loss = math.nan
        self.skipped_steps = 0
        self.step_loss = torch.zeros((), dtype=torch.float32, device=self.device)
        self.step_samples = 0
        self.compiled = False

    def windows(self, dataset: DatasetFolder, split: str) -> WindowDataset | Dataset:
        data = self.config.data
        if dataset.split_size(split) == 0:
            raise RunError(
                f"the {split} split of {dataset.root} is empty; generate it with dataset.n_{split} > 0"
            )
        if self.task is not None:
            return self.task.dataset(dataset, split)
        return WindowDataset(
            dataset.read_split(split).fields,
            self.normalizer,
            history=data.history,
            targets=data.horizon * self.config.train.rollout_steps,
            stride=data.stride,
        )

    # ---- the loop ---------------------------------------------------------------------------------

    def fit(self) -> TrainSummary:
        started = time.perf_counter()
        with self.run_settings():
            self.begin()
            for epoch in range(self.epoch, self.config.train.epochs):
                epoch_started = time.perf_counter()
                for batch in self.epoch_batches(epoch):
                    if self.graph is not None:
                        self.graph.run(*batch)  # `captured_step`, replayed as a CUDA graph
                    else:
                        loss = self.forward_loss(*batch)
                        self.backward(loss)
                        if self.accumulating():
                            continue
                        grad_norm = self.clip_gradients()
                        self.optimizer_step(grad_norm)
                        self.update_ema()
                    self.schedule_step()
                    self.count_step()
                    self.log_window_if_due(epoch)
                    self.save_progress_if_due(epoch)
                self.log_window(epoch)
                self.val_loss = self.validate()
                self.schedule_epoch(self.val_loss)
                self.log_epoch(epoch, time.perf_counter() - epoch_started)
                self.save_checkpoints(epochs_done=epoch + 1)
        return TrainSummary(
            run=self.run.root,
            epochs=self.config.train.epochs,
            steps=self.step,
            best_val_loss=self.best_val_loss,
            last_val_loss=self.val_loss,
            seconds=time.perf_counter() - started,
            skipped_steps=self.skipped_steps,
        )

    def captured_step(self, inputs: Tensor, targets: Tensor, *extra: Tensor) -> None:
        """The step of `fit` for CUDA-graph capture (no accumulation; gradients stay allocated)."""
        loss = self.forward_loss(inputs, targets, *extra)
        self.backward(loss)
        grad_norm = self.clip_gradients()
        self.optimizer_step(grad_norm, free_gradients=False)
        self.update_ema()

    # ---- the steps of the loop --------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> Iterator[tuple[Tensor, ...]]:
        """This process's micro-batches of `epoch`, on the device, from where training stands."""
        self.model.train()
        self.train_sampler.start(epoch, skip=self.batches_done * self.config.data.batch_size)
        self.bar = tqdm(
            self.train_loader,
            desc=f"epoch {epoch + 1}/{self.config.train.epochs}",
            unit="batch",
            initial=self.batches_done,
            total=self.micro_batches,
            leave=False,
            disable=not self.cluster.main or (None if self.progress is None else not self.progress),
        )
        self.meter.restart_clock()
        for batch in self.bar:
            self.batches_done += 1
            self.step_samples += batch[0].shape[0]
            yield self.batch_to_device(batch)
        self.bar.close()

    def batch_to_device(self, batch: Window | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Every tensor of the batch (inputs, targets, and whatever a task's batches add) on the device."""
        non_blocking = self.device.type == "cuda"  # the loader pins host batches on CUDA
        return tuple(t.to(self.device, non_blocking=non_blocking) for t in batch)

    def accumulating(self) -> bool:
        """True while the current micro-batch is not the last of its accumulation group."""
        return (
            self.batches_done % self.config.train.accumulate != 0 and self.batches_done != self.micro_batches
        )

    def group_size(self) -> int:
        """Micro-batches in the current accumulation group (the last group of an epoch may be short)."""
        accumulate = self.config.train.accumulate
        start = (self.batches_done - 1) // accumulate * accumulate
        return min(accumulate, self.micro_batches - start)

    def forward_loss(self, inputs: Tensor, targets: Tensor, *extra: Tensor) -> Tensor:
        """Loss of the model unrolled `rollout_steps` times from `inputs` against all `targets` frames
        (or the task's loss of the batch)."""
        if self.task is not None:
            with self.precision.autocast(cache=self.graph is None), self.gradient_sync():
                return self.task.loss(self.step_model, (inputs, targets, *extra))
        with self.precision.autocast(cache=self.graph is None), self.gradient_sync():
            predicted = autoregressive_rollout(
                self.step_model, ModelInput(frames=inputs), self.config.train.rollout_steps
            )
        return self.loss_fn(predicted, targets)  # in fp32 whatever the prediction's dtype

    def gradient_sync(self) -> contextlib.AbstractContextManager[Any]:
        """DDP all-reduces gradients only on the last micro-batch of an accumulation group."""
        ddp = self.model is not self.step_model and hasattr(self.step_model, "no_sync")
        if ddp and torch.is_grad_enabled() and self.accumulating():
            return self.step_model.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: Tensor) -> None:
        scaled = loss / self.group_size()
        self.precision.scaler.scale(scaled).backward()
        first = (self.batches_done - 1) % self.config.train.accumulate == 0
        self.step_loss = scaled.detach() if first else self.step_loss + scaled.detach()

    def clip_gradients(self) -> Tensor:
        """The global gradient norm before clipping (clipped only when `train.grad_clip` is set)."""
        if self.precision.scaling:
            self.precision.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        norm = get_total_norm([p.grad for p in parameters])
        if self.config.train.grad_clip is not None:
            # In place on purpose: gradients are scaled where the optimiser reads them.
            clip_grads_with_norm_(parameters, self.config.train.grad_clip, norm)
        return norm

    def optimizer_step(self, grad_norm: Tensor, free_gradients: bool = True) -> None:
        """Step, unless the loss or gradient is not finite (decided on the device); account; free grads."""
        bad = ~torch.isfinite(grad_norm)
        if not self.cluster.distributed:
            # Under DDP only the all-reduced gradient norm, the same on every rank, decides.
            bad = bad | ~torch.isfinite(self.step_loss)
        step_unless(self.optimizer, bad.to(torch.float32))
        if self.precision.scaling:
            self.precision.scaler.update()
        self.meter.add(self.step_loss, grad_norm, bad)
        if free_gradients:
            self.free_gradients()

    def free_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def update_ema(self) -> None:
        if self.ema is not None:
            self.ema.update(self.model)

    def schedule_step(self) -> None:
        if self.config.train.schedule.interval == "step":
            self.scheduler.step()

    def count_step(self) -> None:
        """Host-side counters of an optimiser step (kept outside the step, which may be a replayed graph)."""
        self.step += 1
        self.meter.count(self.step_samples)
        self.step_samples = 0
        if self.profiler is not None:
            self.profiler.step()

    def validate(self) -> float:
        """Mean loss over the validation windows, unrolled as in training (with the EMA weights if asked)."""
        model = self.evaluation_model()
        model.eval()
        if self.task is not None:
            with torch.inference_mode(), self.precision.autocast():
                return self.checked_validation(self.task.validate(model))
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        with torch.inference_mode(), self.precision.autocast():
            for batch in self.val_loader:
                inputs, targets = self.batch_to_device(batch)
                predicted = autoregressive_rollout(
                    model, ModelInput(frames=inputs), self.config.train.rollout_steps
                )
                total = total + self.loss_fn(predicted, targets).to(torch.float64) * inputs.shape[0]
                count += inputs.shape[0]
        sums = torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=self.device)])
        loss_sum, count = sum_across_ranks(sums, self.cluster).tolist()
        return self.checked_validation(loss_sum / max(count, 1.0))

    def checked_validation(self, value: float) -> float:
        if not math.isfinite(value):
            raise TrainingDiverged(
                f"validation loss is {value} after step {self.step}: training diverged; lower train.lr, set "
                "train.grad_clip or use train.precision=fp32"
            )
        return value

    def evaluation_model(self) -> torch.nn.Module:
        if self.ema is not None and self.config.train.ema.evaluate:
            return self.ema.module
        return self.model

    def schedule_epoch(self, val_loss: float) -> None:
        """Per-epoch bookkeeping: plateau detection, per-epoch schedules, CUDA memory when short."""
        self.scheduler.observe(val_loss)
        if self.config.train.schedule.interval == "epoch":
            self.scheduler.step()
        release_memory_if_short(self.device)

    # ---- set-up and tear-down ---------------------------------------------------------------------

    def checkpoint_to_resume(self, resume: bool, overwrite: bool) -> Path | None:
        """The last checkpoint to continue from, None for a fresh run; refuses to clobber another run."""
        root = self.run.root
        if resume and self.run.config.exists():
            self.check_same_config(config_to_dict(load_config(self.run.config)))
        if resume and self.run.last.exists():
            return self.run.last
        if holds_run(root) and not (overwrite or resume):
            raise RunError(
                f"{root} already holds a run; continue it with --resume, choose another --out folder or "
                "delete this one"
            )
        return None

    def check_same_config(self, saved: dict[str, Any]) -> None:
        wanted = config_to_dict(self.config)
        differences = training_differences(saved, wanted)
        if differences:
            raise RunError(
                f"{self.run.root} holds a run of a different config; it cannot be resumed with this one.\n"
                "  Differences (existing != requested):\n    " + "\n    ".join(differences[:20]) + "\n"
                "  Pass the run's own config (RUN/config.yaml), or train into another --out folder."
            )

    def check_determinism_environment(self) -> None:
        if (
            self.config.train.deterministic
            and self.device.type == "cuda"
            and not os.environ.get("CUBLAS_WORKSPACE_CONFIG")
        ):
            raise ConfigError(
                "train.deterministic=true on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment "
                "(cuBLAS reads it at start-up): export it before training, or set train.deterministic=false"
            )

    def cuda_graph_possible(self) -> bool:
        """Whether the step can be captured; says why not when capture was asked for but cannot be."""
        train = self.config.train
        if not train.cuda_graph.enabled:
            return False
        reasons = []
        if self.device.type != "cuda":
            reasons.append(f"training runs on {self.device.type}")
        if train.accumulate > 1:
            reasons.append("train.accumulate > 1")
        if self.task is not None:
            reasons.append("training by a task")
        if self.cluster.distributed:
            reasons.append("training runs in several processes")
        if train.precision == "fp16":
            reasons.append("fp16's gradient scaler is not capturable")
        if train.optimizer.name not in ("adam", "adamw"):
            reasons.append(f"optimizer {train.optimizer.name} has no capturable mode")
        if train.compile.enabled and train.compile.mode == "reduce-overhead":
            reasons.append("compile mode reduce-overhead already uses CUDA graphs")
        if reasons:
            log.info("CUDA graph capture off: %s", "; ".join(reasons))
            return False
        return True

    @contextlib.contextmanager
    def run_settings(self) -> Iterator[None]:
        """Determinism and cuDNN flags for the run, restored afterwards; the process group left at the end."""
        deterministic = self.config.train.deterministic
        previous = (
            torch.are_deterministic_algorithms_enabled(),
            torch.is_deterministic_algorithms_warn_only_enabled(),
            torch.backends.cudnn.deterministic,
            torch.backends.cudnn.benchmark,
        )
        torch.use_deterministic_algorithms(deterministic)
        torch.backends.cudnn.deterministic = deterministic
        torch.backends.cudnn.benchmark = not deterministic and self.device.type == "cuda"
        try:
            yield
        finally:
            if self.profiler is not None:
                self.profiler.stop()
            if self.wandb is not None:
                self.wandb.finish()
            torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
            torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[2], previous[3]
            leave_cluster(self.cluster)

    def begin(self) -> None:
        """Start a fresh run or restore the last checkpoint; compile; open the loggers and the profiler."""
        if self.resume_from is not None:
            self.restore(load_checkpoint(self.resume_from, map_location=self.device))
        elif self.cluster.main:
            self.prepare_run_folder()
        barrier(self.cluster)
        if self.epoch == self.config.train.epochs:
            return  # a finished run: nothing to compile, log or profile
        if self.config.train.compile.enabled and self.task is None:
            self.compile_with_fallback()
        elif self.config.train.compile.enabled:
            log.info(
                "torch.compile is off when training by a task (its loss is not the rollout the trial checks)"
            )
        if self.cluster.main and self.config.train.wandb.enabled:
            self.wandb = WandbLogger(self.config.train.wandb, self.run.root, config_to_dict(self.config))
        if self.cluster.main and self.profile_steps > 0:
            self.profiler = StepProfiler(self.profile_steps, self.run.root / "profile", self.device)
        log.info(
            "training %s (%d parameters) on %d windows for %d epochs on %s%s, %d process(es)",
            self.config.model.name,
            sum(p.numel() for p in self.model.parameters()),
            len(self.train_set),
            self.config.train.epochs,
            self.device,
            f" from step {self.step}" if self.step else "",
            self.cluster.world_size,
        )

    def prepare_run_folder(self) -> None:
        """Start a fresh run: remove what an earlier attempt left, save the config, begin the log."""
        for stale in (self.run.checkpoints, self.run.eval, self.run.root / "profile"):
            shutil.rmtree(stale, ignore_errors=True)
        (self.run.root / "wandb.json").unlink(missing_ok=True)
        self.run.checkpoints.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run.config)
        self.metrics.start(
            {
                **environment(),
                "data": str(self.data_root),
                "device": str(self.device),
                "world_size": self.cluster.world_size,
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "train_windows": len(self.train_set),
                "val_windows": len(self.val_set),
                "micro_batches_per_epoch": self.micro_batches,
                "steps_per_epoch": self.steps_per_epoch,
                "cuda_graph": self.capturing,
            }
        )

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint written by `save_checkpoints` of a run of the same config."""
        if "rng" not in state or "position" not in state:
            raise RunError(f"{self.resume_from} predates resumable checkpoints; train this run afresh")
        self.model.load_state_dict(state.get("train_model", state["model"]))
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        if state.get("scaler"):
            self.precision.scaler.load_state_dict(state["scaler"])
        if self.ema is not None:
            self.ema.load_state_dict(state["ema"])
        ranks = state["rng"]
        if len(ranks) != self.cluster.world_size:
            log.warning(
                "resuming %d-process training with %d processes: random streams differ",
                len(ranks),
                self.cluster.world_size,
            )
        restore_rng_state(ranks[self.cluster.rank % len(ranks)])
        started_with = state.get("torch_threads")
        if started_with is not None and started_with != torch.get_num_threads():
            log.warning(
                "%s was trained with %d torch thread(s) and continues with %d: the result will differ in the "
                "last bits from an uninterrupted run (set OMP_NUM_THREADS=%d to continue it exactly)",
                self.run.root,
                started_with,
                torch.get_num_threads(),
                started_with,
            )
        self.step = int(state["step"])
        self.epoch = int(state["position"]["epoch"])
        self.batches_done = int(state["position"]["batches"])
        self.best_val_loss = float(state["best_val_loss"])
        self.val_loss = float(state["val_loss"])
        self.skipped_steps = int(state["skipped_steps"])
        self.meter.epoch.copy_(torch.tensor(state["epoch_loss"], dtype=torch.float64))
        if state["complete"]:
            log.info("%s has finished training; nothing to resume", self.run.root)
            return
        if self.cluster.main:
            shutil.rmtree(self.run.eval, ignore_errors=True)  # made from weights training moves on from
            self.metrics.resume(
                self.step,
                {
                    "kind": "resume",
                    "step": self.step,
                    "epoch": self.epoch + 1,
                    "batch": self.batches_done,
                    "world_size": self.cluster.world_size,
                },
            )
        log.info(
            "resuming %s at epoch %d, micro-batch %d, step %d",
            self.run.root,
            self.epoch + 1,
            self.batches_done,
            self.step,
        )

    def compile_with_fallback(self) -> None:
        """torch.compile the stepped model; if a trial step fails to compile, log it and stay eager.

        The trial runs forward and backward on the batch sizes training will see (the full one and the
        last, partial one, which may need a recompilation), so that compilation fails here if it fails at
        all. It leaves no trace: gradients are freed, buffers and random generators restored.
        """
        eager = self.step_model
        compiled = compile_model(eager, self.config.train.compile)
        batch_size = self.config.data.batch_size
        last = self.train_sampler.num_samples % batch_size
        sizes = [min(batch_size, len(self.train_set))] + ([last] if last and not self.capturing else [])
        buffers = [b.detach().clone() for b in self.model.buffers()]
        generators = rng_state()
        try:
            for size in sizes:
                batch = default_collate([self.train_set[i] for i in range(size)])
                inputs, targets = self.batch_to_device(batch)
                with self.precision.autocast(cache=self.graph is None):
                    predicted = autoregressive_rollout(
                        compiled, ModelInput(frames=inputs), self.config.train.rollout_steps
                    )
                self.loss_fn(predicted, targets).backward()
            self.step_model = compiled
            self.compiled = True
            log.info(
                "model compiled (mode %s, backend %s)",
                self.config.train.compile.mode,
                self.config.train.compile.backend,
            )
        except Exception as error:  # any compilation failure: eager, logged
            log.warning(
                "torch.compile failed (%s: %s); training runs eagerly",
                type(error).__name__,
                str(error).splitlines()[0] if str(error) else "",
            )
        finally:
            self.free_gradients()
            with torch.no_grad():
                for buffer, saved in zip(self.model.buffers(), buffers):
                    buffer.copy_(saved)
            restore_rng_state(generators)

    # ---- logging and checkpoints ------------------------------------------------------------------

    def log_window_if_due(self, epoch: int) -> None:
        if self.step % self.config.train.log_every == 0:
            self.log_window(epoch)

    def log_window(self, epoch: int) -> None:
        """Read the window's device meters (one host sync), write a metrics line, stop on a bad streak."""
        if self.meter.steps == 0:
            return
        summary = self.meter.read(
            (lambda t: sum_across_ranks(t, self.cluster)) if self.cluster.distributed else None,
            self.cluster.world_size,
        )
        self.meter.reset()
        self.skipped_steps += summary["skipped"]
        lr = float(self.optimizer.param_groups[0]["lr"])
        record = {"kind": "train", "epoch": epoch + 1, "step": self.step, "lr": lr, **summary}
        if self.cluster.main:
            self.metrics.write(record)
            if self.wandb is not None:
                self.wandb.log(record)
            if self.bar is not None:
                self.bar.set_postfix(loss=f"{summary['loss']:.3e}", lr=f"{lr:.2e}")
        limit = self.config.train.max_bad_steps
        if summary["bad_streak"] >= limit:
            raise TrainingDiverged(
                f"{summary['bad_streak']} optimiser steps in a row had a non-finite loss or gradient (by step "
                f"{self.step}); stopping after train.max_bad_steps={limit}. Lower train.lr, set train.grad_clip, "
                "use train.precision=fp32, or check the data for NaN/Inf. checkpoints/last.pt holds the last "
                "good state."
            )
        if summary["skipped"]:
            log.warning(
                "%d step(s) skipped for a non-finite loss or gradient by step %d",
                summary["skipped"],
                self.step,
            )

    def log_epoch(self, epoch: int, seconds: float) -> None:
        loss_sum, good_steps = sum_across_ranks(self.meter.epoch, self.cluster).tolist()
        train_loss = loss_sum / good_steps if good_steps else math.nan  # the mean of the ranks' means
        record = {
            "kind": "epoch",
            "epoch": epoch + 1,
            "step": self.step,
            "train_loss": train_loss,
            "val_loss": self.val_loss,
            "best": self.val_loss < self.best_val_loss,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped_steps": self.skipped_steps,
            "epoch_time": seconds,
        }
        if self.cluster.main:
            self.metrics.write(record)
            if self.wandb is not None:
                self.wandb.log(record)
        log.info(
            "epoch %d/%d  train %.3e  val %.3e  %.1f s%s",
            epoch + 1,
            self.config.train.epochs,
            train_loss,
            self.val_loss,
            seconds,
            "  (best)" if record["best"] else "",
        )

    def save_progress_if_due(self, epoch: int) -> None:
        """A mid-epoch last.pt every `checkpoint_every` steps (the epoch's end writes its own)."""
        every = self.config.train.checkpoint_every
        if every and self.step % every == 0 and self.batches_done < self.micro_batches:
            self.save_checkpoints(epochs_done=epoch)

    def save_checkpoints(self, epochs_done: int) -> None:
        """At an epoch's end: best.pt when the validation loss improved, then last.pt (so a complete last.pt
        implies best.pt). Mid-epoch (`epochs_done` = the current epoch): last.pt only. Rank 0 writes."""
        at_epoch_end = self.batches_done == self.micro_batches
        improved = at_epoch_end and self.val_loss < self.best_val_loss
        if improved:
            self.best_val_loss = self.val_loss
        position = {"epoch": epochs_done, "batches": 0 if at_epoch_end else self.batches_done}
        epoch_loss = [0.0, 0.0] if at_epoch_end else self.meter.epoch.tolist()
        check_ranks_agree(self.model, self.cluster)
        generators = gather_objects(rng_state(), self.cluster)  # every rank takes part
        if self.cluster.main:
            state = self.checkpoint_state(epochs_done, position, generators, epoch_loss)
            if improved:
                save_checkpoint(self.run.best, state)
            save_checkpoint(self.run.last, state)
            if at_epoch_end and self.wandb is not None and self.config.train.wandb.log_checkpoints:
                aliases = ["latest", f"epoch-{epochs_done}"] + (["best"] if improved else [])
                self.wandb.log_checkpoint(
                    self.run.last,
                    aliases,
                    {"epoch": epochs_done, "step": self.step, "val_loss": self.val_loss},
                )
        barrier(self.cluster)
        if at_epoch_end:
            self.batches_done = 0
            self.meter.epoch.zero_()

    def checkpoint_state(
        self,
        epochs_done: int,
        position: dict[str, int],
        generators: list[dict[str, Any]],
        epoch_loss: list[float],
    ) -> dict[str, Any]:
        trained = self.model.state_dict()
        state: dict[str, Any] = {
            "format_version": CHECKPOINT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "model": trained,
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "scaler": self.precision.scaler.state_dict() if self.precision.scaling else {},
            "rng": generators,
            "epoch": epochs_done,
            "step": self.step,
            "position": position,
            "epoch_loss": epoch_loss,
            "skipped_steps": self.skipped_steps,
            "complete": epochs_done == self.config.train.epochs and position["batches"] == 0,
            "val_loss": self.val_loss,
            "best_val_loss": self.best_val_loss,
            "config": config_to_dict(self.config),
            "model_shape": self.shape._asdict(),
            "normalization": self.normalizer.to_dict(),
            "data": str(self.data_root),
            "world_size": self.cluster.world_size,
            "torch_threads": torch.get_num_threads(),
        }
        if self.task is not None:
            state.update(self.task.checkpoint_extras())
        if self.ema is not None:
            state["ema"] = self.ema.state_dict()
            if self.config.train.ema.evaluate:
                state["model"], state["train_model"] = self.ema.module.state_dict(), trained
        return state


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def train(
    config: Config,
    data: str | Path,
    out: str | Path,
    progress: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    profile_steps: int = 0,
) -> TrainSummary:
    """Train `config` on dataset folder `data` into run folder `out` (see `Trainer`)."""
    trainer = Trainer(
        config, data, out, progress=progress, overwrite=overwrite, resume=resume, profile_steps=profile_steps
    )
    return trainer.fit()
