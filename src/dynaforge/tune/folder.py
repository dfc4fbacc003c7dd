"""A study folder's layout (STUDY/study.db, config.yaml, data/, trials/NNNN/, best/, plots/), and Optuna's
warnings about its experimental features, which the study uses on purpose."""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

import optuna


class StudyFolder(NamedTuple):
    root: Path

    @property
    def database(self) -> Path:
        return self.root / "study.db"

    @property
    def config(self) -> Path:
        return self.root / "config.yaml"

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def best(self) -> Path:
        return self.root / "best"

    @property
    def plots(self) -> Path:
        return self.root / "plots"

    def trial(self, number: int) -> Path:
        return self.root / "trials" / f"{number:04d}"


@contextmanager
def optuna_warnings_quiet() -> Iterator[None]:
    """Optuna marks heartbeats, retries and the matplotlib plots as experimental; that is not news here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield
