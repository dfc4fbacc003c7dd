"""Hyper-parameter studies with Optuna over any training config (`dynaforge tune`); see `study.py`."""

from dynaforge.tune.folder import StudyFolder
from dynaforge.tune.study import StudyResult, run_study

__all__ = ["StudyFolder", "StudyResult", "run_study"]
