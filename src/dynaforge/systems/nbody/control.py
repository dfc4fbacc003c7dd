"""Step-size control for the batched N-body integrators, and the loop that runs them.

Controllers map a system's state to a step proposal h(y) (per system):
- `FixedStep`: h = dt.
- `ClassicalStep`: h = eta * min_i tau_i, tau_i = min(min_j s_ij / |v_j - v_i|, sqrt(min_j s_ij / |a_i|)),
  s_ij = sqrt(|x_j - x_i|^2 + eps^2): the shortest fly-by and free-fall times over bodies (a_i includes
  the external pull; the current forces come free from the previous step).
- a learned controller (`dynaforge.models.step_controller.LearnedStep`): h = scale * T0 * exp(net(features)),
  a trained network reading the permutation-invariant features of `controller_features`. Simulators never
  import it: a caller that loads one hands it to `NBody` or to `Integrator` (the `StepController` protocol).

How a proposal becomes a step matters. Leapfrog and its compositions are symplectic only at fixed dt; a
step that changes with the state breaks that, and dt_n = h(y_n) lets the energy error drift. With
`reversible=True` the loop uses the explicit time-symmetric recursion (Hairer, Lubich & Wanner, Geometric
Numerical Integration, VIII.3.2)

    1 / dt_(n+1/2) = 2 / h(y_n) - 1 / dt_(n-1/2),        1 / dt_(1/2) = 1 / h(y_0),

which makes the whole run time-reversible when h is even in the velocities (all features here are), so
the energy error stays bounded like at fixed dt, without any extra force evaluation. A guard keeps
dt <= 2 h(y_n). A controller with history, a dt_max cap hit in mid-run, and the shortened step that lands
on an output time are not symmetric; the first two still follow the recursion.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple, Protocol, runtime_checkable

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import ConfigError, StepControlConfig
from dynaforge.systems.nbody.physics import (
    BodyParams,
    BodyState,
    DriftScales,
    Gravity,
    Invariants,
    composition_step,
    drift_scales,
    gravity,
    invariants,
    kinetic_energy,
    pair_separations,
)
from dynaforge.systems.nbody.schemes import Composition, scheme_named

FEATURE_NAMES = (
    "log_classical_timescale",  # log(tau_classical / T0), the classical criterion's time scale
    "log_min_distance",  # log(soft min_ij s_ij / L0); "closest pair" below: the soft closest pair
    "log_mean_distance",  # log(mean_ij s_ij / L0)
    "log_closest_pair_speed",  # log(|v_j - v_i| / V0) of the closest pair
    "log_max_acceleration",  # log(max_i |a_i| / A0)
    "log_mean_acceleration",  # log(mean_i |a_i| / A0)
    "log_min_freefall_time",  # log(min_ij sqrt(s_ij^3 / (m_i + m_j)) / T0)
    "log_closest_pair_mass",  # log((m_i + m_j) / M) of the closest pair
    "closest_pair_alignment",  # |cos| of the angle between x_j - x_i and v_j - v_i, closest pair
    "softening_fraction",  # eps / min_ij s_ij
    "log_kinetic_energy",  # log(K / (M V0^2))
    "closest_pair_eccentricity",  # e of the closest pair's two-body orbit (clamped to [0, 3])
    "log_closest_pair_pericentre_ratio",  # log(s / q), q the pericentre of that orbit (clamped to [0, 20])
    "log_softmin_body_timescale",  # log(softmin_i tau_i / T0), tau_i the classical time scale of body i
    "log_mean_body_timescale",  # mean_i log(tau_i / T0)
    "log_error_timescale",  # log(tau_H / T0), tau_H = sqrt(M V0^2 / |H2|) (see `leapfrog_error_term`)
    "error_term_sign",  # H2 / (|vHv| / 12 + F^2 / 24): where the leapfrog energy error swings
    "log_closest_pair_apsis_ratio",  # log(Q / q) = log((1 + e) / (1 - e)) of that orbit (e clamped to 0.999)
    "closest_pair_orbit_phase",  # log(s / q) / log(Q / q) in [0, 1]: 0 at pericentre, 1 at apocentre
)
CLASSICAL_FEATURE = 0
TINY = 1e-12  # floor (relative to the scale) of speeds and accelerations inside logarithms
SOFTMIN_SHARPNESS = 4.0  # of the soft minima over bodies (log-sum-exp of -4 log tau_i) and over pairs
FAR = 1e60  # stands for the distance of a body to itself, so minima skip it (its cube stays finite)
BOUND_ECCENTRICITY = 0.999  # the apsis features treat a closest pair with e above this as e = 0.999


# --------------------------------------------------------------------------------------------------
# Scales and features


class Scales(NamedTuple):
    """A system's length, velocity, acceleration and time scales, fixed at t = 0.

    From the conserved total energy E0 and mass M: L0 = M^2 / (4 |E0|) (the virial radius: 1 in N-body
    units, 2a for an equal-mass Kepler orbit), V0 = sqrt(M / L0), A0 = M / L0^2, T0 = L0 / V0. They do not
    depend on where on its orbit a system starts. An unbound system (E0 >= 0) uses its mass-weighted rms
    radius as L0.
    """

    length: Float[Tensor, " batch"]
    velocity: Float[Tensor, " batch"]
    acceleration: Float[Tensor, " batch"]
    time: Float[Tensor, " batch"]


def system_scales(state: BodyState, params: BodyParams, potential: Tensor | None = None) -> Scales:
    if potential is None:
        potential = gravity(state.positions, params).potential
    m = params.masses
    total = m.sum(1)
    e0 = kinetic_energy(state.velocities, m) + potential
    centre = (m.unsqueeze(-1) * state.positions).sum(1, keepdim=True) / total.view(-1, 1, 1)
    rms = torch.sqrt((m * ((state.positions - centre) ** 2).sum(-1)).sum(1) / total)
    bound = e0 < 0
    length = torch.where(bound, total**2 / (4.0 * e0.abs().clamp_min(1e-300)), rms)
    velocity = torch.sqrt(total / length)
    return Scales(length, velocity, total / length**2, length / velocity)


class PairView(NamedTuple):
    distance: Float[Tensor, "batch bodies bodies"]
    """Softened distance s_ij, FAR on the diagonal."""
    speed: Float[Tensor, "batch bodies bodies"]
    """Relative speed |v_j - v_i|."""
    radial: Float[Tensor, "batch bodies bodies"]
    """|(x_j - x_i) . (v_j - v_i)|."""


def pair_view(state: BodyState, params: BodyParams) -> PairView:
    d = pair_separations(state.positions)
    w = pair_separations(state.velocities)
    n = d.shape[1]
    eye = torch.eye(n, dtype=d.dtype, device=d.device)
    distance = torch.sqrt((d * d).sum(-1) + (params.softening**2).view(-1, 1, 1) + eye) + FAR * eye
    speed = torch.sqrt((w * w).sum(-1) + eye)  # + eye: no sqrt(0) on the diagonal (its gradient is inf)
    return PairView(distance, speed, (d * w).sum(-1).abs())


def body_timescales(
    pairs: PairView, accelerations: Float[Tensor, "batch bodies 3"], floor: Tensor
) -> Float[Tensor, "batch bodies"]:
    """tau_i = min(min_j s_ij / |v_ij|, sqrt(min_j s_ij / |a_i|)); `floor` (batch,) bounds |v| and |a| below."""
    fly_by = (pairs.distance / torch.maximum(pairs.speed, floor.view(-1, 1, 1))).amin(2)
    nearest = pairs.distance.amin(2)
    magnitude = torch.sqrt((accelerations * accelerations).sum(-1) + floor.view(-1, 1) ** 2)
    free_fall = torch.sqrt(nearest / magnitude)
    return torch.minimum(fly_by, free_fall)


def classical_timescale(
    pairs: PairView, accelerations: Float[Tensor, "batch bodies 3"], floor: Tensor
) -> Float[Tensor, " batch"]:
    """min_i tau_i (see `body_timescales`)."""
    return body_timescales(pairs, accelerations, floor).amin(1)


class ErrorTerm(NamedTuple):
    """Pieces of leapfrog's leading modified-energy term H2 = vHv / 12 - F^2 / 24 (per system)."""

    hessian: Float[Tensor, " batch"]
    """vHv = sum_(i<j) m_i m_j (|w_ij|^2 / s_ij^3 - 3 (d_ij . w_ij)^2 / s_ij^5), the potential's Hessian
    applied twice to the velocities (d_ij, w_ij the relative position and velocity)."""
    force: Float[Tensor, " batch"]
    """F^2 = sum_i m_i |a_i|^2."""

    @property
    def value(self) -> Tensor:
        return self.hessian / 12.0 - self.force / 24.0


def leapfrog_error_term(state: BodyState, current: Gravity, params: BodyParams) -> ErrorTerm:
    """Kick-drift-kick leapfrog at step h conserves H + h^2 H2 + O(h^4), so the energy error at a state is
    about -h^2 (H2(y) - H2(y0)); H2 (this) is even in the velocities and permutation invariant. (The
    external perturber's Hessian is left out: it only enters through F^2.)"""
    d = pair_separations(state.positions)
    w = pair_separations(state.velocities)
    n = d.shape[1]
    eye = torch.eye(n, dtype=d.dtype, device=d.device)
    r2 = (d * d).sum(-1) + (params.softening**2).view(-1, 1, 1) + eye
    inv = torch.rsqrt(r2) * (1.0 - eye)
    m = params.masses
    pair_mass = m.unsqueeze(1) * m.unsqueeze(2)
    radial = (d * w).sum(-1)
    hessian = 0.5 * (pair_mass * ((w * w).sum(-1) * inv**3 - 3.0 * radial**2 * inv**5)).sum((1, 2))
    force = (m * (current.accelerations**2).sum(-1)).sum(1)
    return ErrorTerm(hessian, force)


def controller_features(
    state: BodyState, current: Gravity, params: BodyParams, scales: Scales
) -> Float[Tensor, "batch features"]:
    """The learned controller's inputs, `FEATURE_NAMES` in order.

    All are invariant under permutations of the bodies, dimensionless (scaled by the initial scales) and
    even in the velocities (so a controller reading them keeps the reversible recursion symmetric).
    """
    pairs = pair_view(state, params)
    m = params.masses
    batch, n = m.shape
    L0, V0, A0, T0 = (s.view(-1, 1) for s in scales)
    off_diagonal = 1.0 - torch.eye(n, dtype=m.dtype, device=m.device)
    acc = torch.sqrt((current.accelerations**2).sum(-1) + (TINY * A0) ** 2)  # (B, N)
    log_tau_i = torch.log(body_timescales(pairs, current.accelerations, TINY * V0.view(-1)) / T0)  # (B, N)
    # The "closest pair" is a soft one: pair quantities averaged with weights softmax(-k log s_ij), so the
    # features stay continuous when another pair becomes the closest (the reversible recursion wants a
    # smooth h(y)); with one pair (Kepler) it is that pair.
    log_distance = torch.log(pairs.distance).reshape(batch, n * n)
    weight = torch.softmax(-SOFTMIN_SHARPNESS * log_distance, dim=1)  # FAR on the diagonal: weight 0
    s_min = torch.exp((weight * log_distance).sum(1, keepdim=True))
    s_mean = (pairs.distance * off_diagonal).sum((1, 2)).view(-1, 1) / (n * (n - 1))
    log_speed = torch.log(pairs.speed.clamp_min(TINY)).reshape(batch, n * n)
    speed = torch.exp((weight * log_speed).sum(1, keepdim=True))
    pair_mass = (m.unsqueeze(1) + m.unsqueeze(2)).reshape(batch, n * n)
    free_fall = torch.sqrt(pairs.distance**3 / (m.unsqueeze(1) + m.unsqueeze(2))).reshape(batch, n * n)
    cosine = pairs.radial / (pairs.distance * pairs.speed.clamp_min(TINY))
    alignment = (weight * cosine.reshape(batch, n * n)).sum(1, keepdim=True)
    kinetic = kinetic_energy(state.velocities, m).view(-1, 1)
    total = m.sum(1, keepdim=True)
    close_mass = (weight * pair_mass).sum(1, keepdim=True)
    eccentricity, pericentre = pair_orbit(s_min, speed, alignment.clamp(0.0, 1.0), close_mass)
    log_pericentre_ratio = torch.log(s_min / pericentre.clamp_min(s_min * math.exp(-20.0))).clamp(0.0, 20.0)
    bound_e = eccentricity.clamp(0.0, BOUND_ECCENTRICITY)
    log_apsis_ratio = torch.log((1.0 + bound_e) / (1.0 - bound_e))
    term = leapfrog_error_term(state, current, params)
    swing = (term.hessian.abs() / 12.0 + term.force / 24.0).view(-1, 1)
    energy_scale = total * V0**2
    error_time = torch.sqrt(energy_scale / (term.value.abs().view(-1, 1) + TINY * energy_scale / T0**2))
    columns = [
        log_tau_i.amin(1, keepdim=True),
        torch.log(s_min / L0),
        torch.log(s_mean / L0),
        torch.log(speed.clamp_min(TINY * V0) / V0),
        torch.log(acc.amax(1, keepdim=True) / A0),
        torch.log(acc.mean(1, keepdim=True) / A0),
        torch.log(free_fall.amin(1, keepdim=True) / T0),
        torch.log(close_mass / total),
        alignment.clamp(0.0, 1.0),
        params.softening.view(-1, 1) / s_min,
        torch.log(kinetic.clamp_min(TINY * total * V0**2) / (total * V0**2)),
        eccentricity.clamp(0.0, 3.0),
        log_pericentre_ratio,
        -torch.logsumexp(-SOFTMIN_SHARPNESS * log_tau_i, dim=1, keepdim=True) / SOFTMIN_SHARPNESS,
        log_tau_i.mean(1, keepdim=True),
        torch.log(error_time / T0),
        term.value.view(-1, 1) / swing.clamp_min(TINY * energy_scale / T0**2),
        log_apsis_ratio,
        (log_pericentre_ratio / log_apsis_ratio.clamp_min(1e-3)).clamp(0.0, 1.0),
    ]
    return torch.cat(columns, dim=1)


def pair_orbit(distance: Tensor, speed: Tensor, alignment: Tensor, mass: Tensor) -> tuple[Tensor, Tensor]:
    """Eccentricity and pericentre distance of a two-body orbit from its (softened) separation s, relative
    speed v, |cos| of the angle between them and total mass mu: with h^2 = s^2 v^2 (1 - cos^2) and specific
    energy eps = v^2 / 2 - mu / s, e = sqrt(1 + 2 eps h^2 / mu^2) and q = h^2 / (mu (1 + e))."""
    h2 = (distance * speed) ** 2 * (1.0 - alignment**2).clamp_min(0.0)
    energy = 0.5 * speed**2 - mass / distance
    e2 = (1.0 + 2.0 * energy * h2 / mass**2).clamp_min(1e-30)  # floor: sqrt stays differentiable
    eccentricity = torch.sqrt(e2)
    return eccentricity, h2 / (mass * (1.0 + eccentricity))


# --------------------------------------------------------------------------------------------------
# Controllers


class ControlContext(NamedTuple):
    """What a controller carries through a run: the initial scales and (learned) the feature history."""

    scales: Scales
    history: Tensor | None = None  # (B, K, F), most recent first
    features: Tensor | None = None  # (B, F), a learned controller's inputs at the state of its last proposal


@runtime_checkable
class StepController(Protocol):
    def init(self, state: BodyState, current: Gravity, params: BodyParams) -> ControlContext: ...

    def step_size(
        self, state: BodyState, current: Gravity, params: BodyParams, context: ControlContext
    ) -> tuple[Tensor, ControlContext]: ...


class MemorylessStep:
    """A controller whose context is the initial scales alone (no history: `FixedStep`, `ClassicalStep`):
    a proposal from the state and one coefficient (a number, or (batch,) for one per system)."""

    def __init__(self, coefficient: float | Tensor) -> None:
        self.coefficient = coefficient

    def init(self, state: BodyState, current: Gravity, params: BodyParams) -> ControlContext:
        return ControlContext(system_scales(state, params, current.potential))

    def step_size(
        self, state: BodyState, current: Gravity, params: BodyParams, context: ControlContext
    ) -> tuple[Tensor, ControlContext]:
        return self.proposal(state, current, params, context.scales), context

    def proposal(self, state: BodyState, current: Gravity, params: BodyParams, scales: Scales) -> Tensor:
        """h per system (batch,)."""
        raise NotImplementedError


class FixedStep(MemorylessStep):
    """h = dt for every system (`dt`, the coefficient, a number or (batch,) for one step size per system)."""

    def proposal(self, state: BodyState, current: Gravity, params: BodyParams, scales: Scales) -> Tensor:
        x = state.positions
        dt = torch.as_tensor(self.coefficient, dtype=x.dtype, device=x.device)
        return dt.expand(x.shape[0])


class ClassicalStep(MemorylessStep):
    """h = eta * classical time scale (see the module docstring); eta (the coefficient) a number or
    (batch,)."""

    def proposal(self, state: BodyState, current: Gravity, params: BodyParams, scales: Scales) -> Tensor:
        floor = TINY * scales.velocity
        tau = classical_timescale(pair_view(state, params), current.accelerations, floor)
        return self.coefficient * tau


def build_controller(config: StepControlConfig, dt: float, device: str = "cpu") -> StepController:
    if config.kind == "fixed":
        return FixedStep(dt)
    if config.kind == "adaptive":
        return ClassicalStep(config.eta)
    raise ConfigError(
        "system.control.kind=learned: a learned controller is loaded by the caller "
        "(`dynaforge.models.loading.controller_for`) and handed to the system"
    )


# --------------------------------------------------------------------------------------------------
# The run loop


class RunState(NamedTuple):
    """Everything a batched run carries from one step to the next."""

    state: BodyState
    gravity: Gravity
    time: Float[Tensor, " batch"]
    inverse_step: Float[Tensor, " batch"]
    """1 / dt of the last step (the reversible recursion's memory); 0 before the first step."""
    context: ControlContext
    steps: Tensor  # (B,) int64
    evaluations: Tensor  # (B,) int64, force evaluations (the initial one included)
    reference: Invariants
    drift_scales: DriftScales
    max_energy_error: Float[Tensor, " batch"]


class StepInfo(NamedTuple):
    dt: Float[Tensor, " batch"]
    """The step taken (0 for systems already at their end time)."""
    proposal: Float[Tensor, " batch"]
    """The controller's h(y_n)."""
    energy_error: Float[Tensor, " batch"]
    """|E_(n+1) - E_0| / |E_0| after the step."""


class Integrator:
    """Steps a batch of systems, each with its own controller-chosen step (see the module docstring)."""

    def __init__(
        self,
        params: BodyParams,
        controller: StepController,
        scheme: Composition | str = "leapfrog",
        reversible: bool = True,
        dt_max: float | None = None,
        forces: Callable[[Tensor, BodyParams], Gravity] = gravity,
    ) -> None:
        self.params = params
        self.controller = controller
        self.scheme = scheme_named(scheme)
        self.reversible = reversible
        self.dt_max = dt_max
        self.forces = forces  # `gravity`, or a `CompiledGravity` (system.forces: compiled)

    def start(self, state: BodyState) -> RunState:
        g = self.forces(state.positions, self.params)
        reference = invariants(state, self.params, g.potential)
        batch = state.positions.shape[0]
        zeros = torch.zeros(batch, dtype=state.positions.dtype, device=state.positions.device)
        counts = torch.zeros(batch, dtype=torch.int64, device=state.positions.device)
        return RunState(
            state=state,
            gravity=g,
            time=zeros,
            inverse_step=zeros,
            context=self.controller.init(state, g, self.params),
            steps=counts,
            evaluations=counts + 1,
            reference=reference,
            drift_scales=drift_scales(state, self.params, reference),
            max_energy_error=zeros,
        )

    def step(self, run: RunState, t_end: Tensor | float = float("inf")) -> tuple[RunState, StepInfo]:
        """One step of every system that has not reached `t_end` (a number or (batch,))."""
        h, context = self.controller.step_size(run.state, run.gravity, self.params, run.context)
        if self.dt_max is not None:
            h = h.clamp_max(self.dt_max)
        if self.reversible:
            first = run.steps == 0
            inverse = torch.where(first, 1.0 / h, 2.0 / h - run.inverse_step)
            inverse = torch.maximum(inverse, 0.5 / h)  # guard: dt <= 2 h
        else:
            inverse = 1.0 / h
        remaining = torch.as_tensor(t_end, dtype=h.dtype, device=h.device) - run.time
        active = remaining > 1e-13 * torch.clamp(run.time.abs(), min=1.0)
        dt = torch.where(active, torch.minimum(1.0 / inverse, remaining), torch.zeros_like(h))
        state, g = composition_step(run.state, run.gravity, self.params, dt, self.scheme, self.forces)
        total = kinetic_energy(state.velocities, self.params.masses) + g.potential
        error = (total - run.reference.energy).abs() / run.drift_scales.energy
        counted = active.to(torch.int64)
        run = run._replace(
            state=state,
            gravity=g,
            time=run.time + dt,
            inverse_step=torch.where(active, inverse, run.inverse_step),
            context=context,
            steps=run.steps + counted,
            evaluations=run.evaluations + counted * self.scheme.force_evaluations,
            max_energy_error=torch.where(
                active, torch.maximum(run.max_energy_error, error), run.max_energy_error
            ),
        )
        return run, StepInfo(dt, h, error)

    def advance(
        self,
        run: RunState,
        t_end: Tensor | float,
        max_steps: int = 10_000_000,
        on_step: Callable[[RunState, StepInfo], None] | None = None,
    ) -> RunState:
        """Step until every system reaches `t_end` (the last step is shortened to land on it) or has taken
        `max_steps` steps in total."""
        target = torch.as_tensor(t_end, dtype=run.time.dtype, device=run.time.device)
        while True:
            remaining = target - run.time
            active = (remaining > 1e-13 * torch.clamp(run.time.abs(), min=1.0)) & (run.steps < max_steps)
            if not bool(active.any()):
                return run
            run, info = self.step(run, torch.where(active, target, run.time))
            if on_step is not None:
                on_step(run, info)


def rollout_to_times(
    state: BodyState,
    params: BodyParams,
    controller: StepController,
    times: Sequence[float],
    scheme: Composition | str = "leapfrog",
    on_step: Callable[[int], None] | None = None,
    reversible: bool = True,
    max_steps: int = 10_000_000,
    forces: Callable[[Tensor, BodyParams], Gravity] = gravity,
) -> list[BodyState]:
    """States at each of `times` (increasing), stepping with `controller` and landing exactly on each."""
    integrator = Integrator(params, controller, scheme, reversible, forces=forces)
    run = integrator.start(state)
    saved = []
    for t in times:
        before = int(run.steps.max())
        run = integrator.advance(run, t, max_steps)
        if on_step is not None:
            on_step(int(run.steps.max()) - before)
        saved.append(run.state)
    return saved
