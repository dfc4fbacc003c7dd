"""Hyper-parameter studies with Optuna over any training config (`dynaforge tune`); see `study.py`."""

from dynaforge.tune.study import StudyFolder, StudyResult, run_study

__all__ = ["StudyFolder", "StudyResult", "run_study"]
