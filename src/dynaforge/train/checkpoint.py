"""Random generator states as plain data, for exact resume (checkpoints load with weights_only=True).

What an engine checkpoint holds, and how it is written and read, is in `dynaforge.runs`.
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch import Tensor


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
