"""The dataset format: spec and errors (format.py), the one layout conversion (layout.py), writer (sharded,
atomic, resumable), reader, validator, and the readers of PDEBench and The Well files (interop).

`dynaforge.store.format` imports no PyTorch (the torch-free ONNX rollout reads shards with it), so the
reader and the validator, which hand out tensors, are loaded here on first use."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from dynaforge.store.format import DatasetError, SplitArrays

if TYPE_CHECKING:  # what type checkers see; at run time `__getattr__` loads them
    from dynaforge.store.reader import DatasetFolder as DatasetFolder
    from dynaforge.store.reader import TrajectoryReader as TrajectoryReader
    from dynaforge.store.validate import validate_dataset as validate_dataset

LAZY = {
    "DatasetFolder": "dynaforge.store.reader",
    "TrajectoryReader": "dynaforge.store.reader",
    "validate_dataset": "dynaforge.store.validate",
}
"""Names re-exported here from modules that import PyTorch, loaded by name on first use."""


def __getattr__(name: str) -> Any:
    if name in LAZY:
        return getattr(importlib.import_module(LAZY[name]), name)
    raise AttributeError(f"module 'dynaforge.store' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *LAZY])


# The lazy names stay out of `__all__`: they are documented in their own modules (`reader`, `validate`), and
# the API reference (pdoc) resolves `__all__` by importing, which a module `__getattr__` does not serve.
__all__ = ["DatasetError", "SplitArrays"]
