"""Parameter spaces sampled with scrambled Sobol points (`scipy.stats.qmc`).

A space is an ordered list of named `ParameterSpec`s (`dynaforge.config`); point i of a split is row i of
one scrambled Sobol sequence whose scrambling is seeded by (base seed, split) alone, so a point does not
depend on shards or batches. Each unit-cube coordinate q in [0, 1) maps to a value (`map_coordinate`):
integers and reals directly, a weighted choice to the index of its option (names in `choice_names`), a
boolean to 0 or 1. Both the coordinates and the mapped values are stored with the data.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Any

import numpy as np

from dynaforge.config import ParameterSpec
from dynaforge.errors import ConfigError

SOBOL_STREAM = 1
"""Spawn-key tag of the Sobol scrambling seed, apart from the per-sample seeds of `store.format`."""


def space_dimensions(space: Any) -> list[tuple[str, ParameterSpec]]:
    """The (name, spec) pairs of a space dataclass, in field order (one Sobol dimension each)."""
    return [(f.name, getattr(space, f.name)) for f in dataclasses.fields(space)]


def sobol_seed(base_seed: int, split_id: int) -> int:
    """The scrambling seed of a split's Sobol sequence, from (base seed, split id) alone."""
    sequence = np.random.SeedSequence(entropy=base_seed, spawn_key=(split_id, SOBOL_STREAM))
    return int(sequence.generate_state(1, dtype=np.uint64)[0])


def sobol_points(dimensions: int, start: int, stop: int, seed: int) -> np.ndarray:
    """Points start..stop-1 (float64, (stop - start, dimensions)) of the scrambled sequence of `seed`."""
    from scipy.stats import qmc  # lazy: scipy.stats takes 1-2 s to import, only random CNN parameters need it

    sampler = qmc.Sobol(d=dimensions, scramble=True, rng=np.random.default_rng(seed))
    if start:
        sampler.fast_forward(start)
    if stop == start:
        return np.zeros((0, dimensions), dtype=np.float64)
    with warnings.catch_warnings():
        # Any contiguous run of one sequence is drawn here, not only power-of-two prefixes; the balance
        # warning is about the latter and says nothing about the union, which is what a split holds.
        warnings.filterwarnings("ignore", message=".*balance properties of Sobol.*", category=UserWarning)
        return sampler.random(stop - start)


def centred_discrepancy(points: np.ndarray) -> float:
    """Centred L2 discrepancy of points in the unit cube (lower is more uniform)."""
    if len(points) < 2:
        return float("nan")
    from scipy.stats import qmc  # lazy: scipy.stats takes 1-2 s to import (see sobol_points)

    return float(qmc.discrepancy(points, method="CD"))


def choice_names(spec: ParameterSpec) -> list[str]:
    """The options of a `choice` spec in the order their indices refer to."""
    return list(spec.choices)


def map_coordinate(spec: ParameterSpec, q: float) -> float:
    """The value of one unit coordinate (see the module docstring); choices and booleans as indices."""
    if spec.kind == "int":
        span = int(spec.high) - int(spec.low) + 1
        return float(min(int(spec.low) + math.floor(q * span), int(spec.high)))
    if spec.kind == "real":
        if spec.log:
            return float(math.exp(math.log(spec.low) + q * (math.log(spec.high) - math.log(spec.low))))
        return float(spec.low + q * (spec.high - spec.low))
    if spec.kind == "choice":
        weights = np.asarray(list(spec.choices.values()), dtype=np.float64)
        edges = np.cumsum(weights) / weights.sum()
        return float(min(int(np.searchsorted(edges, q, side="right")), len(weights) - 1))
    if spec.kind == "bool":
        return float(q < spec.probability)
    raise ConfigError(f"unknown parameter kind {spec.kind!r}")


def map_points(dimensions: list[tuple[str, ParameterSpec]], points: np.ndarray) -> np.ndarray:
    """Mapped values (float64, same shape as `points`), column by column."""
    values = np.empty_like(points, dtype=np.float64)
    for j, (_, spec) in enumerate(dimensions):
        values[:, j] = [map_coordinate(spec, float(q)) for q in points[:, j]]
    return values


def decode_value(spec: ParameterSpec, value: float) -> Any:
    """A stored value as the object it stands for: int, float, option name or bool."""
    if spec.kind == "int":
        return int(value)
    if spec.kind == "choice":
        return choice_names(spec)[int(value)]
    if spec.kind == "bool":
        return bool(value)
    return float(value)
