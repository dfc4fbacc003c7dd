"""What an engine checkpoint saves of a run's state, as plain data for exact resume (checkpoints load with
weights_only=True): the random generators' states and the objects training updates (`Trained`).

The whole list of an engine checkpoint's entries, and how the file is written and read, is in
`dynaforge.runs`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor, nn

from dynaforge.train.clip import RelativeClip
from dynaforge.train.ema import EMA
from dynaforge.train.precision import Precision
from dynaforge.train.schedule import Schedule


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


class Trained(NamedTuple):
    """The objects training updates, as a checkpoint saves and restores them."""

    model: nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: Schedule
    precision: Precision
    ema: EMA | None
    evaluate_ema: bool
    """The EMA's weights are the ones to evaluate (`model` in the checkpoint; the trained ones in
    `train_model`)."""
    clip: RelativeClip | None = None
    """`train.grad_clip_relative`'s running mean of gradient norms."""


def trained_state(trained: Trained) -> dict[str, Any]:
    """The checkpoint entries of `trained`: model (and train_model), optimizer, scheduler, scaler, ema,
    relative clipping."""
    weights = trained.model.state_dict()
    state: dict[str, Any] = {
        "model": weights,
        "optimizer": trained.optimizer.state_dict(),
        "scheduler": trained.scheduler.state_dict(),
        "scaler": trained.precision.scaler.state_dict() if trained.precision.scaling else {},
    }
    if trained.ema is not None:
        state["ema"] = trained.ema.state_dict()
        if trained.evaluate_ema:
            state["model"], state["train_model"] = trained.ema.module.state_dict(), weights
    if trained.clip is not None:
        state["grad_clip_relative"] = trained.clip.state_dict()
    return state


def load_trained_state(trained: Trained, state: Mapping[str, Any]) -> None:
    """Set `trained` from the entries `trained_state` wrote."""
    trained.model.load_state_dict(state.get("train_model", state["model"]))
    trained.optimizer.load_state_dict(state["optimizer"])
    trained.scheduler.load_state_dict(state["scheduler"])
    if state.get("scaler"):
        trained.precision.scaler.load_state_dict(state["scaler"])
    if trained.ema is not None:
        trained.ema.load_state_dict(state["ema"])
    if trained.clip is not None and "grad_clip_relative" in state:
        trained.clip.load_state_dict(state["grad_clip_relative"])
