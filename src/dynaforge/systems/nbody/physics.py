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
import logging
import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, no_type_check

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.systems.nbody.schemes import Composition, scheme_named

log = logging.getLogger(__name__)

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


SMALL_PAIR_BYTES = 1 << 16
"""Below this size of a batch's pair separations, forces are evaluated out of place (`pair_gravity`)."""

PAIR_CHUNK_BYTES = 1 << 20
"""Size of the pair separations of one chunk of systems in a force evaluation. The evaluation makes about
twenty passes over its pair tensors; chunks of this size keep them in a core's L2 cache between the passes
instead of streaming them from memory (docs/nbody.md, "Batched throughput")."""


@no_type_check  # the hot path of every force evaluation: no runtime type-checking wrapper (tests/physics check it)
def systems_per_chunk(bodies: int, dtype: torch.dtype) -> int:
    """How many systems one chunk of a force evaluation holds (at least one)."""
    pair_bytes = 3 * bodies * bodies * torch.finfo(dtype).bits // 8
    return max(1, PAIR_CHUNK_BYTES // pair_bytes)


def gravity(positions: Float[Tensor, "batch bodies 3"], params: BodyParams) -> Gravity:
    """Accelerations of every body and the total potential energy: one force evaluation."""
    acc, potential = pair_gravity(positions, params, forces=True)
    if not params.has_external:
        return Gravity(acc, potential)
    external = external_gravity(positions, params)
    return Gravity(acc + external.accelerations, potential + external.potential)


@no_type_check  # the hot path of every force evaluation: no runtime type-checking wrapper (tests/physics check it)
def pair_gravity(
    positions: Float[Tensor, "batch bodies 3"], params: BodyParams, forces: bool
) -> tuple[Tensor | None, Float[Tensor, " batch"]]:
    """The mutual accelerations (None unless `forces`) and potential energy of the bodies, chunk by chunk
    of systems (`PAIR_CHUNK_BYTES`). Each system's arithmetic is the same whatever the chunk it lands in,
    so the results do not depend on the batch size."""
    x = positions.transpose(1, 2).contiguous()  # (B, 3, N), bodies last: each pair term is an (N, N) plane
    eps2 = (params.softening * params.softening).view(-1, 1, 1)
    masses = params.masses
    batch, chunk = positions.shape[0], systems_per_chunk(positions.shape[1], positions.dtype)
    chunks = [slice(i, i + chunk) for i in range(0, batch, chunk)] if batch > chunk else [slice(None)]
    differentiable = torch.is_grad_enabled() and any(
        t.requires_grad for t in (positions, masses, params.softening)
    )
    # Small batches: the out-of-place path (the same operations in the same order, so the same bits) skips
    # the scratch set-up, which costs more than it saves there (1 system of 3 bodies: 42 us against 56).
    small = 3 * batch * x.shape[-1] ** 2 * positions.element_size() <= SMALL_PAIR_BYTES
    if differentiable or small:
        if len(chunks) == 1:
            acc, potential = pair_terms_differentiable(x, masses, eps2, forces)
            return (acc.transpose(1, 2) if acc is not None else None), potential
        parts = [pair_terms_differentiable(x[c], masses[c], eps2[c], forces) for c in chunks]
        potential = torch.cat([p[1] for p in parts])
        acc = torch.cat([p[0] for p in parts]).transpose(1, 2) if forces else None
        return acc, potential
    acc = torch.empty_like(positions) if forces else None  # (B, N, 3), written chunk by chunk
    potential = positions.new_empty(batch)
    scratch = PairScratch.allocate(min(chunk, batch), x.shape[-1], x.dtype, x.device)
    if len(chunks) == 1:
        pair_terms_in_place(
            x, masses, eps2, scratch, acc.transpose(1, 2) if acc is not None else None, potential
        )
        return acc, potential
    for c in chunks:
        out = acc[c].transpose(1, 2) if acc is not None else None
        pair_terms_in_place(x[c], masses[c], eps2[c], scratch, out, potential[c])
    return acc, potential


class PairScratch(NamedTuple):
    """The pair tensors of one chunk, allocated once per force evaluation and reused by every chunk: fresh
    memory for every chunk slows the first pass over it several times (docs/nbody.md)."""

    separations: Float[Tensor, "chunk 3 bodies bodies"]
    distances: Float[Tensor, "chunk bodies bodies"]
    pairs: Float[Tensor, "chunk bodies bodies"]

    @classmethod
    @no_type_check
    def allocate(cls, chunk: int, bodies: int, dtype: torch.dtype, device: torch.device) -> PairScratch:
        def empty(*shape: int) -> Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        return cls(
            empty(chunk, 3, bodies, bodies), empty(chunk, bodies, bodies), empty(chunk, bodies, bodies)
        )

    @no_type_check
    def first(self, systems: int) -> PairScratch:
        return PairScratch(*(t[:systems] for t in self))


@no_type_check  # the hot path of every force evaluation: no runtime type-checking wrapper (tests/physics check it)
def pair_terms_in_place(
    x: Float[Tensor, "chunk 3 bodies"],
    m: Float[Tensor, "chunk bodies"],
    eps2: Tensor,
    scratch: PairScratch,
    acc: Float[Tensor, "chunk 3 bodies"] | None,
    potential: Float[Tensor, " chunk"],
) -> None:
    """`pair_terms_differentiable` when no gradient is asked for, operation for operation and bit for bit,
    writing into `acc` (None: no forces) and `potential` and overwriting `scratch` (a hot loop: no
    allocation of pair tensors)."""
    d, r2, pairs = scratch if x.shape[0] == scratch.distances.shape[0] else scratch.first(x.shape[0])
    torch.sub(x.unsqueeze(-2), x.unsqueeze(-1), out=d)  # d[c, k, i, j] = x_jk - x_ik
    dx, dy, dz = d[:, 0], d[:, 1], d[:, 2]  # not unbind, which is slow in inference mode
    torch.mul(dx, dx, out=r2)
    r2.add_(torch.mul(dy, dy, out=pairs))
    r2.add_(torch.mul(dz, dz, out=pairs)).add_(eps2)
    r2.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # finite powers; masked next
    inv_r = r2.rsqrt_()
    inv_r.diagonal(dim1=-2, dim2=-1).fill_(0.0)
    m_j_inv_r = torch.mul(inv_r, m.unsqueeze(1), out=pairs)
    torch.sum(m * m_j_inv_r.sum(2), 1, out=potential).mul_(-0.5)
    if acc is not None:
        w = m_j_inv_r.mul_(inv_r).mul_(inv_r)  # m_j / r_ij^3
        torch.sum(d.mul_(w.unsqueeze(1)), -1, out=acc)


@no_type_check  # the hot path of every force evaluation: no runtime type-checking wrapper (tests/physics check it)
def pair_terms_differentiable(
    x: Float[Tensor, "chunk 3 bodies"], m: Float[Tensor, "chunk bodies"], eps2: Tensor, forces: bool
) -> tuple[Tensor | None, Float[Tensor, " chunk"]]:
    """Accelerations (C, 3, N), bodies last, and potential energies (C,) of a chunk of systems:
    a_i = sum_j m_j d_ij / r_ij^3 and -1/2 sum_i m_i sum_j m_j / r_ij with d_ij = x_j - x_i,
    r_ij^2 = |d_ij|^2 + eps^2, the diagonal masked."""
    n = x.shape[-1]
    d = x.unsqueeze(-2) - x.unsqueeze(-1)  # (C, 3, N, N)
    r2 = d[:, 0] * d[:, 0] + d[:, 1] * d[:, 1] + d[:, 2] * d[:, 2] + eps2
    r2 = r2 + identity(n, x.dtype, x.device)  # finite powers and gradients on the diagonal; masked next
    inv_r = torch.rsqrt(r2) * off_diagonal(n, x.dtype, x.device)
    m_j_inv_r = inv_r * m.unsqueeze(1)
    potential = -0.5 * (m * m_j_inv_r.sum(2)).sum(1)
    if not forces:
        return None, potential
    w = m_j_inv_r * inv_r * inv_r
    return (d * w.unsqueeze(1)).sum(-1), potential


# --------------------------------------------------------------------------------------------------
# The compiled force evaluation (opt-in)

COMPILED_CHUNK = 128
"""Systems per call of the compiled force kernel: one fixed shape (one compilation per body count) and a
multiple of every vector width, so that each system is a vector lane doing the same arithmetic wherever it
sits in the batch (the last chunk is padded with copies of the batch's first system)."""


@no_type_check  # traced by torch.compile: no runtime type-checking wrapper
def systems_last_pair_gravity(x: Tensor, m: Tensor, eps2: Tensor) -> tuple[Tensor, Tensor]:
    """Accelerations (3, N, C) and potential energies (C,) of C systems laid out systems last: positions
    x (3, N, C), masses m (N, C), eps2 (C,). Same formulas as `pair_terms_differentiable`; compiled, the
    pair loop is one fused loop with the systems as the vector lanes."""
    n = x.shape[1]
    eye = torch.eye(n, dtype=x.dtype, device=x.device).unsqueeze(-1)
    d = x.unsqueeze(1) - x.unsqueeze(2)  # (3, N, N, C), d[k, i, j, c] = x_jk - x_ik
    r2 = d[0] * d[0] + d[1] * d[1] + d[2] * d[2] + eps2 + eye  # + eye: finite on the diagonal, masked next
    inv_r = torch.rsqrt(r2) * (1.0 - eye)
    m_j_inv_r = inv_r * m.unsqueeze(0)
    potential = -0.5 * (m * m_j_inv_r.sum(1)).sum(0)
    w = m_j_inv_r * inv_r * inv_r
    return (d * w.unsqueeze(0)).sum(2), potential


class CompiledGravity:
    """`gravity` through one torch.compile'd kernel per (body count, dtype, device, thread count), chunks of
    `COMPILED_CHUNK` systems laid out systems last; a drop-in for `gravity` (`composition_step`'s `forces`).

    Opt-in because its numbers are not `gravity`'s bit for bit: the fused loop rounds in another order
    (docs/nbody.md, "Batched throughput", has the measured difference and speed). Like `gravity`, a system's
    result does not depend on the batch it is in. Falls back to `gravity` when compilation fails (logged)
    and whenever a gradient is asked for. Compiling takes a few seconds on first use of each key.
    """

    def __init__(self) -> None:
        self.kernels: dict[tuple, Callable[..., tuple[Tensor, Tensor]] | None] = {}

    def __call__(self, positions: Float[Tensor, "batch bodies 3"], params: BodyParams) -> Gravity:
        if torch.is_grad_enabled() and any(
            t.requires_grad for t in (positions, params.masses, params.softening)
        ):
            return gravity(positions, params)
        key = (positions.shape[1], positions.dtype, positions.device, torch.get_num_threads())
        if key not in self.kernels:
            kernel = torch.compile(systems_last_pair_gravity, dynamic=False, fullgraph=True)
            try:
                result = self.evaluate(kernel, positions, params)
            except Exception as error:  # any compilation failure: eager from now on, logged
                first_line = str(error).strip().splitlines()[0] if str(error).strip() else ""
                log.warning(
                    "torch.compile of the N-body forces failed (%s: %s); eager forces",
                    type(error).__name__,
                    first_line,
                )
                self.kernels[key] = None
                return gravity(positions, params)
            self.kernels[key] = kernel
            return result
        kernel = self.kernels[key]
        if kernel is None:
            return gravity(positions, params)
        return self.evaluate(kernel, positions, params)

    @staticmethod
    def evaluate(
        kernel: Callable[..., tuple[Tensor, Tensor]], positions: Tensor, params: BodyParams
    ) -> Gravity:
        batch, bodies = positions.shape[:2]
        chunks = -(-batch // COMPILED_CHUNK)
        pad = chunks * COMPILED_CHUNK - batch

        def systems_last(t: Tensor) -> Tensor:
            """(B, ...) -> (chunks, ..., COMPILED_CHUNK), contiguous, padded with copies of system 0."""
            if pad:
                t = torch.cat([t, t[:1].expand(pad, *t.shape[1:])])
            t = t.reshape(chunks, COMPILED_CHUNK, *t.shape[1:])
            return t.permute(0, *range(2, t.dim()), 1).contiguous()

        x = systems_last(positions.transpose(1, 2))  # (K, 3, N, C)
        m = systems_last(params.masses)  # (K, N, C)
        eps2 = systems_last(params.softening * params.softening)  # (K, C)
        acc = positions.new_empty(chunks, 3, bodies, COMPILED_CHUNK)
        potential = positions.new_empty(chunks, COMPILED_CHUNK)
        for k in range(chunks):
            acc[k], potential[k] = kernel(x[k], m[k], eps2[k])
        acc = acc.permute(0, 3, 2, 1).reshape(-1, bodies, 3)[:batch]
        g = Gravity(acc, potential.reshape(-1)[:batch])
        if not params.has_external:
            return g
        external = external_gravity(positions, params)
        return Gravity(g.accelerations + external.accelerations, g.potential + external.potential)


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
    _, potential = pair_gravity(positions, params, forces=False)
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
    forces: Callable[[Tensor, BodyParams], Gravity] = gravity,
) -> StepResult:
    """One step of size dt (per system) of a leapfrog composition; costs `scheme.force_evaluations`.

    `current` holds the forces at `state.positions` (from the previous step or from `gravity`; a DKD step
    does not read them). A system with dt = 0 is left unchanged. `forces` evaluates them: `gravity`, or a
    `CompiledGravity` for large batches.
    """
    x, v = state
    g = current
    if scheme.ordering == "dkd":
        weights = scheme.weights
        for k, weight in enumerate(weights):
            h = (weight * dt).view(-1, 1, 1)
            drift = 0.5 * h if k == 0 else 0.5 * (weights[k - 1] * dt).view(-1, 1, 1) + 0.5 * h
            x = x + drift * v  # this substep's first half-drift merged with the last one's second
            g = forces(x, params)
            v = v + h * g.accelerations
        x = x + (0.5 * weights[-1] * dt).view(-1, 1, 1) * v
        return StepResult(BodyState(x, v), Gravity(g.accelerations, potential_energy(x, params)))
    for weight in scheme.weights:
        h = (weight * dt).view(-1, 1, 1)
        v = v + (0.5 * h) * g.accelerations
        x = x + h * v
        g = forces(x, params)
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
    forces: Callable[[Tensor, BodyParams], Gravity] = gravity,
) -> tuple[BodyState, list[BodyState]]:
    """`steps` fixed steps; returns the final state and the states every `save_every` steps (t = 0 first).
    `forces`: `gravity`, or a `CompiledGravity`."""
    scheme = scheme_named(scheme)
    dt_batch = torch.as_tensor(dt, dtype=state.positions.dtype, device=state.positions.device)
    dt_batch = dt_batch.expand(state.positions.shape[0])
    g = forces(state.positions, params)
    saved = [state]
    for n in range(1, steps + 1):
        state, g = composition_step(state, g, params, dt_batch, scheme, forces)
        if n % save_every == 0:
            saved.append(state)
        if on_step is not None:
            on_step(1)
    return state, saved


def orbital_period(semi_major_axis: float, total_mass: float) -> float:
    """Kepler's third law with G = 1: T = 2 pi sqrt(a^3 / M)."""
    return 2.0 * math.pi * math.sqrt(semi_major_axis**3 / total_mass)
