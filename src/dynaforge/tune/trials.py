"""One trial: train the trial's config into its run folder, reporting to Optuna as training goes.

Both kinds of trial (PDE surrogates, the N-body step controller) train on the engine, which calls the
trial's reporter after each epoch's checkpoints (`Engine.callbacks`): one intermediate value per epoch (the
controller's epochs are `timestepper.eval_every` optimiser steps). The reporter stops a trial the pruner
gives up on (`TrialPruned`), which therefore keeps a consistent run folder.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Mapping
from pathlib import Path

import optuna

from dynaforge.config import Config, ConfigError, TuneObjective
from dynaforge.train import Engine, window_engine
from dynaforge.train.step_controller import controller_engine

Reporter = Callable[[int, Mapping[str, float]], None]
"""Called with (epoch, metrics so far) after each epoch's checkpoints; raises TrialPruned to stop."""


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


def train_pde_trial(
    config: Config, data: Path, run: Path, report: Reporter, resume: bool
) -> dict[str, float]:
    """Train a PDE trial (continuing `run` from its last checkpoint when `resume`); its final metrics."""
    return train_trial(window_engine(config, data, run, progress=False, resume=resume), report)


def train_controller_trial(config: Config, run: Path, report: Reporter, resume: bool) -> dict[str, float]:
    """Train an N-body controller trial (continuing `run` when `resume`); its final metrics."""
    return train_trial(controller_engine(config, run, resume=resume, progress=False), report)


def train_trial(engine: Engine, report: Reporter) -> dict[str, float]:
    """Train with `report` following every epoch; the last epoch's metrics, the model's parameter count and
    the training time."""
    started = time.perf_counter()
    last: dict[str, float] = {}

    def follow(epoch: int, metrics: Mapping[str, float]) -> None:
        last.update(metrics)
        report(epoch, metrics)

    engine.callbacks.append(follow)
    summary = engine.fit()
    return {
        **last,
        "val_loss": summary.last_val_loss,
        "best_val_loss": summary.best_val_loss,
        "train_loss": engine.train_loss,
        "parameters": float(sum(p.numel() for p in engine.model.parameters())),
        "seconds": time.perf_counter() - started,
    }


PDE_METRICS = ("best_val_loss", "val_loss", "train_loss", "parameters", "seconds")
CONTROLLER_QUANTITIES = {
    "window": ("mean_log_step", "fraction_above", "max_error", "shape_cost"),
    "run": ("cost", "steps_per_time", "max_error"),
}
"""Per-group validation figures of the controller (`val_GROUP_NAME`), by `timestepper.loss`."""


def known_metrics(config: Config, controller: bool) -> list[str]:
    """The metric names a trial of `config` measures (what `tune.objectives` may name)."""
    if not controller:
        return list(PDE_METRICS)
    systems = config.timestepper.systems
    groups = (["kepler"] if systems.kepler else []) + (
        [f"cluster{n}" for n in systems.cluster_bodies] if systems.clusters else []
    )
    per_group = [f"val_{g}_{q}" for g in groups for q in CONTROLLER_QUANTITIES[config.timestepper.loss]]
    return ["best_val_loss", "val_loss", "train_loss", "parameters", "seconds", *per_group]


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
