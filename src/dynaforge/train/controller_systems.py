"""The systems the N-body step controller trains on: episode start states per group of body count.

Kepler orbits are drawn analytically; clusters are drawn virialised and integrated with the classical
criterion, and their start states are drawn over the reference run's steps. Everything is seeded by one
seed and stored in the controller's checkpoints (`training_systems`), so a resumed run trains on the same
systems.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from dynaforge.config import ControllerSystemsConfig
from dynaforge.systems.nbody.control import ClassicalStep, Integrator
from dynaforge.systems.nbody.initial import kepler_relative_state, random_cluster
from dynaforge.systems.nbody.physics import BodyParams, BodyState, make_params


def build_training_systems(
    config: ControllerSystemsConfig, seed: int, dtype: torch.dtype = torch.float64
) -> dict[str, Tensor]:
    """Episode start states, grouped by body count, as a flat dict of tensors (stored in checkpoints).

    Keys per group g (`kepler`, `cluster4`, ...): `g/positions` (S, N, 3), `g/velocities`, `g/masses`
    (S, N), `g/softening` (S,), and the systems' initial conditions `g/initial_positions` (P, N, 3),
    `g/initial_velocities`, `g/initial_masses`.
    """
    rng = np.random.default_rng(seed)
    systems: dict[str, Tensor] = {}
    if config.kepler:
        systems |= kepler_group(config, rng, dtype)
    for bodies in config.cluster_bodies if config.clusters else []:
        systems |= cluster_group(config, bodies, rng, dtype)
    return systems


def group_names(systems: dict[str, Tensor]) -> list[str]:
    return sorted({key.split("/")[0] for key in systems})


def kepler_group(
    config: ControllerSystemsConfig, rng: np.random.Generator, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Kepler orbits (a = 1, m1 + m2 = 1), `snapshots` states each at uniformly drawn eccentric anomalies."""
    count, snaps = config.kepler, config.snapshots
    low, high = config.eccentricity.low, config.eccentricity.high
    if config.eccentricity_draw == "log_pericentre":
        e = 1.0 - np.exp(rng.uniform(math.log(1.0 - high), math.log(1.0 - low), size=count))
    else:
        e = rng.uniform(low, high, size=count)
    q = rng.uniform(config.mass_ratio.low, config.mass_ratio.high, size=count)
    m1, m2 = 1.0 / (1.0 + q), q / (1.0 + q)
    anomalies = rng.uniform(0.0, 2.0 * math.pi, size=(count, snaps))
    positions, velocities, masses = [], [], []
    initial_x, initial_v = [], []
    for k in range(count):
        rel_x, rel_v = kepler_relative_state(1.0, e[k], 1.0, anomalies[k])  # (snaps, 3)
        pair_x = np.stack([-m2[k] * rel_x, m1[k] * rel_x], axis=1)
        pair_v = np.stack([-m2[k] * rel_v, m1[k] * rel_v], axis=1)
        positions.append(pair_x)
        velocities.append(pair_v)
        masses.append(np.tile([m1[k], m2[k]], (snaps, 1)))
        initial_x.append(pair_x[0])
        initial_v.append(pair_v[0])
    return {
        "kepler/positions": torch.as_tensor(np.concatenate(positions), dtype=dtype),
        "kepler/velocities": torch.as_tensor(np.concatenate(velocities), dtype=dtype),
        "kepler/masses": torch.as_tensor(np.concatenate(masses), dtype=dtype),
        "kepler/softening": torch.zeros(count * snaps, dtype=dtype),
        "kepler/initial_positions": torch.as_tensor(np.stack(initial_x), dtype=dtype),
        "kepler/initial_velocities": torch.as_tensor(np.stack(initial_v), dtype=dtype),
        "kepler/initial_masses": torch.as_tensor(np.stack([m1, m2], axis=1), dtype=dtype),
        "kepler/eccentricity": torch.as_tensor(e, dtype=dtype),
    }


def cluster_group(
    config: ControllerSystemsConfig, bodies: int, rng: np.random.Generator, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Random virialised clusters integrated for `reference_time` with the classical criterion; segment
    starts are states drawn uniformly over the reference run's steps (so close encounters, where steps
    are short, are drawn often)."""
    count = config.clusters
    softening = rng.uniform(config.softening.low, config.softening.high, size=count)
    drawn = [random_cluster(bodies, rng, 0.5, 1.5, 0.5, float(eps)) for eps in softening]
    x0 = torch.as_tensor(np.stack([b.positions for b in drawn]), dtype=dtype)
    v0 = torch.as_tensor(np.stack([b.velocities for b in drawn]), dtype=dtype)
    m = torch.as_tensor(np.stack([b.masses for b in drawn]), dtype=dtype)
    eps = torch.as_tensor(softening, dtype=dtype)
    params = make_params(m, eps)
    states: list[BodyState] = []
    integrator = Integrator(params, ClassicalStep(config.reference_eta), "leapfrog", reversible=True)
    with torch.inference_mode():
        run = integrator.start(BodyState(x0, v0))
        run = integrator.advance(
            run, config.reference_time, max_steps=200_000, on_step=lambda r, _: states.append(r.state)
        )
    x = torch.stack([s.positions for s in states], dim=1)  # (count, steps, N, 3)
    v = torch.stack([s.velocities for s in states], dim=1)
    picks = rng.integers(0, x.shape[1], size=(count, config.snapshots))
    index = torch.as_tensor(picks, dtype=torch.int64)
    rows = torch.arange(count).unsqueeze(1).expand_as(index)
    name = f"cluster{bodies}"
    snaps = config.snapshots
    return {
        f"{name}/positions": x[rows, index].reshape(count * snaps, bodies, 3).clone(),
        f"{name}/velocities": v[rows, index].reshape(count * snaps, bodies, 3).clone(),
        f"{name}/masses": m.repeat_interleave(snaps, dim=0),
        f"{name}/softening": eps.repeat_interleave(snaps, dim=0),
        f"{name}/initial_positions": x0,
        f"{name}/initial_velocities": v0,
        f"{name}/initial_masses": m,
    }


class Starts(NamedTuple):
    """Start states of some systems of one group, and their masses and softening."""

    state: BodyState
    params: BodyParams


def segment_starts(systems: dict[str, Tensor], group: str, index: Tensor) -> Starts:
    """The start states `index` of `group`."""
    state = BodyState(systems[f"{group}/positions"][index], systems[f"{group}/velocities"][index])
    return Starts(state, make_params(systems[f"{group}/masses"][index], systems[f"{group}/softening"][index]))
