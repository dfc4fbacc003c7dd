"""The training engine: one loop for every kind of training (docs/architecture.md, "The engine").

`Engine.fit` is the loop, in order: for each micro-batch the task's loss, backward (and, at the end of an
accumulation group) clip, optimiser step, EMA, schedule, count, log, checkpoint; at each epoch's end
validate, schedule, log, checkpoint. Everything else is set-up. What one step computes is the task's
(`dynaforge.train.task.Task`); the engine never asks which task it runs, and tuning attaches through
callbacks. A step whose loss or gradient norm is not finite is skipped on the device and counted; losses
and gradient norms are read back once per log interval and once per epoch, never in the step. A resumed
run ends with the weights of one that was never interrupted, bit for bit (at the same torch thread count).
With `train.time_budget` the number of epochs is planned before the first step from a few timed steps
(`plan_budget`) and counted again at the end of the first epoch and a quarter of the way in from measured
epochs (`settle_budget`); that count is kept in checkpoints: a run resumed after the last count is a run of
that many epochs like any other. The time budget's methods are in `budget.py` (`TimeBudget`), the
checkpoints' in `run_checkpoints.py` (`RunCheckpoints`): parts of `Engine`, split out by concern.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.utils import get_total_norm
from tqdm import tqdm  # not tqdm.auto: its asyncio variant calls iter(loader) on construction

from dynaforge.allocator import keep_freed_memory
from dynaforge.config import (
    Config,
    ConfigError,
    TrainConfig,
    config_to_dict,
    resolve_device,
)
from dynaforge.errors import RunError
from dynaforge.machine import indexed_device
from dynaforge.runs import run_folder
from dynaforge.train.budget import TimeBudget
from dynaforge.train.capture import StepGraph, compiled_or_eager, release_memory_if_short
from dynaforge.train.checkpoint import Trained
from dynaforge.train.clip import RelativeClip
from dynaforge.train.distributed import (
    barrier,
    join_cluster,
    leave_cluster,
    rank_device,
    sum_across_ranks,
    wrap_data_parallel,
)
from dynaforge.train.ema import EMA
from dynaforge.train.log import IntervalMeter, RunLog, TrainingDiverged, environment
from dynaforge.train.optim import build_optimizer, step_unless
from dynaforge.train.precision import Precision
from dynaforge.train.profile import StepProfiler
from dynaforge.train.run_checkpoints import RunCheckpoints
from dynaforge.train.schedule import build_scheduler
from dynaforge.train.setup import (
    StopRequest,
    check_determinism_environment,
    checkpoint_to_resume,
    cuda_graph_possible,
    determinism,
    resume_state,
    seed_everything,
    start_run_folder,
)
from dynaforge.train.task import EngineContext, EpochCallback, StepLoss, Task

log = logging.getLogger(__name__)


class TrainSummary(NamedTuple):
    run: Path
    epochs: int
    steps: int
    best_val_loss: float
    last_val_loss: float
    seconds: float
    skipped_steps: int = 0


class Engine(TimeBudget, RunCheckpoints):
    """Trains `task` with the `settings` of a run of `config` into run folder `out` (see the module docstring).

    `resume`: continue the run in `out` from its last checkpoint (a run of the same config), or start one
    there if it has no checkpoint yet. `overwrite`: replace whatever `out` holds. `profile_steps`: profile
    that many optimiser steps into `out/profile/`. `callbacks`: called after every epoch's checkpoints.
    `start`: the weights a fresh (not resumed) run starts from. `settings_key`: where `settings` sit in the
    config (for messages and the W&B section's name).
    """

    def __init__(
        self,
        config: Config,
        task: Task,
        out: str | Path,
        settings: TrainConfig | None = None,
        progress: bool | None = None,
        overwrite: bool = False,
        resume: bool = False,
        profile_steps: int = 0,
        callbacks: list[EpochCallback] | None = None,
        start: dict[str, Tensor] | None = None,
        settings_key: str = "train",
    ) -> None:
        self.config = config
        self.settings = settings or config.train
        self.settings_key = settings_key
        self.task = task
        self.callbacks = list(callbacks or [])
        self.run = run_folder(out)
        self.resume_from = checkpoint_to_resume(self.run, config, resume, overwrite)
        self.progress = progress
        self.profile_steps = profile_steps
        self.device = indexed_device(torch.device(resolve_device(rank_device(self.settings.device))))
        check_determinism_environment(self.settings, self.device, settings_key)
        self.cluster = join_cluster(self.device)
        if self.cluster.distributed and not task.data_parallel:
            raise ConfigError(
                f"{type(task).__name__} trains in one process; start it without torchrun (WORLD_SIZE=1)"
            )
        if self.device.type == "cuda":
            torch.cuda.set_device(self.device)
        self.precision = Precision(self.settings.precision, self.device)
        self.capturing = cuda_graph_possible(self.settings, self.device, task, self.cluster.distributed)
        task.setup(
            EngineContext(
                config,
                self.settings,
                self.device,
                self.cluster,
                self.precision,
                settings_key,
                progress,
                self.capturing,
            )
        )
        seed_everything(self.settings.seed)
        self.model = task.build_model().to(self.device)
        if start is not None and self.resume_from is None:
            self.model.load_state_dict(start)
        self.ema = (
            EMA(self.model, self.settings.ema.decay, self.settings.ema.warmup)
            if self.settings.ema.decay > 0
            else None
        )
        relative = self.settings.grad_clip_relative
        self.clip = RelativeClip(relative, self.device) if relative is not None else None
        self.epoch_count = task.epochs()
        if task.micro_batches(0) == 0:
            raise RunError(
                f"the training data make no batch of {config.data.batch_size} on each of "
                f"{self.cluster.world_size} process(es); lower data.batch_size"
            )
        self.optimizer = build_optimizer(self.model, self.settings, capturable=self.capturing)
        self.scheduler = build_scheduler(
            self.optimizer, self.settings, self.schedule_length(self.epoch_count)
        )
        self.step_model = (
            wrap_data_parallel(self.model, self.cluster, self.device) if task.data_parallel else self.model
        )
        self.graph = (
            StepGraph(self.captured_step, self.settings.cuda_graph.warmup, self.free_gradients)
            if self.capturing
            else None
        )
        self.records = RunLog(self.run.metrics, self.cluster.main)
        self.stop = StopRequest()
        self.meter = IntervalMeter(self.device)
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
        self.step_details: dict[str, Tensor] = {}
        self.val_details: dict[str, float] = {}
        self.step_samples = 0
        self.current_epoch = 0
        self.train_loss = math.nan
        self.compiled = False
        self.started = time.perf_counter()
        self.elapsed_before = 0.0  # seconds of training before this process (restored on resume)
        # A time budget's plan, counted again at the end of the first epoch and a quarter of the way in
        # (budget.py): when the first epoch began, what a checkpoint costs, when the first count was made and
        # whether the second is due (restored on resume, for a run resumed before a count).
        self.budget_epoch_began = 0.0
        self.budget_checkpoint_seconds = 0.0
        self.budget_first_counted = 0.0
        self.budget_recount_due = False
        if self.device.type == "cpu":
            # From here on a step's activations are reused, not page-faulted in again (allocator.py); set
            # after the task has read its data, whose freed reads the heap would otherwise keep.
            keep_freed_memory()

    # ---- the loop ---------------------------------------------------------------------------------

    def fit(self) -> TrainSummary:
        started = self.started = time.perf_counter()
        with self.run_settings():
            self.begin()
            epoch = self.epoch
            while epoch < self.epoch_count:  # not a range: a time budget may move the count either way
                epoch_started = time.perf_counter()
                for batch in self.epoch_batches(epoch):
                    if self.graph is not None:
                        self.graph.run(*batch)  # `captured_step`, replayed as a CUDA graph
                    elif not self.micro_step(batch):
                        continue  # accumulating: the optimiser steps at the group's last micro-batch
                    self.schedule_step()
                    self.count_step()
                    self.log_interval_if_due(epoch)
                    self.save_progress_if_due(epoch)
                self.log_interval(epoch)
                self.val_loss = self.validate()
                self.schedule_epoch(self.val_loss)
                self.log_epoch(epoch, time.perf_counter() - epoch_started)
                self.settle_budget(epoch)
                self.end_if_out_of_time(epoch)
                self.save_checkpoints(epochs_done=epoch + 1)
                if epoch + 1 >= self.epoch_count:
                    break  # the last epoch
                self.stop.stop_if_asked(self.run.last, self.step)
                epoch += 1
        return TrainSummary(
            run=self.run.root,
            epochs=self.epoch_count,
            steps=self.step,
            best_val_loss=self.best_val_loss,
            last_val_loss=self.val_loss,
            seconds=time.perf_counter() - started,
            skipped_steps=self.skipped_steps,
        )

    def micro_step(self, batch: tuple[Tensor, ...]) -> bool:
        """Loss and backward of one micro-batch; at the end of its accumulation group, clip, optimiser step
        and EMA. Returns whether the optimiser stepped."""
        self.backward(self.forward_loss(batch))
        if self.accumulating(self.current_epoch):
            return False
        grad_norm = self.clip_gradients()
        self.optimizer_step(grad_norm)
        self.update_ema()
        return True

    def captured_step(self, *batch: Tensor) -> None:
        """The step of `fit` for CUDA-graph capture (no accumulation; gradients stay allocated)."""
        self.backward(self.forward_loss(batch))
        grad_norm = self.clip_gradients()
        self.optimizer_step(grad_norm, free_gradients=False)
        self.update_ema()

    # ---- the steps of the loop --------------------------------------------------------------------

    def epoch_batches(self, epoch: int) -> Iterator[tuple[Tensor, ...]]:
        """This process's micro-batches of `epoch`, on the device, from where training stands."""
        self.model.train()
        self.current_epoch = epoch
        batches = self.task.epoch_batches(epoch, self.batches_done)
        self.bar = tqdm(
            batches,
            desc=f"epoch {epoch + 1}/{self.epoch_count}",
            unit="batch",
            initial=self.batches_done,
            total=self.task.micro_batches(epoch),
            leave=False,
            disable=not self.cluster.main or (None if self.progress is None else not self.progress),
        )
        self.meter.restart_clock()
        for batch in self.bar:
            self.batches_done += 1
            self.step_samples += batch[0].shape[0]
            yield batch
        self.bar.close()

    def accumulating(self, epoch: int) -> bool:
        """True while the current micro-batch is not the last of its accumulation group."""
        return (
            self.batches_done % self.settings.accumulate != 0
            and self.batches_done != self.task.micro_batches(epoch)
        )

    def group_size(self) -> int:
        """Micro-batches in the current accumulation group (the last group of an epoch may be short)."""
        accumulate = self.settings.accumulate
        start = (self.batches_done - 1) // accumulate * accumulate
        return min(accumulate, self.task.micro_batches(self.current_epoch) - start)

    def forward_loss(self, batch: tuple[Tensor, ...]) -> StepLoss:
        """The task's loss of the batch, under the run's autocast (and DDP's no-sync while accumulating)."""
        with self.precision.autocast(cache=self.graph is None), self.gradient_sync():
            return self.task.loss(self.step_model, batch)

    def gradient_sync(self) -> contextlib.AbstractContextManager[Any]:
        """DDP all-reduces gradients only on the last micro-batch of an accumulation group."""
        ddp = self.model is not self.step_model and hasattr(self.step_model, "no_sync")
        if ddp and torch.is_grad_enabled() and self.accumulating(self.current_epoch):
            return self.step_model.no_sync()
        return contextlib.nullcontext()

    def backward(self, loss: StepLoss) -> None:
        group = self.group_size()
        self.precision.scaler.scale(loss.objective / group).backward()
        value = loss.value.detach() / group
        first = (self.batches_done - 1) % self.settings.accumulate == 0
        self.step_loss = value if first else self.step_loss + value
        for name, detail in (loss.details or {}).items():
            share = detail.detach() / group
            self.step_details[name] = share if first else self.step_details[name] + share

    def clip_gradients(self) -> Tensor:
        """The global gradient norm before clipping (clipped when `train.grad_clip` or
        `train.grad_clip_relative` is set: to the lower of the two limits)."""
        if self.precision.scaling:
            self.precision.scaler.unscale_(self.optimizer)
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        norm = get_total_norm([p.grad for p in parameters])
        limit: float | Tensor | None = self.settings.grad_clip
        if self.clip is not None:
            relative = self.clip.limit()
            limit = relative if limit is None else torch.clamp(relative, max=limit)
            self.clip.observe(norm, limit)
        if limit is not None:
            # In place on purpose: gradients are scaled where the optimiser reads them. torch's
            # clip_grads_with_norm_ computes the same factor but reads a tensor limit back to the host.
            torch._foreach_mul_([p.grad for p in parameters], torch.clamp(limit / (norm + 1e-6), max=1.0))
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
        self.meter.add(self.step_loss, grad_norm, bad, self.step_details)
        if free_gradients:
            self.free_gradients()

    def free_gradients(self) -> None:
        self.optimizer.zero_grad(set_to_none=True)

    def update_ema(self) -> None:
        if self.ema is not None:
            self.ema.update(self.model)

    def schedule_step(self) -> None:
        if self.settings.schedule.interval == "step":
            self.scheduler.step()

    def count_step(self) -> None:
        """Host-side counters of an optimiser step (kept outside the step, which may be a replayed graph)."""
        self.step += 1
        self.meter.count(self.step_samples)
        self.step_samples = 0
        if self.profiler is not None:
            self.profiler.step()

    def validate(self) -> float:
        """The task's validation metric (with the EMA weights if asked), checked to be finite."""
        model = self.ema.module if self.ema is not None and self.settings.ema.evaluate else self.model
        model.eval()
        with torch.inference_mode(), self.precision.autocast():
            value = self.task.validate(model)
        self.val_details = self.task.validation_details()
        if not math.isfinite(value):
            key = self.settings_key
            raise TrainingDiverged(
                f"validation loss is {value} after step {self.step}: training diverged; lower {key}.lr, set "
                f"{key}.grad_clip or use {key}.precision=fp32"
            )
        return value

    def schedule_epoch(self, val_loss: float) -> None:
        """Per-epoch bookkeeping: plateau detection, per-epoch schedules, CUDA memory when short."""
        self.scheduler.observe(val_loss)
        if self.settings.schedule.interval == "epoch":
            self.scheduler.step()
        release_memory_if_short(self.device)

    # ---- set-up and tear-down ---------------------------------------------------------------------

    @contextlib.contextmanager
    def run_settings(self) -> Iterator[None]:
        """Determinism flags and Ctrl-C handling (`StopRequest`) for the run; profiler, W&B, process group
        closed at the end."""
        try:
            with (
                determinism(self.settings.deterministic, self.device),
                self.stop.listening(not self.cluster.distributed),
            ):
                yield
        finally:
            if self.profiler is not None:
                self.profiler.stop()
            self.records.finish()
            leave_cluster(self.cluster)

    def begin(self) -> None:
        """Start a fresh run or restore the last checkpoint; compile; open the loggers and the profiler."""
        if self.resume_from is not None:
            self.resume_from, state = resume_state(self.run, self.resume_from, self.device)
            self.restore(state)
            self.report_finished_epochs()
        elif self.cluster.main:
            self.prepare_run_folder()
        barrier(self.cluster)
        if self.epoch == self.epoch_count:
            return  # a finished run: nothing to compile, log or profile
        if self.settings.compile.enabled:
            self.compile_with_fallback()
        if self.settings.time_budget is not None and self.resume_from is None:
            self.plan_budget(self.settings.time_budget)
        wandb_key = f"{self.settings_key}.wandb"
        self.records.open_wandb(self.settings.wandb, self.run.root, config_to_dict(self.config), wandb_key)
        if self.cluster.main and self.profile_steps > 0:
            self.profiler = StepProfiler(self.profile_steps, self.run.root / "profile", self.device)
        log.info(
            "training %s (%d parameters) for %d epochs on %s%s, %d process(es)",
            self.task.describe(),
            sum(p.numel() for p in self.model.parameters()),
            self.epoch_count,
            self.device,
            f" from step {self.step}" if self.step else "",
            self.cluster.world_size,
        )

    def compile_with_fallback(self) -> None:
        """The task's compiled step (`Task.compiled`), or the eager one when compilation fails."""
        compiled = compiled_or_eager(lambda: self.task.compiled(self.step_model), self.model, self.settings)
        if compiled is not None:
            self.step_model, self.compiled = compiled, True

    def schedule_length(self, epochs: int) -> int:
        """The schedule's intervals in a run of `epochs` epochs: its optimiser steps, or the epochs."""
        if self.settings.schedule.interval == "epoch":
            return epochs
        return sum(math.ceil(self.task.micro_batches(e) / self.settings.accumulate) for e in range(epochs))

    def prepare_run_folder(self) -> None:
        """Start a fresh run: an empty run folder with the config, the log begun with its header."""
        start_run_folder(self.run, self.config)
        self.records.start(
            {
                **environment(),
                **self.task.header(),
                "device": str(self.device),
                "world_size": self.cluster.world_size,
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "micro_batches_per_epoch": self.task.micro_batches(0),
                "steps_per_epoch": math.ceil(self.task.micro_batches(0) / self.settings.accumulate),
                "cuda_graph": self.capturing,
            }
        )

    # ---- logging and checkpoints ------------------------------------------------------------------

    def log_interval_if_due(self, epoch: int) -> None:
        if self.step % self.settings.log_every == 0:
            self.log_interval(epoch)

    def log_interval(self, epoch: int) -> None:
        """Read the interval's device meters (one host sync), write a metrics line, stop on a bad streak."""
        if self.meter.steps == 0:
            return
        summary = self.meter.read(
            (lambda t: sum_across_ranks(t, self.cluster)) if self.cluster.distributed else None,
            self.cluster.world_size,
        )
        self.meter.reset()
        self.skipped_steps += summary["skipped"]
        lr = float(self.optimizer.param_groups[0]["lr"])
        # A task that measures its data source (windows/s, time waited) adds it to the record and the bar.
        data = self.task.data_measures()
        if self.bar is not None:
            rates = (
                {"win/s": f"{data['windows_per_s']:.0f}", "wait": f"{data['data_wait_share']:.0%}"}
                if data
                else {}
            )
            self.bar.set_postfix(loss=f"{summary['loss']:.3e}", lr=f"{lr:.2e}", **rates)
        record = {"kind": "train", "epoch": epoch + 1, "step": self.step, "lr": lr, **summary, **data}
        record["elapsed"] = self.elapsed()
        self.records.interval(record, self.settings_key, self.settings.max_bad_steps)

    def log_epoch(self, epoch: int, seconds: float) -> None:
        loss_sum, good_steps = sum_across_ranks(self.meter.epoch, self.cluster).tolist()
        self.train_loss = loss_sum / good_steps if good_steps else math.nan  # the mean of the ranks' means
        record = {
            "kind": "epoch",
            "epoch": epoch + 1,
            "step": self.step,
            "train_loss": self.train_loss,
            "val_loss": self.val_loss,
            **self.val_details,
            "best": self.val_loss < self.best_val_loss,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped_steps": self.skipped_steps,
            "epoch_time": seconds,
            "elapsed": self.elapsed(),
        }
        self.records.write(record)
        log.info(
            "epoch %d/%d  train %.3e  val %.3e  %.1f s%s",
            epoch + 1,
            self.epoch_count,
            self.train_loss,
            self.val_loss,
            seconds,
            "  (best)" if record["best"] else "",
        )

    def trained(self) -> Trained:
        evaluate_ema = self.ema is not None and self.settings.ema.evaluate
        return Trained(
            self.model, self.optimizer, self.scheduler, self.precision, self.ema, evaluate_ema, self.clip
        )
