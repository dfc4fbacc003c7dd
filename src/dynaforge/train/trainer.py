"""The training loop. `Trainer.fit` is the loop, in order: schedule, forward, backward, clip, step, log,
validate, checkpoint, each a named method; everything else is set-up.

Windows come from the dataset folder's train and val splits, normalised with the train statistics. With
`train.rollout_steps` > 1 the model is unrolled autoregressively on its own predictions, and the loss
covers every predicted frame (gradients flow through the whole unroll).
"""

from __future__ import annotations

import logging
import math
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor
from torch.nn.utils import clip_grads_with_norm_, get_total_norm
from tqdm.auto import tqdm

import dynaforge
from dynaforge.config import Config, config_to_dict, resolve_device, save_config
from dynaforge.data import Normalizer, Window, WindowDataset, make_loader
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.runs import RunError, holds_run, run_folder
from dynaforge.store import DatasetFolder
from dynaforge.train.checkpoint import CHECKPOINT_VERSION, save_checkpoint
from dynaforge.train.log import MetricsLog, WindowMeter, environment
from dynaforge.train.losses import LOSSES
from dynaforge.train.optim import build_optimizer
from dynaforge.train.schedule import build_scheduler

log = logging.getLogger(__name__)


class TrainSummary(NamedTuple):
    run: Path
    epochs: int
    steps: int
    best_val_loss: float
    last_val_loss: float
    seconds: float


class Trainer:
    """Trains `config.model` on the windows of dataset folder `data`, writing run folder `out`."""

    def __init__(
        self,
        config: Config,
        data: str | Path,
        out: str | Path,
        progress: bool | None = None,
        overwrite: bool = False,
    ) -> None:
        self.config = config
        self.run = run_folder(out)
        if holds_run(self.run.root) and not overwrite:
            raise RunError(
                f"{self.run.root} already holds a run; choose another --out folder or delete this one"
            )
        self.data_root = Path(data).resolve()
        self.progress = progress
        self.device = torch.device(resolve_device(config.train.device))
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
        torch.manual_seed(config.train.seed)
        self.model = build_model(config.model, self.shape).to(self.device)
        self.train_loader = make_loader(
            self.train_set, config.data, self.device, shuffle=True, seed=config.train.seed
        )
        self.val_loader = make_loader(self.val_set, config.data, self.device, shuffle=False)
        self.total_steps = config.train.epochs * len(self.train_loader)
        self.optimizer = build_optimizer(self.model, config.train)
        self.scheduler = build_scheduler(self.optimizer, config.train, self.total_steps)
        self.loss_fn = LOSSES[config.train.loss]
        self.metrics = MetricsLog(self.run.metrics)
        self.meter = WindowMeter(self.device)
        self.step = 0
        self.best_val_loss = math.inf

    def windows(self, dataset: DatasetFolder, split: str) -> WindowDataset:
        data = self.config.data
        if dataset.split_size(split) == 0:
            raise RunError(
                f"the {split} split of {dataset.root} is empty; generate it with dataset.n_{split} > 0"
            )
        return WindowDataset(
            dataset.read_split(split).fields,
            self.normalizer,
            history=data.history,
            targets=data.horizon * self.config.train.rollout_steps,
            stride=data.stride,
        )

    # ---- the loop ---------------------------------------------------------------------------------

    def fit(self) -> TrainSummary:
        self.prepare_run_folder()
        started = time.perf_counter()
        val_loss = math.nan
        for epoch in range(self.config.train.epochs):
            epoch_started = time.perf_counter()
            epoch_loss = torch.zeros((), dtype=torch.float64, device=self.device)
            self.model.train()
            bar = self.progress_bar(epoch)
            for batch in bar:
                inputs, targets = self.batch_to_device(batch)
                lr = self.current_lr()
                loss = self.forward_loss(inputs, targets)
                self.backward(loss)
                grad_norm = self.clip_gradients()
                self.optimizer_step()
                self.meter.add(loss, grad_norm, samples=inputs.shape[0])
                epoch_loss = epoch_loss + loss.detach()
                if self.step % self.config.train.log_every == 0:
                    self.log_window(epoch, lr, bar)
            if self.meter.steps:
                self.log_window(epoch, lr, bar)
            bar.close()
            val_loss = self.validate()
            train_loss = epoch_loss.item() / max(len(self.train_loader), 1)
            self.log_epoch(epoch, train_loss, val_loss, time.perf_counter() - epoch_started)
            self.save_checkpoints(epoch + 1, val_loss)
        return TrainSummary(
            run=self.run.root,
            epochs=self.config.train.epochs,
            steps=self.step,
            best_val_loss=self.best_val_loss,
            last_val_loss=val_loss,
            seconds=time.perf_counter() - started,
        )

    # ---- the steps of the loop --------------------------------------------------------------------

    def batch_to_device(self, batch: Window) -> tuple[Tensor, Tensor]:
        non_blocking = self.device.type == "cuda"
        return (
            batch.inputs.to(self.device, non_blocking=non_blocking),
            batch.targets.to(self.device, non_blocking=non_blocking),
        )

    def current_lr(self) -> float:
        return self.optimizer.param_groups[0]["lr"]

    def forward_loss(self, inputs: Tensor, targets: Tensor) -> Tensor:
        """Loss of the model unrolled `rollout_steps` times from `inputs` against all `targets` frames."""
        predicted = autoregressive_rollout(
            self.model, ModelInput(frames=inputs), self.config.train.rollout_steps
        )
        return self.loss_fn(predicted, targets)

    def backward(self, loss: Tensor) -> None:
        loss.backward()

    def clip_gradients(self) -> Tensor:
        """The global gradient norm before clipping (clipped only when `train.grad_clip` is set)."""
        parameters = [p for p in self.model.parameters() if p.grad is not None]
        norm = get_total_norm([p.grad for p in parameters])
        if self.config.train.grad_clip is not None:
            # In place on purpose: gradients are scaled where the optimiser reads them.
            clip_grads_with_norm_(parameters, self.config.train.grad_clip, norm)
        return norm

    def optimizer_step(self) -> None:
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.scheduler.step()
        self.step += 1

    def validate(self) -> float:
        """Mean loss over the validation windows, unrolled as in training."""
        self.model.eval()
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        with torch.inference_mode():
            for batch in self.val_loader:
                inputs, targets = self.batch_to_device(batch)
                total = total + self.forward_loss(inputs, targets).to(torch.float64) * inputs.shape[0]
                count += inputs.shape[0]
        value = total.item() / max(count, 1)
        if not math.isfinite(value):
            raise FloatingPointError(
                f"validation loss is {value}: training diverged; lower train.lr or set train.grad_clip"
            )
        return value

    # ---- logging and checkpoints ------------------------------------------------------------------

    def prepare_run_folder(self) -> None:
        """Start a fresh run: remove what an earlier attempt left, save the config, begin the log."""
        for stale in (self.run.checkpoints, self.run.eval):
            shutil.rmtree(stale, ignore_errors=True)
        self.run.checkpoints.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run.config)
        self.metrics.start(
            {
                **environment(),
                "data": str(self.data_root),
                "device": str(self.device),
                "parameters": sum(p.numel() for p in self.model.parameters()),
                "train_windows": len(self.train_set),
                "val_windows": len(self.val_set),
                "steps_per_epoch": len(self.train_loader),
            }
        )
        log.info(
            "training %s (%d parameters) on %d windows for %d epochs, %s",
            self.config.model.name,
            sum(p.numel() for p in self.model.parameters()),
            len(self.train_set),
            self.config.train.epochs,
            self.device,
        )

    def progress_bar(self, epoch: int) -> tqdm:
        return tqdm(
            self.train_loader,
            desc=f"epoch {epoch + 1}/{self.config.train.epochs}",
            unit="batch",
            leave=False,
            disable=None if self.progress is None else not self.progress,
        )

    def log_window(self, epoch: int, lr: float, bar: tqdm) -> None:
        summary = self.meter.summary()
        if not math.isfinite(summary["loss"]):
            raise FloatingPointError(
                f"training loss is {summary['loss']} at step {self.step}: lower train.lr or set train.grad_clip"
            )
        self.metrics.write({"kind": "train", "epoch": epoch + 1, "step": self.step, "lr": lr, **summary})
        bar.set_postfix(loss=f"{summary['loss']:.3e}", lr=f"{lr:.2e}")
        self.meter.reset()

    def log_epoch(self, epoch: int, train_loss: float, val_loss: float, seconds: float) -> None:
        record = {
            "kind": "epoch",
            "epoch": epoch + 1,
            "step": self.step,
            "train_loss": train_loss,
            "val_loss": val_loss,
            "best": val_loss < self.best_val_loss,
            "epoch_time": seconds,
        }
        self.metrics.write(record)
        log.info(
            "epoch %d/%d  train %.3e  val %.3e  %.1f s%s",
            epoch + 1,
            self.config.train.epochs,
            train_loss,
            val_loss,
            seconds,
            "  (best)" if record["best"] else "",
        )

    def save_checkpoints(self, epochs_done: int, val_loss: float) -> None:
        """best.pt when the validation loss improved, then last.pt (so a complete last.pt implies best.pt)."""
        improved = val_loss < self.best_val_loss
        if improved:
            self.best_val_loss = val_loss
        state = self.checkpoint_state(epochs_done, val_loss)
        if improved:
            save_checkpoint(self.run.best, state)
        save_checkpoint(self.run.last, state)

    def checkpoint_state(self, epochs_done: int, val_loss: float) -> dict[str, Any]:
        return {
            "format_version": CHECKPOINT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "model": self.model.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "epoch": epochs_done,
            "step": self.step,
            "complete": epochs_done == self.config.train.epochs,
            "val_loss": val_loss,
            "best_val_loss": self.best_val_loss,
            "config": config_to_dict(self.config),
            "model_shape": self.shape._asdict(),
            "normalization": self.normalizer.to_dict(),
            "data": str(self.data_root),
        }


def train(
    config: Config,
    data: str | Path,
    out: str | Path,
    progress: bool | None = None,
    overwrite: bool = False,
) -> TrainSummary:
    """Train `config` on dataset folder `data` into run folder `out` (see `Trainer`)."""
    return Trainer(config, data, out, progress=progress, overwrite=overwrite).fit()
