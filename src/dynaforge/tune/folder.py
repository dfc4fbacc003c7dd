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
    """The paths of a study folder (see the module docstring); `study_folder(root)` makes one."""

    root: Path
    database: Path
    config: Path
    data: Path
    best: Path
    plots: Path

    def trial(self, number: int) -> Path:
        return self.root / "trials" / f"{number:04d}"


STUDY_ENTRIES = ("study.db*", "config.yaml", "data", "trials", "best", "plots", "summary.json", "summary.md")
"""What a study writes at the top of its folder (study.db*: SQLite's database and its journals)."""


def study_folder(path: str | Path) -> StudyFolder:
    root = Path(path)
    return StudyFolder(
        root, root / "study.db", root / "config.yaml", root / "data", root / "best", root / "plots"
    )


@contextmanager
def optuna_warnings_quiet() -> Iterator[None]:
    """Optuna marks heartbeats, retries and the matplotlib plots as experimental; that is not news here."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        yield
