"""Evaluation: rollouts on the test split, metrics, plots and the HTML report."""

from dynaforge.evaluate.evaluator import EvaluationResult, evaluate, evaluation_is_current
from dynaforge.evaluate.metrics import nrmse, nrmse_per_frame, relative_l2_per_frame

__all__ = [
    "EvaluationResult",
    "evaluate",
    "evaluation_is_current",
    "nrmse",
    "nrmse_per_frame",
    "relative_l2_per_frame",
]
