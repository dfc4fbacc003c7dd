"""The run folder layout, shared by training, evaluation and the `run` pipeline.

RUN/config.yaml            the resolved config the run was trained with
RUN/metrics.jsonl          one JSON line per logging window and per epoch
RUN/checkpoints/last.pt    after every epoch
RUN/checkpoints/best.pt    the epoch with the lowest validation loss
RUN/eval/metrics.json      after `dynaforge evaluate`, with plots and report.html
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

from dynaforge.config import ConfigError, config_differences, config_from_dict, config_to_dict

EVALUATION_ONLY = ("evaluate", "tune")
"""Config sections that change only how a run is evaluated or searched over, not the run itself."""


class RunFolder(NamedTuple):
    root: Path

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def last(self) -> Path:
        return self.checkpoints / "last.pt"

    @property
    def best(self) -> Path:
        return self.checkpoints / "best.pt"

    @property
    def eval(self) -> Path:
        return self.root / "eval"

    def checkpoint(self, which: str) -> Path:
        """`best` or `last`."""
        return {"best": self.best, "last": self.last}[which]


def run_folder(path: str | Path) -> RunFolder:
    return RunFolder(Path(path))


class RunError(RuntimeError):
    """A run folder that cannot be used as asked; the message says why and what to do."""


def holds_run(path: str | Path) -> bool:
    """True when `path` already holds (part of) a training run."""
    run = run_folder(path)
    return run.config.exists() or run.metrics.exists() or run.checkpoints.exists()


def training_differences(saved: Mapping[str, Any], wanted: Mapping[str, Any]) -> list[str]:
    """The dotted keys where two plain config dicts train differently (evaluation-only sections ignored).

    `saved` is completed with today's defaults first, so a run saved before a config section existed still
    matches a config that leaves that section at its defaults.
    """
    return config_differences(
        {k: v for k, v in with_defaults(saved).items() if k not in EVALUATION_ONLY},
        {k: v for k, v in wanted.items() if k not in EVALUATION_ONLY},
    )


def with_defaults(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved plain config with sections and keys added since it was written filled by their defaults;
    unchanged when it no longer validates (its differences are then reported key by key)."""
    try:
        return config_to_dict(config_from_dict(saved))
    except ConfigError:
        return dict(saved)
