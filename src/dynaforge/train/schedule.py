"""Learning-rate schedules as multipliers of the peak rate, stepped once per optimiser step."""

from __future__ import annotations

import functools
import math

import torch

from dynaforge.config import TrainConfig


def warmup_cosine_factor(step: int, warmup_steps: int, total_steps: int, min_ratio: float) -> float:
    """Multiplier of the peak lr for optimiser step `step` (0-based).

    Linear warmup (step + 1) / warmup_steps over the first `warmup_steps` steps, reaching 1 at the last of
    them; then cosine decay from 1 towards `min_ratio`, which it reaches at `total_steps`.
    """
    if step < warmup_steps:
        return (step + 1) / warmup_steps
    progress = min((step - warmup_steps) / max(total_steps - warmup_steps, 1), 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def warmup_steps_for(config: TrainConfig, total_steps: int) -> int:
    return round(config.warmup_fraction * total_steps)


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LRScheduler:
    """Linear warmup then cosine decay over `total_steps` optimiser steps."""
    factor = functools.partial(
        warmup_cosine_factor,
        warmup_steps=warmup_steps_for(config, total_steps),
        total_steps=total_steps,
        min_ratio=config.min_lr_ratio,
    )
    return torch.optim.lr_scheduler.LambdaLR(optimizer, factor)
