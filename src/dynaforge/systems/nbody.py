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
- Integrators: symmetric compositions of kick-drift-kick leapfrog (`nbody_schemes`), symplectic and
  time-reversible at fixed dt. Step-size control lives in `nbody_control`.
- Dataset layout (the `NBody` system): fields (batch, time, channels, bodies) with channels
  (x, y, z, vx, vy, vz); the store keeps them channels last, (N, T, bodies, 6).
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Sequence
from typing import ClassVar, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import NBodyConfig
from dynaforge.systems.batching import LANES, block_samples, pad_rows, sample_blocks
from dynaforge.systems.nbody_schemes import SCHEMES, Composition
from dynaforge.threads import run_pieces, serialised

CHANNEL_NAMES = ("x", "y", "z", "vx", "vy", "vz")
DTYPES = {"float32": torch.float32, "float64": torch.float64}
BLOCK_PAIR_VALUES = 2**19
"""A dataset rollout steps about this many pair-separation values at a time (672 systems of 16 bodies):
blocks of whole lane groups on one intra-op thread each (`systems/batching.py`), so that a system's
trajectory is the same bytes in any batch and on any thread count."""


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
    """Forces and potential at the new positions (reused by the next step)."""


def composition_step(
    state: BodyState,
    current: Gravity,
    params: BodyParams,
    dt: Float[Tensor, " batch"],
    scheme: Composition,
) -> StepResult:
    """One step of size dt (per system) of a leapfrog composition; costs `scheme.force_evaluations`.

    `current` holds the forces at `state.positions` (from the previous step or from `gravity`).
    A system with dt = 0 is left unchanged.
    """
    x, v = state
    g = current
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
    scheme = SCHEMES[scheme] if isinstance(scheme, str) else scheme
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


# --------------------------------------------------------------------------------------------------
# The dataset-store system


class NBodyRollout(NamedTuple):
    """Saved frames (channels x, y, z, vx, vy, vz) and their times; the store's `Rollout` contract."""

    fields: Float[Tensor, "batch time channels bodies"]
    time: Float[Tensor, " time"]


def state_to_channels(state: BodyState) -> Float[Tensor, "batch 6 bodies"]:
    return torch.cat([state.positions, state.velocities], dim=-1).transpose(1, 2)


def channels_to_state(fields: Float[Tensor, "batch 6 bodies"]) -> BodyState:
    per_body = fields.transpose(1, 2)
    return BodyState(per_body[..., :3], per_body[..., 3:])


class NBody:
    """The N-body system behind `dynaforge generate` (same contract as `SpectralSystem`).

    Parameter columns: mass_0 .. mass_{n-1}, softening, external_mass, external_x, external_y,
    external_z, then family-specific descriptors (Kepler: semi_major_axis, eccentricity) that the
    dynamics ignore. Fields are (batch, time, 6, bodies), channels (x, y, z, vx, vy, vz); the store keeps
    them channels last. The body axis is named `body`; its coordinate is the body index.
    """

    name: ClassVar[str] = "nbody"
    channels: ClassVar[int] = 6
    ndim: ClassVar[int] = 1
    channel_names: ClassVar[tuple[str, ...]] = CHANNEL_NAMES
    axis_names: ClassVar[tuple[str, ...]] = ("body",)

    def __init__(self, config: NBodyConfig) -> None:
        if not isinstance(config, NBodyConfig):
            raise TypeError(f"NBody needs an NBodyConfig, got {type(config).__name__}")
        self.config = config
        self.shape = (config.bodies,)
        self.dtype = DTYPES[config.dtype]
        self.scheme = SCHEMES[config.integrator]

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    def draw_samples(self, rngs: Sequence[np.random.Generator]) -> tuple[Tensor, Tensor]:
        """Parameters (batch, P) float64 and initial states (batch, 6, bodies) float64, one generator each."""
        from dynaforge.systems.nbody_initial import draw_system

        rows, states = [], []
        for rng in rngs:
            row, positions, velocities = draw_system(self.config, rng)
            rows.append(row)
            states.append(np.concatenate([positions, velocities], axis=1).T)
        return torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(states))

    def params_from_rows(self, rows: Float[Tensor, "batch n_params"]) -> BodyParams:
        """Split parameter rows (columns in `parameter_names` order) into `BodyParams`."""
        names = self.parameter_names
        rows = rows.to(self.dtype)
        column = {name: rows[:, names.index(name)] for name in names if not name.startswith("mass_")}
        masses = rows[:, [names.index(f"mass_{i}") for i in range(self.config.bodies)]]
        position = torch.stack([column["external_x"], column["external_y"], column["external_z"]], dim=1)
        external = column["external_mass"]
        return BodyParams(masses, column["softening"], external, position, bool((external > 0).any()))

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The body axis's coordinate per sample: the body index (N, bodies)."""
        index = np.arange(self.config.bodies, dtype=np.float64)
        return {"body": np.broadcast_to(index, (params.shape[0], self.config.bodies)).copy()}

    def rollout(
        self,
        initial: Float[Tensor, "batch 6 bodies"],
        params: Float[Tensor, "batch n_params"],
        steps: int | None = None,
        save_every: int | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> NBodyRollout:
        """Frames every `save_every * dt` time units up to `steps * dt`, the initial one included.

        With fixed control each frame is `save_every` steps of size dt. With adaptive or learned control
        the controller picks each system's steps and the last step before a frame is shortened to land
        on it (that shortening breaks exact time symmetry; `dynaforge nbody simulate` does not do it).
        """
        steps = self.config.steps if steps is None else steps
        save_every = self.config.save_every if save_every is None else save_every
        expected = (6, self.config.bodies)
        if initial.ndim != 3 or tuple(initial.shape[1:]) != expected:
            raise ValueError(
                f"nbody: initial state must have shape (batch, 6, {self.config.bodies}) with channels "
                f"{CHANNEL_NAMES}, got {tuple(initial.shape)}; add a leading batch axis for one system"
            )
        if params.shape != (initial.shape[0], len(self.parameter_names)):
            raise ValueError(
                f"nbody: params must have shape (batch, {len(self.parameter_names)}) with columns "
                f"{self.parameter_names}, got {tuple(params.shape)}"
            )
        n_frames = steps // save_every + 1
        interval = self.config.dt * save_every
        fields = torch.empty((initial.shape[0], n_frames, *expected), dtype=self.dtype, device=initial.device)
        report = serialised(on_step)

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            state = channels_to_state(pad_rows(initial[rows].to(self.dtype)))
            body_params = self.params_from_rows(pad_rows(params[rows].to(initial.device)))
            saved = self.saved_states(state, body_params, steps, save_every, interval, count, report)
            for frame, saved_state in enumerate(saved):
                fields[rows, frame] = state_to_channels(saved_state)[:count]  # disjoint rows per block

        blocks = sample_blocks(initial.shape[0], self.block_samples())
        if initial.device.type == "cpu":
            run_pieces(run_block, blocks)
        else:  # one device stream: the thread count does not touch the arithmetic
            for rows in blocks:
                run_block(rows)
        time = torch.arange(n_frames, dtype=torch.float64) * interval
        return NBodyRollout(fields, time)

    def block_samples(self) -> int:
        """Systems per block (a multiple of 16, from the body count alone): about `BLOCK_PAIR_VALUES`
        pair-separation values, so that a block's per-step tensors stay in cache."""
        return block_samples(3 * self.config.bodies**2, BLOCK_PAIR_VALUES, LANES)

    def saved_states(
        self,
        state: BodyState,
        params: BodyParams,
        steps: int,
        save_every: int,
        interval: float,
        count: int,
        report: Callable[[int], None] | None,
    ) -> list[BodyState]:
        """The states at every frame time of one block (the initial one first); `report(count * steps)`."""
        if self.config.control.kind == "fixed":
            on_step = None if report is None else (lambda _: report(count))
            _, saved = fixed_step_rollout(
                state, params, self.config.dt, steps, self.scheme, save_every, on_step
            )
            return saved
        from dynaforge.systems.nbody_control import build_controller, rollout_to_times

        controller = build_controller(self.config.control, self.config.dt)
        times = [interval * k for k in range(1, steps // save_every + 1)]
        # Controller steps are not the config's steps: progress counts nominal steps per frame reached.
        on_frame = None if report is None else (lambda _: report(count * save_every))
        return [state, *rollout_to_times(state, params, controller, times, self.scheme, on_frame)]


def orbital_period(semi_major_axis: float, total_mass: float) -> float:
    """Kepler's third law with G = 1: T = 2 pi sqrt(a^3 / M)."""
    return 2.0 * math.pi * math.sqrt(semi_major_axis**3 / total_mass)
