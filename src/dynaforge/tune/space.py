"""The search space of a study: draw a trial's values, and turn them into the trial's config.

`tune.space` maps dotted config keys to `SearchDimension`s. A trial's config is the study's config with
each drawn value set at its key, validated like any config (so a value the config rejects is an error
naming the key). The space is checked before the first trial: every key must exist, and the extremes of
each dimension must make a valid config.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

import optuna

from dynaforge.config import Config, ConfigError, SearchDimension, config_from_dict, config_to_dict

DATA_SECTIONS = ("system", "dataset")
"""Sections that decide the dataset: a PDE study trains every trial on one dataset, so these are fixed."""


def suggest(trial: optuna.Trial, space: Mapping[str, SearchDimension]) -> dict[str, Any]:
    """Draw one value per dimension of `space` for `trial` (Optuna records them as the trial's params)."""
    return {key: suggest_one(trial, key, dimension) for key, dimension in space.items()}


def suggest_one(trial: optuna.Trial, key: str, dimension: SearchDimension) -> Any:
    if dimension.kind == "categorical":
        return trial.suggest_categorical(key, dimension.choices)
    assert dimension.low is not None and dimension.high is not None  # checked by SearchDimension
    if dimension.kind == "int":
        step = int(dimension.step) if dimension.step is not None else 1
        return trial.suggest_int(key, int(dimension.low), int(dimension.high), step=step, log=dimension.log)
    if dimension.kind == "log_uniform":
        return trial.suggest_float(key, dimension.low, dimension.high, log=True)
    return trial.suggest_float(key, dimension.low, dimension.high, step=dimension.step)


def config_with_values(config: Config, values: Mapping[str, Any]) -> Config:
    """`config` with each dotted key of `values` set to its value; a ConfigError names a bad key or value."""
    data = copy.deepcopy(config_to_dict(config))
    for key, value in values.items():
        set_dotted(data, key, value)
    try:
        return config_from_dict(data)
    except ConfigError as error:
        raise ConfigError(f"tune.space: {error}") from None


def set_dotted(data: dict[str, Any], key: str, value: Any) -> None:
    """Set `data[a][b][c] = value` for key `a.b.c`; every part but the last must name an existing mapping."""
    parts = key.split(".")
    node: Any = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part) if isinstance(node, dict) else None
        if not isinstance(child, dict):
            where = ".".join(parts[: depth + 1])
            valid = ", ".join(node) if isinstance(node, dict) else "none"
            raise ConfigError(
                f"tune.space key {key!r}: {where!r} is not a config section; valid here: {valid}"
            )
        node = child
    if parts[-1] not in node:
        valid = ", ".join(node)
        raise ConfigError(f"tune.space key {key!r}: no config key {parts[-1]!r} there; valid keys: {valid}")
    node[parts[-1]] = value


def check_space(config: Config, fixed_sections: tuple[str, ...] = ()) -> None:
    """Fail before the first trial when a key is unknown, lies in `fixed_sections`, or a bound is invalid."""
    space = config.tune.space
    if not space:
        raise ConfigError(
            "tune.space is empty: declare what to search, e.g. tune.space: {train.lr: {kind: log_uniform, "
            "low: 1.0e-4, high: 1.0e-2}}"
        )
    for key, dimension in space.items():
        if key.split(".")[0] in fixed_sections:
            raise ConfigError(
                f"tune.space key {key!r}: {', '.join(fixed_sections)} decide the dataset, which every trial of "
                "a study shares; tune model, data (windows), train or timestepper keys"
            )
        for value in extremes(dimension):
            config_with_values(config, {key: value})


def extremes(dimension: SearchDimension) -> list[Any]:
    """The values that bound a dimension: every choice, or low and high."""
    if dimension.kind == "categorical":
        return list(dimension.choices)
    assert dimension.low is not None and dimension.high is not None
    if dimension.kind == "int":
        return [int(dimension.low), int(dimension.high)]
    return [dimension.low, dimension.high]
