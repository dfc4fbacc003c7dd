"""Checkpoints: plain data only (tensors, numbers, strings, lists, dicts), so they load with
`torch.load(..., weights_only=True)`, written atomically (a killed writer never leaves a partial file).

A checkpoint holds:
    format_version, dynaforge_version
    model, optimizer, scheduler      state dicts
    epoch                            epochs completed
    step                             optimiser steps completed
    complete                         True when training has run all its epochs
    val_loss, best_val_loss          this epoch's and the best so far
    config                           the full run config as a dict
    model_shape                      channels, history, horizon, spatial_dims
    normalization                    the per-channel mean and std the model was trained with
    data                             the dataset folder trained on
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from dynaforge.atomic import atomic_path

CHECKPOINT_VERSION = 1


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint's plain data, loaded safely (weights_only: no arbitrary code runs)."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(
            f"checkpoint {path} does not exist; train first with `dynaforge train CONFIG --data DIR --out RUN`"
        )
    state = torch.load(path, map_location=map_location, weights_only=True)
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != CHECKPOINT_VERSION:
        raise ValueError(
            f"{path} is not a dynaforge checkpoint of version {CHECKPOINT_VERSION} (got {version})"
        )
    return state
