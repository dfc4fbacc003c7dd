"""Two-body Kepler orbits against the analytic solution; convergence orders of the integrators."""

from __future__ import annotations

import math
from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dynaforge.systems.nbody.control import ClassicalStep, FixedStep, Integrator
from dynaforge.systems.nbody.initial import kepler_analytic, kepler_orbit, orbital_elements
from dynaforge.systems.nbody.physics import BodyState, fixed_step_rollout, make_params, orbital_period


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    # Tiny tensors: a single thread avoids thread wake-up latency (large on a shared machine).
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def kepler_batch(a: float, e: float, m1: float, m2: float, phase: float = 0.0) -> tuple[BodyState, object]:
    bodies = kepler_orbit(a, e, m1, m2, phase)
    state = BodyState(
        torch.tensor(bodies.positions, dtype=torch.float64)[None],
        torch.tensor(bodies.velocities, dtype=torch.float64)[None],
    )
    return state, make_params(torch.tensor(bodies.masses, dtype=torch.float64)[None])


def relative(state: BodyState) -> tuple[np.ndarray, np.ndarray]:
    x = (state.positions[0, 1] - state.positions[0, 0]).numpy()
    v = (state.velocities[0, 1] - state.velocities[0, 0]).numpy()
    return x, v


def position_error(scheme: str, steps_per_orbit: int, a: float = 1.3, e: float = 0.5) -> float:
    """Relative-position error after one orbit, against the analytic orbit."""
    m1, m2 = 0.7, 0.4
    period = orbital_period(a, m1 + m2)
    state, params = kepler_batch(a, e, m1, m2, phase=0.3)
    final, _ = fixed_step_rollout(state, params, period / steps_per_orbit, steps_per_orbit, scheme)
    exact_x, _ = kepler_analytic(a, e, m1, m2, np.asarray([period]), mean_anomaly=0.3)
    return float(np.linalg.norm(relative(final)[0] - exact_x[0]))


def test_initial_state_matches_the_requested_elements() -> None:
    state, _ = kepler_batch(2.0, 0.7, 0.3, 0.9, phase=1.1)
    a, e = orbital_elements(*relative(state), 1.2)
    assert a == pytest.approx(2.0, rel=1e-13)
    assert e == pytest.approx(0.7, rel=1e-13)
    assert state.positions[0].T @ torch.tensor([0.3, 0.9], dtype=torch.float64) == pytest.approx(
        torch.zeros(3, dtype=torch.float64), abs=1e-15
    )


def test_orbit_follows_the_analytic_solution() -> None:
    a, e, m1, m2 = 1.0, 0.6, 0.5, 0.5
    period = orbital_period(a, m1 + m2)
    steps, save_every = 4000, 250
    state, params = kepler_batch(a, e, m1, m2)
    _, saved = fixed_step_rollout(state, params, period / steps, steps, "yoshida4", save_every)
    times = np.arange(len(saved)) * (period / steps) * save_every
    exact_x, exact_v = kepler_analytic(a, e, m1, m2, times)
    # Yoshida-4 at 4000 steps per orbit: truncation error ~1e-8 after one orbit (the order test checks how
    # it scales); a wrong force law or initial state would be off by 1e-2 or more.
    for k, frame in enumerate(saved):
        x, v = relative(frame)
        np.testing.assert_allclose(x, exact_x[k], rtol=0, atol=1e-7)
        np.testing.assert_allclose(v, exact_v[k], rtol=0, atol=1e-7)


def test_period_and_eccentricity_are_preserved() -> None:
    """Pericentre passages (relative y changes sign from - to + on the +x side) are one period apart,
    and the osculating eccentricity and semi-major axis stay put."""
    a, e, m1, m2 = 1.5, 0.8, 0.6, 0.3
    period = orbital_period(a, m1 + m2)
    steps_per_orbit = 2000
    state, params = kepler_batch(a, e, m1, m2, phase=math.pi)  # start at apocentre
    dt = period / steps_per_orbit
    _, saved = fixed_step_rollout(state, params, dt, 3 * steps_per_orbit, "yoshida4")
    rel = np.stack([relative(s)[0] for s in saved])
    vel = np.stack([relative(s)[1] for s in saved])
    crossings = np.flatnonzero((rel[:-1, 1] < 0) & (rel[1:, 1] >= 0) & (rel[1:, 0] > 0))
    # Linear interpolation of the crossing time between the two samples.
    times = (crossings + rel[crossings, 1] / (rel[crossings, 1] - rel[crossings + 1, 1])) * dt
    assert len(times) == 3
    np.testing.assert_allclose(np.diff(times), period, rtol=1e-6)
    a_t, e_t = orbital_elements(rel, vel, m1 + m2)
    assert np.abs(e_t - e).max() < 1e-4
    assert np.abs(a_t - a).max() / a < 1e-4


def test_leapfrog_is_second_order() -> None:
    errors = [position_error("leapfrog", n) for n in (400, 800, 1600)]
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    np.testing.assert_allclose(orders, 2.0, atol=0.1)


def test_yoshida_is_fourth_order() -> None:
    errors = [position_error("yoshida4", n) for n in (100, 200, 400)]
    orders = np.log2(np.asarray(errors[:-1]) / np.asarray(errors[1:]))
    np.testing.assert_allclose(orders, 4.0, atol=0.15)


def test_leapfrog_energy_error_is_bounded_and_second_order() -> None:
    """At fixed dt the energy error oscillates without drifting: the largest error over 10 orbits equals
    the largest over the first one, and it falls 4x when dt halves."""
    a, e, m1, m2 = 1.0, 0.5, 0.5, 0.5
    period = orbital_period(a, m1 + m2)
    worst = []
    for n in (200, 400):
        state, params = kepler_batch(a, e, m1, m2, phase=math.pi)
        integrator = Integrator(params, FixedStep(period / n), "leapfrog", reversible=False)
        run = integrator.advance(integrator.start(state), period)
        first = float(run.max_energy_error)
        run = integrator.advance(run, 10 * period)
        assert float(run.max_energy_error) == pytest.approx(first, rel=0.02)
        worst.append(first)
    assert worst[0] / worst[1] == pytest.approx(4.0, rel=0.05)


def test_reversible_step_recursion_keeps_the_energy_error_bounded() -> None:
    """With state-dependent steps, dt_n = h(y_n) lets the energy error drift; the time-symmetric recursion
    does not (Kepler e = 0.7, coarse classical steps, 5 vs 30 orbits)."""
    period = orbital_period(1.0, 1.0)
    growth = {}
    for reversible in (True, False):
        state, params = kepler_batch(1.0, 0.7, 0.5, 0.5, phase=math.pi)
        integrator = Integrator(params, ClassicalStep(0.1), "leapfrog", reversible=reversible)
        run = integrator.advance(integrator.start(state), 5 * period)
        early = float(run.max_energy_error)
        run = integrator.advance(run, 30 * period)
        growth[reversible] = float(run.max_energy_error) / early
    assert growth[True] < 1.05
    assert growth[False] > 2.5  # the drift grows about linearly in time (3.4x measured)


def test_leapfrog_energy_error_is_the_modified_energy_term() -> None:
    # Leapfrog at fixed h conserves H + h^2 H2 to O(h^4), so E_n - E_0 = -h^2 (H2(y_n) - H2(y_0)) up to
    # O(h^4): the controller's `log_error_timescale` feature rests on this (coefficients 1/12 and -1/24).
    from dynaforge.systems.nbody.control import leapfrog_error_term
    from dynaforge.systems.nbody.physics import energy, gravity

    state, params = kepler_batch(1.0, 0.8, 0.6, 0.4, phase=2.0)
    h = 0.004
    _, saved = fixed_step_rollout(state, params, h, 1600, "leapfrog", save_every=16)
    errors, predicted = [], []
    term_0 = leapfrog_error_term(state, gravity(state.positions, params), params).value
    for s in saved:
        errors.append(float(energy(s, params) - energy(state, params)))
        term = leapfrog_error_term(s, gravity(s.positions, params), params).value
        predicted.append(float(-(h**2) * (term - term_0)))
    errors_, predicted_ = np.asarray(errors), np.asarray(predicted)
    assert np.abs(errors_).max() > 1e-5  # a visible error, mostly from the pericentre passage
    assert np.abs(errors_ - predicted_).max() < 0.01 * np.abs(errors_).max()
