"""2D PDEs on the shared spectral core, checked against analytic solutions and convergence orders.

Linear problems are integrated exactly by the ETD step, so their tolerances are round-off (float64:
1e-10 absolute on O(1) fields after a few hundred steps). Nonlinear problems are checked by the order
of the time-stepping error against a fine-step reference: halving dt must divide the error by about
2^order (we accept a measured order within 0.35 of the scheme's, the usual pre-asymptotic slack).
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import SpectralSystem


@pytest.fixture(autouse=True)
def flush_denormals():
    """Decaying modes reach subnormal floats, which make CPU arithmetic ~100x slower; flush them to zero
    (changes results by < 1e-300 in float64) and restore the setting afterwards."""
    torch.set_flush_denormal(True)
    yield
    torch.set_flush_denormal(False)


def make(name: str, *overrides: str) -> SpectralSystem:
    return build_system(load_config(None, [f"system.name={name}", "system.dtype=float64", *overrides]).system)


def grid(n: int, length: float) -> tuple[torch.Tensor, torch.Tensor]:
    x = torch.arange(n, dtype=torch.float64) * length / n
    return torch.meshgrid(x, x, indexing="ij")


def params_of(system: SpectralSystem, batch: int = 1, **values: float) -> torch.Tensor:
    """A params table in the system's column order; unspecified columns take the range's low end."""
    row = [values.get(name, getattr(system.config, name).low) for name in system.parameter_names]
    return torch.tensor([row] * batch, dtype=torch.float64)


def test_heat_2d_decays_each_mode_exactly() -> None:
    length, nu, dt, steps = 2.0, 0.05, 0.01, 100
    system = make("heat", "system.ndim=2", "system.resolution=32", f"system.dt={dt}", f"system.steps={steps}")
    x, y = grid(32, length)
    kx, ky = 2 * math.pi * 3 / length, 2 * math.pi * 2 / length
    u0 = torch.sin(kx * x + 0.3) * torch.cos(ky * y) + 0.5  # modes (3, +-2) and the mean
    out = system.rollout(u0[None, None], params_of(system, domain_length=length, diffusivity=nu))
    t = dt * steps
    expected = (u0 - 0.5) * math.exp(-nu * (kx**2 + ky**2) * t) + 0.5
    torch.testing.assert_close(out.fields[0, -1, 0], expected, atol=1e-10, rtol=0)


def test_advection_2d_shifts_exactly() -> None:
    length, c, dt, steps = 1.0, 0.7, 0.01, 50
    system = make(
        "advection", "system.ndim=2", "system.resolution=32", f"system.dt={dt}", f"system.steps={steps}"
    )
    x, y = grid(32, length)

    def field(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return torch.sin(2 * math.pi * (x + 2 * y)) + 0.5 * torch.cos(2 * math.pi * 3 * (x - y) + 1.0)

    out = system.rollout(field(x, y)[None, None], params_of(system, domain_length=length, speed=c))
    shift = c * dt * steps  # along both axes
    torch.testing.assert_close(out.fields[0, -1, 0], field(x - shift, y - shift), atol=1e-10, rtol=0)


@pytest.mark.parametrize("drag", [0.0, 0.3])
def test_taylor_green_vortex_decays_at_the_analytic_rate(drag: float) -> None:
    """w = 2 cos(x) cos(y) on [0, 2 pi)^2 is an exact solution: w(t) = w(0) exp(-(2 nu + drag) t).

    Its nonlinear term vanishes analytically; numerically it is round-off, so the decay is exact to 1e-10.
    """
    nu, dt, steps = 0.02, 0.05, 100
    system = make("navier_stokes", "system.resolution=32", f"system.dt={dt}", f"system.steps={steps}")
    x, y = grid(32, 2 * math.pi)
    w0 = 2 * torch.cos(x) * torch.cos(y)
    out = system.rollout(w0[None, None], params_of(system, viscosity=nu, drag=drag))
    time = out.time[:, None, None]
    expected = w0[None] * torch.exp(-(2 * nu + drag) * time)
    torch.testing.assert_close(out.fields[0, :, 0], expected, atol=1e-10, rtol=0)


def test_navier_stokes_advection_term_matches_the_analytic_jacobian() -> None:
    """psi = sin x + sin 2y: w = sin x + 4 sin 2y, u = 2 cos 2y, v = -cos x, so -(u w_x + v w_y) = 6 cos x cos 2y."""
    system = make("navier_stokes", "system.resolution=32")
    x, y = grid(32, 2 * math.pi)
    w = torch.sin(x) + 4 * torch.sin(2 * y)
    ops = system.operators(params_of(system), torch.device("cpu"))
    assert ops.nonlinear is not None
    n = system.to_physical(ops.nonlinear_term(system.to_spectral(w[None, None])))
    torch.testing.assert_close(n[0, 0], 6 * torch.cos(x) * torch.cos(2 * y), atol=1e-11, rtol=0)


def test_kolmogorov_flow_relaxes_to_the_laminar_steady_state() -> None:
    """From rest, forcing -A k cos(k y) with viscosity and drag converges to w = -A k cos(k y) / (nu k^2 + drag).

    The shear flow has no advection, so the ETD step is exact; after t = 40 the transient is e^-40.
    """
    amplitude, nu, drag, n_f = 0.8, 0.05, 0.8, 2
    system = make(
        "navier_stokes",
        "system.resolution=32",
        "system.dt=0.2",
        "system.steps=200",
        "system.save_every=200",
        f"system.forcing_wavenumber={n_f}",
    )
    _, y = grid(32, 2 * math.pi)
    p = params_of(system, viscosity=nu, drag=drag, forcing_amplitude=amplitude)
    out = system.rollout(torch.zeros(1, 1, 32, 32, dtype=torch.float64), p)
    expected = -amplitude * n_f * torch.cos(n_f * y) / (nu * n_f**2 + drag)
    torch.testing.assert_close(out.fields[0, -1, 0], expected, atol=1e-10, rtol=0)


def test_navier_stokes_conserves_mean_vorticity_on_a_turbulent_field() -> None:
    system = make(
        "navier_stokes", "system.resolution=32", "system.steps=50", "system.initial.families={grf: 1.0}"
    )
    params, initial = system.draw_samples([np.random.default_rng(i) for i in range(2)])
    initial = initial + 0.3  # a non-zero mean
    out = system.rollout(initial, params)
    means = out.fields.mean(dim=(-1, -2))
    torch.testing.assert_close(means, means[:, :1].expand_as(means), atol=1e-12, rtol=0)
    assert out.fields[:, -1].std() > 0.1  # the field did not simply decay away


def measured_orders(system_name: str, overrides: list[str], dts: list[float], horizon: float) -> list[float]:
    """Orders log2(e(dt) / e(dt/2)) of the final-time error against a run with dt / 8 of the smallest."""
    fine = dts[-1] / 8
    base = make(system_name, *overrides, f"system.dt={fine}", "system.steps=1", "system.save_every=1")
    params, initial = base.draw_samples([np.random.default_rng(7)])

    def final(dt: float) -> torch.Tensor:
        steps = round(horizon / dt)
        system = make(
            system_name, *overrides, f"system.dt={dt}", f"system.steps={steps}", f"system.save_every={steps}"
        )
        return system.rollout(initial, params).fields[:, -1]

    reference = final(fine)
    errors = [float((final(dt) - reference).abs().max()) for dt in dts]
    return [math.log2(a / b) for a, b in itertools.pairwise(errors)]


@pytest.mark.parametrize("order", [2, 4])
def test_gray_scott_converges_at_the_scheme_order(order: int) -> None:
    overrides = ["system.resolution=32", f"system.order={order}"]
    orders = measured_orders("gray_scott", overrides, [2.0, 1.0, 0.5], horizon=10.0)
    assert all(abs(o - order) < 0.35 for o in orders), orders


def test_gray_scott_stays_bounded() -> None:
    system = make("gray_scott", "system.resolution=32", "system.steps=1000", "system.save_every=100")
    params, initial = system.draw_samples([np.random.default_rng(i) for i in range(2)])
    out = system.rollout(initial, params)
    u, v = out.fields[:, :, 0], out.fields[:, :, 1]
    assert torch.isfinite(out.fields).all()
    # The exact solution stays in [0, 1]; the spectral solution may undershoot by a few percent at the
    # steep fronts of the spots (Gibbs ringing at 32 points), never more.
    assert float(u.min()) > -0.1 and float(u.max()) < 1.1, (float(u.min()), float(u.max()))
    assert float(v.min()) > -0.1 and float(v.max()) < 1.1, (float(v.min()), float(v.max()))
    assert float(v[:, -1].max()) > 0.05  # the pattern survived (not washed out to the trivial state)


def test_ks2d_converges_at_fourth_order() -> None:
    overrides = ["system.resolution=32", "system.domain_length=20.0", "system.initial.families={grf: 1.0}"]
    orders = measured_orders("ks2d", overrides, [0.1, 0.05, 0.025], horizon=1.0)
    assert all(abs(o - 4) < 0.35 for o in orders), orders
