"""Learning-rate schedules: linear warmup, then constant, step, cosine or reduce-on-plateau.

The lr of every parameter group is its peak lr times a factor of the interval count t (optimiser steps or
epochs, `train.schedule.interval`). `Schedule` is a `torch.optim.lr_scheduler.LRScheduler`, so its
`state_dict` holds only plain numbers (it loads with `weights_only=True`) and it drives any optimiser,
the Muon + AdamW hybrid included.
"""

from __future__ import annotations

import math

import torch

from dynaforge.config import ScheduleConfig, TrainConfig


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for interval `step` (0-based).

    Linear warmup (step + 1) / warmup_steps over the first `warmup_steps` intervals, reaching 1 at the last of
    them; then cosine decay from 1 towards `min_ratio`, which it reaches at `total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def schedule_factor(t: int, config: ScheduleConfig, total: int, plateau_scale: float = 1.0) -> float:
    """Multiplier of the peak lr at interval `t` of `total` (see `ScheduleConfig`)."""
    warmup = warmup_intervals(config, total)
    if config.name == "cosine":
        return warmup_cosine_factor(t, warmup, total, config.min_lr_ratio)
    ramp = (t + 1) / warmup if t < warmup else 1.0
    if config.name == "constant":
        return ramp
    if config.name == "step":
        return ramp * config.gamma ** (max(t - warmup, 0) // config.step_size)
    return ramp * plateau_scale


def warmup_intervals(config: ScheduleConfig, total: int) -> int:
    return round(config.warmup_fraction * total)


def schedule_intervals(config: ScheduleConfig, epochs: int, steps_per_epoch: int) -> int:
    """How many times the schedule is stepped in a whole run."""
    return epochs * steps_per_epoch if config.interval == "step" else epochs


def epochs_in_budget(
    seconds_left: float, micro_batches: int, micro_batch_seconds: float, validation_seconds: float
) -> int:
    """Whole epochs of `micro_batches` steps and one validation each that fit in `seconds_left` (at least 1).

    `train.time_budget` becomes this count before the first step (`Engine.plan_budget`); it is counted again
    (`epochs_to_run`) at the end of the first epoch and once more a quarter of the way through the budget
    (`Engine.settle_budget`). After that the run is a run of that many epochs: the schedule spans them, and a
    resumed run reads the count back from its checkpoint instead of timing again, which keeps resumption
    exact.
    """
    epoch_seconds = micro_batches * micro_batch_seconds + validation_seconds
    if epoch_seconds <= 0 or not math.isfinite(epoch_seconds):
        return 1
    return max(1, math.floor(seconds_left / epoch_seconds))


def epochs_to_run(epochs_done: int, seconds_left: float, epoch_seconds: float) -> int:
    """A budget run's epochs counted again at the end of epoch `epochs_done`: those done, and the whole epochs
    of the measured `epoch_seconds` (validation and checkpoints included) that fit in `seconds_left`."""
    if epoch_seconds <= 0 or not math.isfinite(epoch_seconds) or not math.isfinite(seconds_left):
        return epochs_done
    return epochs_done + max(0, math.floor(seconds_left / epoch_seconds))


class Schedule(torch.optim.lr_scheduler.LRScheduler):
    """Warmup then `config.name`, over `total` intervals; `step()` once per interval.

    For `plateau`, `observe(val_loss)` after each validation may lower the lr (at once, for every group).
    """

    def __init__(self, optimizer: torch.optim.Optimizer, config: ScheduleConfig, total: int) -> None:
        # Plain attributes only: LRScheduler.state_dict() saves the whole __dict__.
        self.name, self.total = config.name, total
        self.warmup, self.min_lr_ratio = config.warmup_fraction, config.min_lr_ratio
        self.step_size, self.gamma = config.step_size, config.gamma
        self.patience, self.factor, self.threshold = config.patience, config.factor, config.threshold
        self.plateau_scale = 1.0
        self.best_loss = math.inf
        self.bad_epochs = 0
        # Peak lrs as host floats: a capturable optimiser's lr is a device tensor, and reading it back
        # every step would be a host sync (set once here, then only written, by fill_).
        self.peak_lrs = [float(group["lr"]) for group in optimizer.param_groups]
        super().__init__(optimizer)

    def config(self) -> ScheduleConfig:
        return ScheduleConfig(
            name=self.name,
            warmup_fraction=self.warmup,
            min_lr_ratio=self.min_lr_ratio,
            step_size=self.step_size,
            gamma=self.gamma,
            patience=self.patience,
            factor=self.factor,
            threshold=self.threshold,
        )

    def factor_at(self, t: int) -> float:
        return schedule_factor(t, self.config(), self.total, self.plateau_scale)

    def get_lr(self) -> list[float]:
        factor = self.factor_at(self.last_epoch)
        return [peak * factor for peak in self.peak_lrs]

    def observe(self, val_loss: float) -> None:
        """Feed a validation loss; `plateau` lowers the lr after `patience` epochs without improvement."""
        if self.name != "plateau" or not math.isfinite(val_loss):
            return
        if val_loss < self.best_loss * (1.0 - self.threshold):
            self.best_loss, self.bad_epochs = val_loss, 0
            return
        self.bad_epochs += 1
        if self.bad_epochs > self.patience:
            self.plateau_scale = max(self.plateau_scale * self.factor, self.min_lr_ratio)
            self.bad_epochs = 0
            self.apply_current_lr()

    def respan(self, total: int) -> None:
        """Lay the schedule over `total` intervals instead (before the first step: a time budget's plan)."""
        self.total = total
        self.apply_current_lr()

    def apply_current_lr(self) -> None:
        factor = self.factor_at(self.last_epoch)
        for group, peak in zip(self.optimizer.param_groups, self.peak_lrs):
            if isinstance(group["lr"], torch.Tensor):
                group["lr"].fill_(peak * factor)  # a capturable optimiser's lr lives on the device
            else:
                group["lr"] = peak * factor
        self._last_lr = [group["lr"] for group in self.optimizer.param_groups]


def build_scheduler(optimizer: torch.optim.Optimizer, config: TrainConfig, total: int) -> Schedule:
    """The schedule of `config.schedule` over `total` intervals (see `schedule_intervals`)."""
    return Schedule(optimizer, config.schedule, total)
