"""Optimisers. The first cut: AdamW, without weight decay on biases and other 1D parameters."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from dynaforge.config import TrainConfig


def parameter_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Matrices and kernels (2 or more dims) decay; biases, norm scales and other vectors do not."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW(parameter_groups(model, config.weight_decay), lr=config.lr)
