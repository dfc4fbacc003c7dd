"""Evaluation: rollouts on the test split, metrics, plots and the HTML report."""

from dynaforge.evaluate.evaluator import EvaluationResult, evaluate, evaluation_is_current
from dynaforge.evaluate.suite import METRICS, MetricSettings, score_predictions, score_rollouts
from dynaforge.metrics.fields import nrmse, nrmse_per_frame, relative_l2_per_frame

__all__ = [
    "METRICS",
    "EvaluationResult",
    "MetricSettings",
    "evaluate",
    "evaluation_is_current",
    "nrmse",
    "nrmse_per_frame",
    "relative_l2_per_frame",
    "score_predictions",
    "score_rollouts",
]
