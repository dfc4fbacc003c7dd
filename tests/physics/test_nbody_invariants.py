"""Conservation laws, batching, and the initial-condition families of the N-body system."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import torch

from dynaforge.systems.nbody.control import ClassicalStep, Integrator
from dynaforge.systems.nbody.initial import (
    FIGURE_EIGHT_PERIOD,
    figure_eight,
    pair_potential,
    plummer_sphere,
    random_cluster,
    virial,
)
from dynaforge.systems.nbody.physics import (
    BodyState,
    drift_scales,
    fixed_step_rollout,
    gravity,
    invariants,
    make_params,
    relative_drifts,
)


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def clusters(count: int, bodies: int, softening: float, seed: int = 0) -> tuple[BodyState, object]:
    rng = np.random.default_rng(seed)
    drawn = [random_cluster(bodies, rng, 0.5, 1.5, 0.5, softening) for _ in range(count)]
    state = BodyState(
        torch.tensor(np.stack([b.positions for b in drawn]), dtype=torch.float64),
        torch.tensor(np.stack([b.velocities for b in drawn]), dtype=torch.float64),
    )
    masses = torch.tensor(np.stack([b.masses for b in drawn]), dtype=torch.float64)
    return state, make_params(masses, softening)


def test_forces_are_minus_the_gradient_of_the_potential() -> None:
    state, params = clusters(2, 5, 0.05)
    params = params._replace(
        external_mass=torch.tensor([0.0, 3.0], dtype=torch.float64),
        external_position=torch.tensor([[0.0, 0.0, 0.0], [2.0, -1.0, 0.5]], dtype=torch.float64),
        has_external=True,
    )
    x = state.positions.clone().requires_grad_(True)
    potential = gravity(x, params).potential.sum()
    (grad,) = torch.autograd.grad(potential, x)
    forces = gravity(state.positions, params).accelerations * params.masses.unsqueeze(-1)
    torch.testing.assert_close(forces, -grad, rtol=1e-12, atol=1e-12)


def test_momentum_and_angular_momentum_are_conserved_to_round_off() -> None:
    state, params = clusters(3, 8, 0.02)
    reference = invariants(state, params)
    scales = drift_scales(state, params, reference)
    final, _ = fixed_step_rollout(state, params, 1e-3, 300, "leapfrog")
    drifts = relative_drifts(invariants(final, params), reference, scales)
    assert float(drifts.momentum.max()) < 1e-13
    assert float(drifts.angular_momentum.max()) < 1e-13


def test_external_point_mass_conserves_energy_and_angular_momentum_about_it() -> None:
    """The perturber's pull changes the momentum but not the energy (its potential is included) nor the
    angular momentum about its position (a central force)."""
    state, params = clusters(2, 4, 0.05)
    params = params._replace(
        external_mass=torch.tensor([5.0, 5.0], dtype=torch.float64),
        external_position=torch.tensor([[3.0, 0.0, 0.0], [0.0, -2.5, 1.0]], dtype=torch.float64),
        has_external=True,
    )
    reference = invariants(state, params)
    scales = drift_scales(state, params, reference)
    final, _ = fixed_step_rollout(state, params, 1e-3, 500, "yoshida4")
    drifts = relative_drifts(invariants(final, params), reference, scales)
    assert float(drifts.angular_momentum.max()) < 1e-13
    assert float(drifts.energy.max()) < 1e-9  # Yoshida-4 truncation at this dt
    assert float(drifts.momentum.min()) > 1e-3  # the perturber does pull the cluster


def test_batched_and_single_system_runs_are_identical() -> None:
    """Each system's arithmetic does not depend on the others in the batch, bit for bit, with adaptive
    per-system steps too."""
    state, params = clusters(4, 6, 0.03, seed=3)
    batch = Integrator(params, ClassicalStep(0.02), "yoshida4")
    batched = batch.advance(batch.start(state), 0.5)
    for i in range(4):
        one_state = BodyState(state.positions[i : i + 1], state.velocities[i : i + 1])
        one_params = make_params(params.masses[i : i + 1], params.softening[i : i + 1])
        single = Integrator(one_params, ClassicalStep(0.02), "yoshida4")
        run = single.advance(single.start(one_state), 0.5)
        assert int(run.steps[0]) == int(batched.steps[i])
        assert torch.equal(run.state.positions[0], batched.state.positions[i])
        assert torch.equal(run.state.velocities[0], batched.state.velocities[i])


def test_plummer_sphere_is_in_virial_equilibrium_in_nbody_units() -> None:
    rng = np.random.default_rng(11)
    for softening in (0.0, 0.05):
        bodies = plummer_sphere(32, rng, softening)
        m = bodies.masses
        assert m.sum() == pytest.approx(1.0, abs=1e-15)
        np.testing.assert_allclose((m[:, None] * bodies.positions).sum(0), 0.0, atol=1e-15)
        np.testing.assert_allclose((m[:, None] * bodies.velocities).sum(0), 0.0, atol=1e-15)
        assert pair_potential(bodies.positions, m, 0.0) == pytest.approx(-0.5, rel=1e-12)
        kinetic = 0.5 * (m * (bodies.velocities**2).sum(1)).sum()
        assert 2 * kinetic == pytest.approx(-virial(bodies.positions, m, softening), rel=1e-12)


def test_figure_eight_returns_after_one_period() -> None:
    bodies = figure_eight()
    state = BodyState(
        torch.tensor(bodies.positions, dtype=torch.float64)[None],
        torch.tensor(bodies.velocities, dtype=torch.float64)[None],
    )
    params = make_params(torch.tensor(bodies.masses, dtype=torch.float64)[None])
    steps = 2000
    final, _ = fixed_step_rollout(state, params, FIGURE_EIGHT_PERIOD / steps, steps, "yoshida4")
    # The published initial conditions and period carry 8-9 digits.
    torch.testing.assert_close(final.positions, state.positions, rtol=0, atol=1e-6)
    torch.testing.assert_close(final.velocities, state.velocities, rtol=0, atol=1e-6)
