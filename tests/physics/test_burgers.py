"""Viscous Burgers against the Cole-Hopf solution, and the mean it conserves.

If phi > 0 solves the heat equation phi_t = nu phi_xx, then u = -2 nu phi_x / phi solves
u_t + u u_x = nu u_xx. With phi = a_0 + sum_m a_m exp(-nu k_m^2 t) cos(k_m x + theta_m) and
a_0 > sum |a_m|, phi stays positive and u is smooth, periodic and has zero mean.

u is analytic in a strip |Im x| < d, where d is the distance from the real axis to the nearest complex
zero of phi; its Fourier coefficients decay like exp(-d |k|). On L = 2 pi this gives the expected
spectral convergence under grid refinement; with ETDRK4 at dt = 1e-3 the time error (~dt^4) is far
below the finest spatial error.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

LENGTH = 2.0 * math.pi
VISCOSITY = 0.1
# phi = A0 + sum A_m exp(-nu m^2 t) cos(m x + theta_m) on L = 2 pi (so k_m = m); A0 - sum |A_m| = 0.2 > 0.
A0 = 1.0
PHI_MODES = ((1, 0.5, 0.0), (2, 0.3, 0.4))
T_END = 1.0


def cole_hopf(x: torch.Tensor, t: float, viscosity: float = VISCOSITY) -> torch.Tensor:
    """u = -2 nu phi_x / phi for the phi above, float64."""
    phi = torch.full_like(x, A0)
    phi_x = torch.zeros_like(x)
    for m, a, theta in PHI_MODES:
        decay = a * math.exp(-viscosity * m * m * t)
        phi = phi + decay * torch.cos(m * x + theta)
        phi_x = phi_x - decay * m * torch.sin(m * x + theta)
    return -2.0 * viscosity * phi_x / phi


def burgers_error(resolution: int, dt: float, order: int = 4) -> float:
    """Max error at T_END of a float64 run started from the exact solution at t = 0."""
    steps = round(T_END / dt)
    system = system_from_overrides(
        "burgers",
        resolution=resolution,
        dt=dt,
        steps=steps,
        save_every=steps,
        order=order,
        dtype="float64",
    )
    x = grid(resolution, LENGTH)
    params = parameter_table(system, [{"domain_length": LENGTH, "viscosity": VISCOSITY}])
    final = system.rollout(cole_hopf(x, 0.0).view(1, 1, -1), params).fields[0, -1, 0]
    return (final - cole_hopf(x, T_END)).abs().max().item()


def test_cole_hopf_spectral_convergence_in_space() -> None:
    errors = [burgers_error(n, dt=1e-3) for n in (16, 32, 64, 128)]
    # Spectral convergence: every doubling of the grid must cut the error by far more than an algebraic
    # method would (10x; measured when written: 8e-4, 6e-6, 8e-11, 2e-15). On the finest grid the error
    # must be at float64 round-off level: 1e-12 is ~1e4 ulp of u (~0.3) accumulated over 1000 steps, and
    # still ~80x below the 64-point error.
    for coarse, fine in itertools.pairwise(errors):
        assert fine < coarse / 10, f"no spectral convergence: errors {errors}"
    assert errors[-1] < 1e-12, f"errors {errors}"


@pytest.mark.parametrize("order", [2, 4])
def test_cole_hopf_convergence_in_time(order: int) -> None:
    # N = 128 resolves the solution to round-off (test above), so what is left is the time error, which
    # must fall as dt^order. The slope measured between dt = 0.05 and 0.0125 (errors 4e-6..2e-7 for order
    # 2, 1e-9..4e-12 for order 4, all far above round-off) may differ from the order only through the next
    # error term, O(dt) relative: 0.15 allows that and still rejects a scheme one order lower.
    dts = (0.05, 0.025, 0.0125)
    errors = [burgers_error(128, dt=dt, order=order) for dt in dts]
    slope = math.log(errors[0] / errors[-1]) / math.log(dts[0] / dts[-1])
    assert abs(slope - order) < 0.15, f"order {order}: slope {slope:.2f}, errors {errors}"
