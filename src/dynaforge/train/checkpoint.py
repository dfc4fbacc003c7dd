"""Checkpoints: plain data only (tensors, numbers, strings, lists, dicts), so they load with
`torch.load(..., weights_only=True)`, written atomically (a killed writer never leaves a partial file).

A checkpoint holds:
    format_version, dynaforge_version
    model                            the weights to evaluate: the EMA's when train.ema.evaluate, else the
                                     trained ones
    train_model                      the trained weights, when `model` holds the EMA's
    optimizer, scheduler, scaler     state dicts (scaler: fp16 only, else empty)
    ema                              the EMA's state (module, updates), when train.ema is on
    rng                              random generator states (python, numpy, torch, cuda), one per rank
    epoch                            epochs completed
    step                             optimiser steps completed
    position                         where training stands: epoch (0-based) and micro-batches done in it
    epoch_loss                       the current epoch's training loss so far: [sum, good steps]
    skipped_steps                    steps skipped for a non-finite loss or gradient, in total
    complete                         True when training has run all its epochs
    val_loss, best_val_loss          the last validation loss and the best so far
    config                           the full run config as a dict
    model_shape                      channels, history, horizon, spatial_dims
    normalization                    the per-channel mean and std the model was trained with
    data                             the dataset folder trained on
    world_size                       processes that trained it

State dicts never carry the `_orig_mod.` (torch.compile) or `module.` (DDP) prefixes; `load_checkpoint`
also strips them from files written by other tools.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from dynaforge.atomic import atomic_path

CHECKPOINT_VERSION = 1
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
"""Key prefixes added by torch.compile's OptimizedModule and by DistributedDataParallel."""
MODEL_KEYS = ("model", "train_model")


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
    for key in MODEL_KEYS:
        if key in state:
            state[key] = strip_wrapper_prefixes(state[key])
    if isinstance(state.get("ema"), Mapping) and "module" in state["ema"]:
        state["ema"]["module"] = strip_wrapper_prefixes(state["ema"]["module"])
    return state


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Keys without leading `_orig_mod.` / `module.` prefixes (in any order and number)."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned


# ---- random generator states as plain data ----------------------------------------------------------


def rng_state() -> dict[str, Any]:
    """This process's python, numpy, torch and CUDA generator states, as weights_only-loadable data."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "state": list(internal), "gauss": gauss},
        "numpy": {
            "kind": kind,
            "keys": torch.from_numpy(keys.astype(np.int64)),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached": float(cached),
        },
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: Mapping[str, Any]) -> None:
    """Set every generator from `rng_state()`'s output."""
    python = state["python"]
    random.setstate((python["version"], tuple(python["state"]), python["gauss"]))
    numpy = state["numpy"]
    keys: Tensor = numpy["keys"]
    np.random.set_state(
        (
            numpy["kind"],
            keys.cpu().numpy().astype(np.uint32),
            numpy["pos"],
            numpy["has_gauss"],
            numpy["cached"],
        )
    )
    torch.set_rng_state(state["torch"].cpu())
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([s.cpu() for s in state["cuda"]])
