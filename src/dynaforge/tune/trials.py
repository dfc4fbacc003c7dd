"""One trial: train the trial's config into its run folder, reporting to Optuna as training goes.

The trial reports the objective's value to Optuna at the point where a checkpoint has just been written,
and stops (`TrialPruned`) when the pruner says so; a pruned trial therefore keeps a consistent run folder.
- PDE surrogates: an engine callback (`Engine.callbacks`), one intermediate value per epoch.
- The N-body step controller (`dynaforge.train.nbody_controller.Trainer`): one per evaluation
  (`timestepper.eval_every` steps), at optimiser step `step`.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import optuna

from dynaforge.config import Config, ConfigError, TuneObjective
from dynaforge.train import window_engine
from dynaforge.train.nbody_controller import Trainer as ControllerTrainer

Reporter = Callable[[int, Mapping[str, float]], None]
"""Called with (step, metrics so far) after each checkpointed evaluation; raises TrialPruned to stop."""


def reporter_for(trial: optuna.Trial, objectives: list[TuneObjective], reported: set[int]) -> Reporter:
    """Report the single objective's metric at each step (steps in `reported` are skipped); prune.

    A multi-objective study cannot prune (Optuna has no multi-objective pruning), so nothing is reported.
    """

    def report(step: int, metrics: Mapping[str, float]) -> None:
        if len(objectives) != 1 or step in reported:
            return
        metric = objectives[0].metric
        if metric not in metrics:
            return  # a metric known only at the end (parameters, seconds)
        value = float(metrics[metric])
        if not math.isfinite(value):
            return
        trial.report(value, step)
        reported.add(step)
        if trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step}: {metric}={value:.4g}")

    return report


class ControllerTrialTrainer(ControllerTrainer):
    """The N-body controller trainer, reporting each evaluation's metrics (and `best_val_loss`)."""

    def __init__(self, report: Reporter, config: Config, out: str | Path, resume: bool = False) -> None:
        super().__init__(config, out, resume)
        self.report = report

    def evaluate(self) -> dict[str, Any]:
        results = super().evaluate()
        numbers = {k: float(v) for k, v in results.items() if isinstance(v, int | float)}
        self.report(self.step, numbers | {"best_val_loss": self.best})
        return results


def train_pde_trial(
    config: Config, data: Path, run: Path, report: Reporter, resume: bool
) -> dict[str, float]:
    """Train a PDE trial (continuing `run` from its last checkpoint when `resume`), reporting each epoch's
    `val_loss`, `best_val_loss` and `train_loss` through an engine callback; its final metrics."""
    started = time.perf_counter()
    engine = window_engine(config, data, run, progress=False, resume=resume)
    engine.callbacks.append(report)
    summary = engine.fit()
    return {
        "val_loss": summary.last_val_loss,
        "best_val_loss": summary.best_val_loss,
        "train_loss": engine.train_loss,
        "parameters": float(sum(p.numel() for p in engine.model.parameters())),
        "seconds": time.perf_counter() - started,
    }


def train_controller_trial(config: Config, run: Path, report: Reporter, resume: bool) -> dict[str, float]:
    """Train an N-body controller trial (continuing `run` when `resume`); its final metrics."""
    started = time.perf_counter()
    trainer = ControllerTrialTrainer(report, config, run, resume=resume)
    last = trainer.run()
    metrics = {k: float(v) for k, v in last.items() if isinstance(v, int | float)}
    return {
        **metrics,
        "best_val_loss": trainer.best,
        "parameters": float(sum(p.numel() for p in trainer.net.parameters())),
        "seconds": time.perf_counter() - started,
    }


PDE_METRICS = ("best_val_loss", "val_loss", "train_loss", "parameters", "seconds")
CONTROLLER_QUANTITIES = ("mean_log_step", "fraction_above", "max_error", "shape_cost")


def known_metrics(config: Config, controller: bool) -> list[str]:
    """The metric names a trial of `config` measures (what `tune.objectives` may name)."""
    if not controller:
        return list(PDE_METRICS)
    systems = config.timestepper.systems
    groups = (["kepler"] if systems.kepler else []) + (
        [f"cluster{n}" for n in systems.cluster_bodies] if systems.clusters else []
    )
    per_group = [f"val_{g}_{q}" for g in groups for q in CONTROLLER_QUANTITIES]
    return ["best_val_loss", "val_loss", "parameters", "seconds", *per_group]


def check_objectives(objectives: list[TuneObjective], known: list[str]) -> None:
    missing = [o.metric for o in objectives if o.metric not in known]
    if missing:
        raise ConfigError(
            f"tune.objectives: metric(s) {', '.join(missing)} are not measured by this training; "
            f"available: {', '.join(known)}"
        )


def objective_values(metrics: Mapping[str, float], objectives: list[TuneObjective]) -> list[float]:
    """The trial's value per objective; an error naming the available metrics when one is unknown."""
    missing = [o.metric for o in objectives if o.metric not in metrics]
    if missing:
        raise ConfigError(
            f"tune.objectives: metric(s) {', '.join(missing)} are not measured by this training; "
            f"available: {', '.join(sorted(metrics))}"
        )
    return [float(metrics[o.metric]) for o in objectives]
