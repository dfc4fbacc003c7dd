"""An exponential moving average (EMA) of a model's weights, kept in a separate copy of the model.

After each optimiser step: average <- decay * average + (1 - decay) * weights, for every floating
parameter; buffers (e.g. norm statistics) are copied. With `warmup` the decay at update n is
min(decay, (1 + n) / (10 + n)), so that the first averages are not dominated by the initial weights.

The update is a few foreach kernels with the decay computed on the device: no host sync, and it can be
captured in a CUDA graph.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import Tensor, nn

from dynaforge.errors import ConfigError


class EMA:
    """`module` holds the averaged weights (in eval mode, no gradients); `update(model)` after each step."""

    def __init__(self, model: nn.Module, decay: float, warmup: bool = True) -> None:
        if not 0.0 < decay < 1.0:
            raise ConfigError(f"the EMA decay (train.ema.decay) must be in (0, 1), got {decay}")
        self.module = copy.deepcopy(model).eval().requires_grad_(False)
        self.decay, self.warmup = decay, warmup
        device = next(model.parameters()).device
        self.updates = torch.zeros((), dtype=torch.float32, device=device)

    def targets_and_sources(self, model: nn.Module) -> tuple[list[Tensor], list[Tensor]]:
        pairs = [
            (mine, theirs.detach())
            for mine, theirs in zip(self.module.parameters(), model.parameters())
            if mine.is_floating_point()
        ]
        return [a for a, _ in pairs], [b for _, b in pairs]

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Average `model`'s current weights into `module` (same architecture as at construction)."""
        targets, sources = self.targets_and_sources(model)
        # In place on purpose: the average is a persistent accumulator, updated every step.
        if self.warmup:
            decay = torch.clamp((1.0 + self.updates) / (10.0 + self.updates), max=self.decay)
            torch._foreach_mul_(targets, decay)
            torch._foreach_add_(targets, torch._foreach_mul(sources, 1.0 - decay))
        else:
            torch._foreach_lerp_(targets, sources, 1.0 - self.decay)
        for mine, theirs in zip(self.module.buffers(), model.buffers()):
            mine.copy_(theirs)
        self.updates.add_(1.0)

    def state_dict(self) -> dict[str, Any]:
        return {"module": self.module.state_dict(), "updates": self.updates.detach().clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.module.load_state_dict(state["module"])
        self.updates.copy_(state["updates"])
