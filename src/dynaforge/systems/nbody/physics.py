"""Gravitational N-body systems, batched: forces, invariants and symplectic integrators.

Conventions (every function in this module and in `nbody_control`, `nbody_initial`):
- Units: G = 1. The initial-condition families use N-body (Hénon) units where that is the custom
  (total mass 1, virial radius 1, energy -1/4); Kepler orbits use the given (a, e, masses).
- A batch holds `batch` independent systems of the same number of bodies, stepped together; each system
  has its own step size dt, so adaptive control acts per system.
- State: positions and velocities, each (batch, bodies, 3), float64 by default. Planar orbits have z = 0.
- Parameters per system: masses (batch, bodies), Plummer softening eps (batch,), and an optional external
  point mass M_ext (batch,) fixed at X_ext (batch, 3) (a tidal perturber; M_ext = 0 switches it off).
- Force on body i:
      a_i = sum_{j != i} m_j (x_j - x_i) / (|x_j - x_i|^2 + eps^2)^(3/2)
            + M_ext (X_ext - x_i) / (|X_ext - x_i|^2 + eps^2)^(3/2)
- Energy: E = sum_i m_i |v_i|^2 / 2 - sum_{i<j} m_i m_j / sqrt(r_ij^2 + eps^2)
              - sum_i m_i M_ext / sqrt(|x_i - X_ext|^2 + eps^2)
  (the external potential is included, so E is conserved with or without the perturber).
- Linear momentum P = sum_i m_i v_i (conserved only when M_ext = 0). Angular momentum is taken about the
  external mass's position, L = sum_i m_i (x_i - X_ext) x v_i, which the central external force conserves.
- Integrators: symmetric compositions of leapfrog, kick-drift-kick or drift-kick-drift (`nbody_schemes`),
  symplectic and time-reversible at fixed dt. Step-size control lives in `nbody_control`.
- Dataset layout (the `NBody` system): fields (batch, time, channels, bodies) with channels
  (x, y, z, vx, vy, vz); the store keeps them channels last, (N, T, bodies, 6).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.systems.nbody.schemes import Composition, scheme_named

CHANNEL_NAMES = ("x", "y", "z", "vx", "vy", "vz")
DTYPES = {"float32": torch.float32, "float64": torch.float64}


class BodyState(NamedTuple):
    """Positions and velocities of a batch of systems."""

    positions: Float[Tensor, "batch bodies 3"]
    velocities: Float[Tensor, "batch bodies 3"]


class BodyParams(NamedTuple):
    """Per-system physical parameters (see the module docstring)."""

    masses: Float[Tensor, "batch bodies"]
    softening: Float[Tensor, " batch"]
    external_mass: Float[Tensor, " batch"]
    external_position: Float[Tensor, "batch 3"]
    has_external: bool = True
    """False when every external mass is zero: force evaluations then skip the perturber."""


class Gravity(NamedTuple):
    """Accelerations and total potential energy at one set of positions (one force evaluation)."""

    accelerations: Float[Tensor, "batch bodies 3"]
    potential: Float[Tensor, " batch"]


class Invariants(NamedTuple):
    energy: Float[Tensor, " batch"]
    momentum: Float[Tensor, "batch 3"]
    angular_momentum: Float[Tensor, "batch 3"]


class Drifts(NamedTuple):
    """Relative changes of the invariants since t = 0, per system.

    energy: |E - E0| / |E0|. momentum: |P - P0| / sum_i m_i |v_i(0)|. angular momentum:
    |L - L0| / sum_i m_i |x_i(0) - X_ext| |v_i(0)| (these scales stay finite when P0 or L0 vanish,
    as for the figure-eight orbit, and equal |L0| for a circular orbit).
    """

    energy: Float[Tensor, " batch"]
    momentum: Float[Tensor, " batch"]
    angular_momentum: Float[Tensor, " batch"]


# --------------------------------------------------------------------------------------------------
# Forces and invariants


def make_params(
    masses: Tensor,
    softening: Tensor | float = 0.0,
    external_mass: Tensor | float = 0.0,
    external_position: Tensor | Sequence[float] = (0.0, 0.0, 0.0),
) -> BodyParams:
    """`BodyParams` with scalars broadcast to the batch of `masses` (batch, bodies), in its dtype."""
    batch, dtype, device = masses.shape[0], masses.dtype, masses.device
    softening = torch.as_tensor(softening, dtype=dtype, device=device).expand(batch)
    external_mass = torch.as_tensor(external_mass, dtype=dtype, device=device).expand(batch)
    position = torch.as_tensor(external_position, dtype=dtype, device=device).expand(batch, 3)
    return BodyParams(masses, softening, external_mass, position, bool((external_mass > 0).any()))


def pair_separations(positions: Float[Tensor, "batch bodies 3"]) -> Float[Tensor, "batch bodies bodies 3"]:
    """d[b, i, j] = x_j - x_i."""
    return positions.unsqueeze(1) - positions.unsqueeze(2)


@functools.lru_cache(maxsize=64)
def identity(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """The (n, n) identity, cached: force evaluations of small systems are dominated by per-call overhead.

    Made outside inference mode so that one cached tensor serves both inference and autograd.
    """
    with torch.inference_mode(False):
        return torch.eye(n, dtype=dtype, device=device)


@functools.lru_cache(maxsize=64)
def off_diagonal(n: int, dtype: torch.dtype, device: torch.device) -> Tensor:
    """1 - identity, cached like `identity`."""
    with torch.inference_mode(False):
        return 1.0 - torch.eye(n, dtype=dtype, device=device)


def softened_pair_distances_squared(
    separations: Float[Tensor, "batch bodies bodies 3"], softening: Float[Tensor, " batch"]
) -> Float[Tensor, "batch bodies bodies"]:
    """|x_j - x_i|^2 + eps^2, with 1 on the diagonal so that powers of it stay finite (masked later)."""
    eye = identity(separations.shape[1], separations.dtype, separations.device)
    return (separations * separations).sum(-1) + (softening * softening).view(-1, 1, 1) + eye


def gravity(positions: Float[Tensor, "batch bodies 3"], params: BodyParams) -> Gravity:
    """Accelerations of every body and the total potential energy: one force evaluation."""
    d = pair_separations(positions)
    r2 = softened_pair_distances_squared(d, params.softening)
    inv_r = torch.rsqrt(r2) * off_diagonal(r2.shape[1], r2.dtype, r2.device)  # (B, N, N), 0 on the diagonal
    m = params.masses
    m_j_inv_r = m.unsqueeze(1) * inv_r  # m_j / r_ij
    acc = ((m_j_inv_r * inv_r * inv_r).unsqueeze(-1) * d).sum(2)
    potential = -0.5 * (m * m_j_inv_r.sum(2)).sum(1)
    if not params.has_external:
        return Gravity(acc, potential)
    external = external_gravity(positions, params)
    return Gravity(acc + external.accelerations, potential + external.potential)


def external_gravity(positions: Float[Tensor, "batch bodies 3"], params: BodyParams) -> Gravity:
    """Pull and potential energy of the external point mass (zero when M_ext = 0)."""
    d = params.external_position.unsqueeze(1) - positions  # (B, N, 3)
    r2 = (d * d).sum(-1) + (params.softening**2).unsqueeze(1)
    mass = params.external_mass.unsqueeze(1)  # (B, 1)
    safe = torch.where(mass > 0, r2, torch.ones_like(r2))  # no 1/0 when the perturber is off and eps = 0
    inv_r = torch.rsqrt(safe) * (mass > 0)
    acc = (mass * inv_r**3).unsqueeze(-1) * d
    potential = -(params.masses * mass * inv_r).sum(1)
    return Gravity(acc, potential)


def potential_energy(
    positions: Float[Tensor, "batch bodies 3"], params: BodyParams
) -> Float[Tensor, " batch"]:
    """The total potential energy alone (the energy diagnostic of drift-kick-drift steps; not counted as a
    force evaluation: it computes no forces)."""
    r2 = softened_pair_distances_squared(pair_separations(positions), params.softening)
    inv_r = torch.rsqrt(r2) * off_diagonal(r2.shape[1], r2.dtype, r2.device)
    m = params.masses
    potential = -0.5 * (m * (m.unsqueeze(1) * inv_r).sum(2)).sum(1)
    if not params.has_external:
        return potential
    return potential + external_gravity(positions, params).potential


def accelerations(positions: Float[Tensor, "batch bodies 3"], params: BodyParams) -> Tensor:
    return gravity(positions, params).accelerations


def kinetic_energy(velocities: Float[Tensor, "batch bodies 3"], masses: Tensor) -> Float[Tensor, " batch"]:
    return 0.5 * (masses * (velocities * velocities).sum(-1)).sum(1)


def energy(state: BodyState, params: BodyParams) -> Float[Tensor, " batch"]:
    return kinetic_energy(state.velocities, params.masses) + gravity(state.positions, params).potential


def momentum(state: BodyState, params: BodyParams) -> Float[Tensor, "batch 3"]:
    return (params.masses.unsqueeze(-1) * state.velocities).sum(1)


def angular_momentum(state: BodyState, params: BodyParams) -> Float[Tensor, "batch 3"]:
    """About the external mass's position (the origin when there is none)."""
    arm = state.positions - params.external_position.unsqueeze(1)
    return (params.masses.unsqueeze(-1) * torch.linalg.cross(arm, state.velocities, dim=-1)).sum(1)


def invariants(state: BodyState, params: BodyParams, potential: Tensor | None = None) -> Invariants:
    """Energy, momentum and angular momentum; pass `potential` from a `Gravity` to skip recomputing it."""
    if potential is None:
        potential = gravity(state.positions, params).potential
    total = kinetic_energy(state.velocities, params.masses) + potential
    return Invariants(total, momentum(state, params), angular_momentum(state, params))


class DriftScales(NamedTuple):
    """Denominators of the relative drifts, fixed at t = 0 (see `Drifts`)."""

    energy: Float[Tensor, " batch"]
    momentum: Float[Tensor, " batch"]
    angular_momentum: Float[Tensor, " batch"]


def drift_scales(state: BodyState, params: BodyParams, reference: Invariants) -> DriftScales:
    speed = state.velocities.norm(dim=-1)
    arm = (state.positions - params.external_position.unsqueeze(1)).norm(dim=-1)
    return DriftScales(
        reference.energy.abs(),
        (params.masses * speed).sum(1),
        (params.masses * arm * speed).sum(1),
    )


def relative_drifts(current: Invariants, reference: Invariants, scales: DriftScales) -> Drifts:
    tiny = torch.finfo(current.energy.dtype).tiny
    return Drifts(
        (current.energy - reference.energy).abs() / scales.energy.clamp_min(tiny),
        (current.momentum - reference.momentum).norm(dim=-1) / scales.momentum.clamp_min(tiny),
        (current.angular_momentum - reference.angular_momentum).norm(dim=-1)
        / scales.angular_momentum.clamp_min(tiny),
    )


# --------------------------------------------------------------------------------------------------
# Integrators


class StepResult(NamedTuple):
    state: BodyState
    gravity: Gravity
    """Forces and potential for the next step: KDK, both at the new positions (exact, reused by the next
    step); DKD, the potential at the new positions and the forces of the step's last kick (at its last
    mid-drift positions, the freshest forces a step of that ordering has without an extra evaluation)."""


def composition_step(
    state: BodyState,
    current: Gravity,
    params: BodyParams,
    dt: Float[Tensor, " batch"],
    scheme: Composition,
) -> StepResult:
    """One step of size dt (per system) of a leapfrog composition; costs `scheme.force_evaluations`.

    `current` holds the forces at `state.positions` (from the previous step or from `gravity`; a DKD step
    does not read them). A system with dt = 0 is left unchanged.
    """
    x, v = state
    g = current
    if scheme.ordering == "dkd":
        weights = scheme.weights
        for k, weight in enumerate(weights):
            h = (weight * dt).view(-1, 1, 1)
            drift = 0.5 * h if k == 0 else 0.5 * (weights[k - 1] * dt).view(-1, 1, 1) + 0.5 * h
            x = x + drift * v  # this substep's first half-drift merged with the last one's second
            g = gravity(x, params)
            v = v + h * g.accelerations
        x = x + (0.5 * weights[-1] * dt).view(-1, 1, 1) * v
        return StepResult(BodyState(x, v), Gravity(g.accelerations, potential_energy(x, params)))
    for weight in scheme.weights:
        h = (weight * dt).view(-1, 1, 1)
        v = v + (0.5 * h) * g.accelerations
        x = x + h * v
        g = gravity(x, params)
        v = v + (0.5 * h) * g.accelerations
    return StepResult(BodyState(x, v), g)


def fixed_step_rollout(
    state: BodyState,
    params: BodyParams,
    dt: float | Tensor,
    steps: int,
    scheme: Composition | str = "leapfrog",
    save_every: int = 1,
    on_step: Callable[[int], None] | None = None,
) -> tuple[BodyState, list[BodyState]]:
    """`steps` fixed steps; returns the final state and the states every `save_every` steps (t = 0 first)."""
    scheme = scheme_named(scheme)
    dt_batch = torch.as_tensor(dt, dtype=state.positions.dtype, device=state.positions.device)
    dt_batch = dt_batch.expand(state.positions.shape[0])
    g = gravity(state.positions, params)
    saved = [state]
    for n in range(1, steps + 1):
        state, g = composition_step(state, g, params, dt_batch, scheme)
        if n % save_every == 0:
            saved.append(state)
        if on_step is not None:
            on_step(1)
    return state, saved


def orbital_period(semi_major_axis: float, total_mass: float) -> float:
    """Kepler's third law with G = 1: T = 2 pi sqrt(a^3 / M)."""
    return 2.0 * math.pi * math.sqrt(semi_major_axis**3 / total_mass)
