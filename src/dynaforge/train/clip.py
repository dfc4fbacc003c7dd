"""Gradient clipping relative to the recent gradient norms (`train.grad_clip_relative`).

An absolute limit (`train.grad_clip`) means something different for every loss: the relative L2 loss of
an operator task has gradient norms of 100 to 200 and one of 1 clips every step (and held that task back:
docs/literature.md), while an MSE on normalised fields may never reach it. A relative limit is `factor`
times a running mean of the recent steps' norms (clipped, so a spike does not raise it): the usual step
passes unchanged, a spike is cut to `factor` times the usual, whatever the loss's scale.

The mean and its count live on the device and are updated with tensor operations only: no host sync per
step, and the update can be captured in a CUDA graph. They are saved in checkpoints (exact resume).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from dynaforge.errors import ConfigError

DECAY = 0.99
"""Weight of the old mean per step: about the last hundred steps count."""
WARMUP_STEPS = 10
"""Steps whose norms are averaged before the limit applies (they are not clipped by it)."""


class RelativeClip:
    """`limit()` before clipping a step, `observe(norm, limit)` after (see the module docstring)."""

    def __init__(self, factor: float, device: torch.device) -> None:
        if not factor >= 1.0:
            raise ConfigError(
                f"the relative clipping factor (train.grad_clip_relative) must be >= 1, got {factor}"
            )
        self.factor = factor
        self.mean = torch.zeros((), dtype=torch.float32, device=device)
        self.count = torch.zeros((), dtype=torch.float32, device=device)

    def limit(self) -> Tensor:
        """`factor` times the bias-corrected mean of the steps seen so far; infinite for the first few."""
        seen = self.count.clamp(min=1.0)
        mean = self.mean / (1.0 - DECAY**seen)
        return torch.where(self.count >= WARMUP_STEPS, self.factor * mean, torch.full_like(mean, torch.inf))

    def observe(self, norm: Tensor, limit: Tensor) -> None:
        """Fold in a step's gradient norm, as clipped to `limit`; a non-finite norm is left out."""
        finite = torch.isfinite(norm)
        clipped = torch.where(finite, torch.minimum(norm.float(), limit), self.mean)
        self.mean.copy_(torch.where(finite, DECAY * self.mean + (1.0 - DECAY) * clipped, self.mean))
        self.count.add_(finite.float())

    def state_dict(self) -> dict[str, Any]:
        return {"mean": self.mean.clone(), "count": self.count.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.mean.copy_(state["mean"])
        self.count.copy_(state["count"])
