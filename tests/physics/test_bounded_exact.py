"""Exact time stepping of `heat_bounded` (`time_stepping: exact`, `systems/bounded/exact.py`) against exact
solutions of the heat equation, and against its own Runge-Kutta scheme as dt -> 0.

With no time error, what is left is the second-order difference Laplacian's: the max-norm error at the final
time on n = 17, 33, 65 nodes per axis must fall at order 2 (within 0.2) over both refinements, for
- constant boundary values: u = l(x) + sum of two decaying products of the sides' own eigenfunctions
  (sin(pi s), sin(pi s / 2), cos(pi s), cos(pi s / 2) and their overtones: u = 0 or du/dn = 0 on each side),
  l = 1 + x / 2 in 1D (u = l on a Dirichlet side, du/dn = -1/2 or 1/2 on a Neumann one), l = 1 in 2D;
- a boundary value oscillating in time: Stokes' second problem on [0, 1], u(0, t) = sin(w t), u = 0 or
  du/dn = 0 at x = 1, whose periodic state Im(e^{i w t} X(x)), X = sinh(z (1 - x)) / sinh(z) or
  cosh(z (1 - x)) / cosh(z), z = (1 + i) sqrt(w / (2 nu)), is the solution from its own value at t = 0
  (in 2D the same in x, insulated at y = 0 and 1).
Measured (float64): orders 1.99-2.03 in every case (run with -s to see them), the file 12-20 s on a 2-core machine.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from dynaforge.config.base import Range
from dynaforge.systems.bounded.chebyshev import unit_nodes
from dynaforge.systems.bounded.heat import HeatBounded, HeatBoundedConfig
from dynaforge.systems.bounded.system import BoundaryConfig, SideConfig

NU = 0.2
T_END = 0.1
RESOLUTIONS = (17, 33, 65)
ORDER_TOLERANCE = 0.2
SIDE_NAMES = ("left", "right", "bottom", "top")

EIGENFUNCTIONS = {
    # (low kind, high kind): (first, overtone) as (function of s, wavenumber)
    ("dirichlet", "dirichlet"): ((np.sin, 1.0), (np.sin, 3.0)),
    ("neumann", "neumann"): ((np.cos, 1.0), (np.cos, 2.0)),
    ("dirichlet", "neumann"): ((np.sin, 0.5), (np.sin, 1.5)),
    ("neumann", "dirichlet"): ((np.cos, 0.5), (np.cos, 1.5)),
}
"""On [0, 1], f(k pi s) with u = 0 at a Dirichlet end and du/ds = 0 at a Neumann end."""

BOUNDARIES = {
    1: [
        ("dirichlet", "dirichlet"),
        ("neumann", "neumann"),
        ("dirichlet", "neumann"),
        ("neumann", "dirichlet"),
    ],
    2: [
        ("dirichlet",) * 4,
        ("neumann",) * 4,
        ("dirichlet", "neumann", "neumann", "dirichlet"),
        ("neumann", "dirichlet", "dirichlet", "dirichlet"),
    ],
}


def heat(
    ndim: int, n: int, sides: dict[str, SideConfig], t_end: float = T_END, **extra: object
) -> HeatBounded:
    config = HeatBoundedConfig(
        ndim=ndim,
        resolution=n,
        dt=t_end / 4,
        steps=4,
        save_every=4,
        dtype="float64",
        diffusivity=Range(NU, NU),
        boundary=BoundaryConfig(**sides),
        time_stepping="exact",
        **extra,
    )
    return HeatBounded(config)


def final_frame(system: HeatBounded, u0: np.ndarray) -> np.ndarray:
    drawn = system.draw_samples([np.random.default_rng(0)])
    return system.rollout(torch.from_numpy(u0)[None, None], drawn.params).fields[0, -1, 0].numpy()


def grid(ndim: int, n: int, discretisation: str = "finite_difference") -> list[np.ndarray]:
    nodes = unit_nodes(n) if discretisation == "chebyshev" else np.linspace(0.0, 1.0, n)
    return [nodes] if ndim == 1 else list(np.meshgrid(nodes, nodes, indexing="ij"))


def modes_error(
    ndim: int, kinds: tuple[str, ...], n: int, discretisation: str = "finite_difference"
) -> float:
    """Max error at T_END of l + two decaying eigenfunction products (module docstring)."""
    axes = grid(ndim, n, discretisation)
    kind = dict(zip(SIDE_NAMES, kinds, strict=False))
    slope = 0.5 if ndim == 1 else 0.0
    sides = {}
    for i, side in enumerate(SIDE_NAMES[: 2 * ndim]):
        at_high = i % 2 == 1
        if kind[side] == "dirichlet":
            value = 1.0 + (slope if (at_high and i < 2) else 0.0)
        else:
            value = (slope if at_high else -slope) if i < 2 else 0.0
        sides[side] = SideConfig(kind=kind[side], value=Range(value, value))

    def solution(t: float) -> np.ndarray:
        u = 1.0 + slope * axes[0]
        for term, weight in ((0, 1.0), (1, 0.5)):
            product, rate = weight, 0.0
            for axis, s in enumerate(axes):
                f, k = EIGENFUNCTIONS[kinds[2 * axis], kinds[2 * axis + 1]][term]
                product = product * f(k * math.pi * s)
                rate += (k * math.pi) ** 2
            u = u + product * math.exp(-NU * rate * t)
        return u

    final = final_frame(heat(ndim, n, sides, discretisation=discretisation), solution(0.0))
    return float(np.abs(final - solution(T_END)).max())


def stokes_error(ndim: int, far: str, n: int, discretisation: str = "finite_difference") -> float:
    """Max error at T_END of Stokes' second problem, u(0, t) = sin(w t) (module docstring)."""
    omega = 4 * math.pi
    z = (1 + 1j) * math.sqrt(omega / (2 * NU))
    axes = grid(ndim, n, discretisation)
    x = axes[0]
    shape = np.sinh(z * (1 - x)) / np.sinh(z) if far == "dirichlet" else np.cosh(z * (1 - x)) / np.cosh(z)

    def solution(t: float) -> np.ndarray:
        return np.imag(np.exp(1j * omega * t) * shape)

    sides = {
        "left": SideConfig(
            amplitude=Range(1.0, 1.0), frequency=Range(omega / (2 * math.pi), omega / (2 * math.pi))
        ),
        "right": SideConfig(kind=far),
        "bottom": SideConfig(kind="neumann"),
        "top": SideConfig(kind="neumann"),
    }
    final = final_frame(heat(ndim, n, sides, discretisation=discretisation), solution(0.0))
    return float(np.abs(final - solution(T_END)).max())


def orders(errors: list[float]) -> list[float]:
    return [math.log2(coarse / fine) for coarse, fine in itertools.pairwise(errors)]


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("case", [0, 1, 2, 3])
def test_exact_stepping_converges_at_second_order_to_decaying_modes(ndim: int, case: int) -> None:
    kinds = BOUNDARIES[ndim][case]
    errors = [modes_error(ndim, kinds, n) for n in RESOLUTIONS]
    print(f"modes {ndim}D {kinds}: errors {errors}, orders {orders(errors)}")
    for measured in orders(errors):
        assert abs(measured - 2.0) < ORDER_TOLERANCE


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("far", ["dirichlet", "neumann"])
def test_exact_stepping_converges_at_second_order_under_an_oscillating_boundary_value(
    ndim: int, far: str
) -> None:
    errors = [stokes_error(ndim, far, n) for n in RESOLUTIONS]
    print(f"stokes {ndim}D far {far}: errors {errors}, orders {orders(errors)}")
    for measured in orders(errors):
        assert abs(measured - 2.0) < ORDER_TOLERANCE


def mixed_system(time_stepping: str, dt: float, dtype: str = "float64") -> HeatBounded:
    """2D, every side's value oscillating, a parabolic inflow, per-sample nu and L."""
    kinds = {"left": "dirichlet", "right": "neumann", "bottom": "neumann", "top": "dirichlet"}
    sides = {
        side: SideConfig(
            kind=kind,
            value=Range(-0.5, 1.0),
            amplitude=Range(0.1, 0.4),
            frequency=Range(0.5, 3.0),
            profile="parabolic" if side == "left" else "uniform",
        )
        for side, kind in kinds.items()
    }
    steps = round(0.2 / dt)
    config = HeatBoundedConfig(
        ndim=2,
        resolution=17,
        dt=dt,
        steps=steps,
        save_every=steps // 4,
        dtype=dtype,
        diffusivity=Range(0.05, 0.2),
        domain_length=Range(0.7, 1.3),
        boundary=BoundaryConfig(**sides),
        time_stepping=time_stepping,
    )
    return HeatBounded(config)


def mixed_rollout(time_stepping: str, dt: float, dtype: str = "float64") -> torch.Tensor:
    system = mixed_system(time_stepping, dt, dtype)
    drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(3)])
    return system.rollout(drawn.initial, drawn.params).fields.double()


def test_exact_stepping_is_the_limit_of_runge_kutta_as_dt_goes_to_zero() -> None:
    exact = mixed_rollout("exact", 1e-3)
    gaps = [float((mixed_rollout("runge_kutta", dt) - exact).abs().max()) for dt in (4e-4, 2e-4)]
    # measured: 7.4e-8 and 9.2e-9 (|u| <= 1), order 3.02: SSP-RK3's time error, nothing else
    assert gaps[0] < 1e-6
    assert abs(math.log2(gaps[0] / gaps[1]) - 3.0) < ORDER_TOLERANCE


def test_exact_stepping_in_float32_follows_float64_to_rounding() -> None:
    gap = (mixed_rollout("exact", 1e-3, "float32") - mixed_rollout("exact", 1e-3)).abs().max()
    # measured: 1.1e-7 (|u| <= 1): float32 rounding
    assert gap < 1e-6


def test_exact_stepping_takes_any_dt() -> None:
    system = heat(1, 65, {"left": SideConfig(), "right": SideConfig()}, t_end=10.0)
    assert system.stability_bound() == math.inf
