"""The `tune` section: the hyper-parameter search of `dynaforge tune`."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import urlsplit

from dynaforge.config.base import NON_NEGATIVE, POSITIVE, ConfigError, between, check_values, checked


@dataclass
class SearchDimension:
    """How Optuna draws one config value of a trial (a `tune.space` entry, keyed by the dotted config key).

    `log_uniform`: a float between low and high, uniform in log space. `uniform`: a float between low and
    high (on a grid of `step` when set). `int`: an integer between low and high inclusive (every `step`;
    in log space with `log`). `categorical`: one of `choices`.
    """

    kind: Literal["log_uniform", "uniform", "int", "categorical"] = "uniform"
    """The distribution: log_uniform, uniform, int or categorical."""
    low: float | None = None
    """Smallest value (log_uniform, uniform, int)."""
    high: float | None = None
    """Largest value, included (log_uniform, uniform, int)."""
    step: float | None = checked(None, check=POSITIVE.because("grid spacing; null: continuous"))
    """Grid spacing (uniform, int; int defaults to 1); null draws continuously."""
    log: bool = False
    """Draw an int in log space (int only; log_uniform is the float kind)."""
    choices: list[Any] = field(default_factory=list)
    """The values of a categorical dimension: numbers, strings, booleans or null."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.kind == "categorical":
            if not self.choices:
                raise ConfigError("a categorical dimension needs a non-empty `choices` list")
            bad = [c for c in self.choices if not (c is None or isinstance(c, bool | int | float | str))]
            if bad:
                raise ConfigError(f"choices must be numbers, strings, booleans or null, got {bad!r}")
            return
        if self.choices:
            raise ConfigError(f"`choices` belongs to kind categorical, not {self.kind}")
        if self.low is None or self.high is None:
            raise ConfigError(f"a {self.kind} dimension needs `low` and `high`")
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if (self.kind == "log_uniform" or self.log) and self.low <= 0:
            raise ConfigError(f"a log-scale dimension needs low > 0, got low={self.low}")
        if self.log and self.kind != "int":
            raise ConfigError("`log` applies to kind int; use kind log_uniform for floats")
        if self.kind == "log_uniform" and self.step is not None:
            raise ConfigError("a log_uniform dimension takes no `step`")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"an int dimension needs integer low and high, got {self.low} and {self.high}")


@dataclass
class TuneObjective:
    """One value a study optimises: a named metric of the trial's validation and its direction.

    PDE surrogates: `best_val_loss` (the loss of the kept best.pt), `val_loss` and `train_loss` (last
    epoch), `parameters`, `seconds` (training time). The N-body controller: `best_val_loss`, `val_loss` and
    the `val_<group>_<quantity>` entries of its evaluation (e.g. `val_kepler_mean_log_step`),
    `parameters`, `seconds`.
    """

    metric: str = "best_val_loss"
    """Name of the metric (see the class docstring)."""
    direction: Literal["minimize", "maximize"] = "minimize"
    """Whether smaller or larger values are better."""


@dataclass
class TunePrunerConfig:
    """Stops trials whose intermediate values (one per epoch, or per controller evaluation) lag behind.

    Pruning needs a single objective; a multi-objective study runs every trial to the end.
    """

    name: Literal["median", "percentile", "successive_halving", "hyperband", "none"] = "median"
    """Optuna pruner: median, percentile, successive_halving, hyperband, or none."""
    startup_trials: int = checked(2, check=NON_NEGATIVE)
    """Trials that run to the end before median/percentile pruning starts."""
    warmup_epochs: int = checked(0, check=NON_NEGATIVE)
    """Intermediate values of a trial not judged by median/percentile pruning: its first epochs (the
    N-body controller: its first optimiser steps)."""
    percentile: float = checked(25.0, check=between(0.0, 100.0, open_low=True, open_high=True))
    """The percentile pruner keeps trials in the best `percentile` per cent."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class TuneConfig:
    """An Optuna study over this config (`dynaforge tune CONFIG --trials N`); see `dynaforge.tune`.

    Each trial trains this config with the `space` values drawn for it, in STUDY/trials/NNNN/.
    """

    space: dict[str, SearchDimension] = field(default_factory=dict)
    """Dotted config key (e.g. `train.lr`, `model.width`) -> how to draw its value."""
    objectives: list[TuneObjective] = field(default_factory=lambda: [TuneObjective()])
    """What the study optimises; more than one makes a multi-objective study (a Pareto front)."""
    pruner: TunePrunerConfig = field(default_factory=TunePrunerConfig)
    """Which trials are stopped early."""
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    """Optuna sampler: tpe (default), random, or nsga2 (multi-objective)."""
    seed: int = 0
    """Sampler seed (the n-th process to join a study, counting from 0, adds 1000 n)."""
    study: str | None = None
    """Study name; null uses the config file's name. `--study` overrides it."""
    storage: str | None = None
    """Optuna storage URL; null is SQLite in the study folder (STUDY/study.db). `--storage` overrides it.
    A URL without a password (postgresql://USER@HOST:PORT/DB): it is saved with the config; the password
    comes from PGPASSWORD or ~/.pgpass."""
    heartbeat: int = checked(10, check=POSITIVE.because("seconds"))
    """Seconds between a running trial's heartbeats. A trial whose process died on this host is marked
    failed and retried at once by the next `dynaforge tune` here; one from another host, once it has
    been silent for twice as long."""
    retries: int = checked(1, check=NON_NEGATIVE)
    """Times a failed trial is retried with the same values (resuming its run from its last checkpoint)."""
    plots: bool = True
    """Write optimisation history, parameter importances and parallel coordinates as PNG."""

    def __post_init__(self) -> None:
        check_values(self)
        if not self.objectives:
            raise ConfigError("objectives needs at least one {metric, direction} entry")
        if self.storage is not None and urlsplit(self.storage).password is not None:
            raise ConfigError(
                "storage carries a password, which would be saved with the config: put the password in "
                "PGPASSWORD or ~/.pgpass (PGPASSFILE), not in the URL"
            )
        for key in self.space:
            if key.split(".")[0] == "tune":
                raise ConfigError(f"space key {key!r}: the tune section itself cannot be tuned")
