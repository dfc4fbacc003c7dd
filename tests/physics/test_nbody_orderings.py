"""Both leapfrog orderings (kick-drift-kick, drift-kick-drift) and their compositions against the analytic
Kepler orbit: convergence order, time reversibility, bounded energy error, and the selection by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.systems.nbody.control import FixedStep, Integrator
from dynaforge.systems.nbody.initial import kepler_analytic, kepler_orbit
from dynaforge.systems.nbody.physics import (
    BodyState,
    energy,
    fixed_step_rollout,
    gravity,
    make_params,
    orbital_period,
    potential_energy,
)
from dynaforge.systems.nbody.schemes import SCHEME_NAMES, SCHEMES, scheme_named

A, E, M1, M2, PHASE = 1.3, 0.5, 0.7, 0.4, 0.3
PERIOD = orbital_period(A, M1 + M2)


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def kepler(a: float = A, e: float = E, phase: float = PHASE, m1: float = M1, m2: float = M2):
    bodies = kepler_orbit(a, e, m1, m2, phase)
    state = BodyState(
        torch.tensor(bodies.positions, dtype=torch.float64)[None],
        torch.tensor(bodies.velocities, dtype=torch.float64)[None],
    )
    return state, make_params(torch.tensor(bodies.masses, dtype=torch.float64)[None])


def orbit_errors(scheme: str, steps: list[int]) -> np.ndarray:
    """Relative-position error after one orbit against the analytic orbit, for each steps-per-orbit."""
    exact, _ = kepler_analytic(A, E, M1, M2, np.asarray([PERIOD]), mean_anomaly=PHASE)
    errors = []
    for n in steps:
        state, params = kepler()
        final, _ = fixed_step_rollout(state, params, PERIOD / n, n, scheme)
        rel = (final.positions[0, 1] - final.positions[0, 0]).numpy()
        errors.append(np.linalg.norm(rel - exact[0]))
    return np.asarray(errors)


# Step counts in the asymptotic range of each order and above round-off (yoshida6 at 400 steps: ~1e-11).
ORDER_STEPS = {2: [400, 800, 1600], 4: [100, 200, 400], 6: [50, 100, 200]}


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_every_scheme_converges_at_its_order(name: str) -> None:
    scheme = SCHEMES[name]
    errors = orbit_errors(name, ORDER_STEPS[scheme.order])
    orders = np.log2(errors[:-1] / errors[1:])
    # Measured (float64, these step counts): within 0.12 of the nominal order for every scheme.
    np.testing.assert_allclose(orders, scheme.order, atol=0.2)


def test_the_orderings_are_different_methods() -> None:
    """Same order, different error constants: one orbit at 400 steps differs between KDK and DKD by far
    more than round-off."""
    kdk, dkd = orbit_errors("leapfrog", [400])[0], orbit_errors("leapfrog_dkd", [400])[0]
    assert abs(kdk - dkd) > 0.1 * min(kdk, dkd)


@pytest.mark.parametrize("name", SCHEME_NAMES)
def test_every_scheme_is_time_reversible(name: str) -> None:
    """Forward 200 steps, flip the velocities, forward 200 steps: back at the start to round-off."""
    state, params = kepler(e=0.8)
    forward, _ = fixed_step_rollout(state, params, PERIOD / 300, 200, name)
    back, _ = fixed_step_rollout(
        BodyState(forward.positions, -forward.velocities), params, PERIOD / 300, 200, name
    )
    moved = (forward.positions - state.positions).abs().max()
    assert moved > 0.1
    assert (back.positions - state.positions).abs().max() < 1e-11
    assert (back.velocities + state.velocities).abs().max() < 1e-11


@pytest.mark.parametrize("name", ["leapfrog_dkd", "yoshida4_dkd"])
def test_dkd_energy_error_is_bounded_and_scales_with_the_order(name: str) -> None:
    """Fixed dt on an e = 0.9 orbit: the largest energy error over 3 orbits is that of the first one
    (no drift), and halving dt divides it by 2^order."""
    order = SCHEMES[name].order
    worst = []
    for n in (600, 1200):
        state, params = kepler(a=1.0, e=0.9, phase=np.pi, m1=0.5, m2=0.5)
        period = orbital_period(1.0, 1.0)
        integrator = Integrator(params, FixedStep(period / n), name, reversible=False)
        run = integrator.advance(integrator.start(state), period)
        first = float(run.max_energy_error[0])
        run = integrator.advance(run, 3 * period)
        last = float(run.max_energy_error[0])
        assert last < 1.05 * first
        worst.append(first)
    # Measured: 1.98 (leapfrog_dkd), 3.83 (yoshida4_dkd, not quite asymptotic at 600 steps per orbit).
    assert np.log2(worst[0] / worst[1]) == pytest.approx(order, abs=0.25)


def test_dkd_step_reports_the_true_energy() -> None:
    """The energy the integrator tracks after a DKD step (potential_energy at the end positions) is the
    state's energy computed from scratch."""
    state, params = kepler(e=0.9)
    integrator = Integrator(params, FixedStep(0.01), "yoshida4_dkd", reversible=False)
    run = integrator.start(state)
    for _ in range(5):
        run, _ = integrator.step(run)
    e0, e5 = float(run.reference.energy), float(energy(run.state, params))
    assert abs(e5 - e0) / abs(e0) <= float(run.max_energy_error[0]) * (1 + 1e-9)
    assert abs(e5 - e0) > 0
    assert float(potential_energy(run.state.positions, params)) == pytest.approx(
        float(gravity(run.state.positions, params).potential), rel=1e-14
    )
    assert int(run.evaluations[0]) == 1 + 5 * 3


def test_bad_scheme_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="valid names: leapfrog, leapfrog_dkd"):
        scheme_named("yoshida5")
    with pytest.raises(ConfigError, match=r"system\.integrator=.yoshida5."):
        load_config("configs/nbody_tiny.yaml", ["system.integrator=yoshida5"])
    assert load_config("configs/nbody_tiny.yaml", ["system.integrator=yoshida4_dkd"]).system.integrator == (
        "yoshida4_dkd"
    )
