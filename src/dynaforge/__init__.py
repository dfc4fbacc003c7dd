"""dynaforge: learned simulation of dynamical systems (generate, store, train, evaluate, tune, export).

`import dynaforge` stays light (no torch): the notebook API of `dynaforge.api` (`simulate`, `open_dataset`,
`load_run`, ...) is reached through this package on first use.
"""

from __future__ import annotations

import importlib
from importlib.metadata import PackageNotFoundError, version
from typing import Any

try:
    __version__ = version("dynaforge")
except PackageNotFoundError:  # running from a source tree that is not installed
    __version__ = "0.0.0+unknown"

API = ("Dataset", "Run", "Sample", "Samples", "load_run", "open_dataset", "simulate")
"""Names of `dynaforge.api` re-exported here. Its `generate` and `train` are not: `dynaforge.generate` and
`dynaforge.train` are the stages' packages (call `dynaforge.api.generate`, `dynaforge.api.train`)."""


def __getattr__(name: str) -> Any:
    # The API imports torch and every stage; it is loaded by name on first use so that `import dynaforge`
    # (the torch-free `rollout` verb imports it) stays light. By name, not by an import statement: the one
    # reference of this bottom layer to the top (docs/architecture.md, "Layers").
    if name == "api":
        return importlib.import_module("dynaforge.api")
    if name in API:
        return getattr(importlib.import_module("dynaforge.api"), name)
    raise AttributeError(f"module 'dynaforge' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), "api", *API])


__all__ = ["__version__", "api", *API]
