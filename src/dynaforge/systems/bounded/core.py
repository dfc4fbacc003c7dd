"""Bounded intervals and rectangles: the grid, the boundary conditions and the time stepper.

Conventions (every system of `dynaforge.systems.bounded`):
- PDE form: u_t = F(u, grad u, laplacian u; parameters) on [0, L]^d (d = 1 or 2), the same L on every axis.
- Grid: nodes x_j = j h, h = L / (n - 1), j = 0 .. n - 1 on each axis: both ends included, so a Dirichlet
  value sits on a node and a Neumann condition is centred on one (`docs/bounded.md` says why).
- Sides: `left`/`right` are x = 0 and x = L, `bottom`/`top` y = 0 and y = L. Each side is `dirichlet`
  (u = g) or `neumann` (du/dn = g, n the outward normal); g may vary along the side, in time and per sample.
- Space: second-order central differences. A Neumann side adds a ghost node mirrored through the boundary
  node, u_ghost = u_neighbour + 2 h g; a Dirichlet node is not evolved: it is set to g at every stage time.
  Where a Dirichlet side meets another side, the Dirichlet value wins (x sides over y sides when both are).
- Time: SSP-RK3 (order 3, Shu & Osher 1988) or classical RK4 (order 4), explicit; the largest stable step
  is estimated from the grid and the parameters (`stable_dt`).
- Fields: channels first, (batch, channels, *space); boundary values (batch, channels, *side) where a side's
  shape is the grid's without the side's axis ((batch, channels) in 1D).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.errors import ConfigError

SIDES = ("left", "right", "bottom", "top")
"""The sides of a rectangle, two per axis: (low, high) of x, then of y."""

KINDS = ("dirichlet", "neumann")
"""Boundary condition kinds a side can take."""

STABILITY_EXTENT = {3: (2.5127, 1.7320), 4: (2.7853, 2.8284)}
"""How far the stability region of the order-3 (SSP-RK3) and order-4 (RK4) schemes reaches along the negative
real axis and along the imaginary axis (roots of |R(z)| = 1 of their stability polynomials)."""

BoundaryValues = dict[str, Tensor]
"""Side name -> its values g at one time, (batch, channels, *side)."""

Boundary = Callable[[float], BoundaryValues]
"""The boundary values at time t."""


def sides_of(ndim: int) -> tuple[str, ...]:
    """The sides of a domain of `ndim` dimensions: left, right (and bottom, top)."""
    return SIDES[: 2 * ndim]


def side_shape(side: str, shape: Sequence[int]) -> tuple[int, ...]:
    """The shape of a side's values on a grid of `shape` (the grid's without the side's axis)."""
    axis = SIDES.index(side) // 2
    return tuple(n for a, n in enumerate(shape) if a != axis)


class Grid(NamedTuple):
    """The grid a batch is stepped on: its shape, the sides' kinds and the per-sample spacing factors."""

    shape: tuple[int, ...]
    kinds: dict[str, str]
    """Side -> `dirichlet` or `neumann`, for every side of the domain."""
    two_h: Tensor
    """2 h per sample, (batch, 1, *ones), in the state's dtype."""
    inv_h2: Tensor
    """1 / h^2 per sample, (batch, 1, *ones)."""
    half_inv_h: Tensor
    """1 / (2 h) per sample, (batch, 1, *ones)."""

    @classmethod
    def build(
        cls, shape: Sequence[int], kinds: dict[str, str], lengths: Float[Tensor, " batch"], dtype: torch.dtype
    ) -> Grid:
        """The grid for per-sample domain lengths `lengths`; the factors are computed in float64 and
        rounded once."""
        h = lengths.to(torch.float64).view(-1, 1, *([1] * len(shape))) / (shape[0] - 1)
        return cls(tuple(shape), dict(kinds), (2 * h).to(dtype), (1 / h**2).to(dtype), (0.5 / h).to(dtype))

    @property
    def ndim(self) -> int:
        return len(self.shape)


def check_boundary_values(values: BoundaryValues, grid: Grid, batch: int, channels: int) -> None:
    """A `ConfigError` naming the expected shape unless every side has values of (batch, channels, *side)."""
    for side in sides_of(grid.ndim):
        expected = (batch, channels, *side_shape(side, grid.shape))
        got = values.get(side)
        if got is None or tuple(got.shape) != expected:
            found = "none" if got is None else tuple(got.shape)
            raise ConfigError(
                f"boundary values of side {side!r} must have shape {expected} (batch, channels, *points along "
                f"the side), got {found}; give one value per sample, channel and boundary node"
            )


def with_ghosts(u: Tensor, axis: int, grid: Grid, values: BoundaryValues) -> Tensor:
    """`u` with one ghost layer before and after `axis`: u_neighbour + 2 h g on a Neumann side (the mirror
    that centres du/dn = g on the boundary node), the linear extrapolation on a Dirichlet side (whose node
    is overwritten after the stage, so its ghost only has to be finite)."""
    dim = axis - grid.ndim
    n = u.shape[dim]
    low_side, high_side = SIDES[2 * axis], SIDES[2 * axis + 1]
    first, second = u.narrow(dim, 0, 1), u.narrow(dim, 1, 1)
    last, before = u.narrow(dim, n - 1, 1), u.narrow(dim, n - 2, 1)
    if grid.kinds[low_side] == "neumann":
        low = second + grid.two_h * values[low_side].unsqueeze(dim)
    else:
        low = 2 * first - second
    if grid.kinds[high_side] == "neumann":
        high = before + grid.two_h * values[high_side].unsqueeze(dim)
    else:
        high = 2 * last - before
    return torch.cat([low, u, high], dim=dim)


class Stencils:
    """The difference quotients of one state, its ghost layers built once per evaluation."""

    def __init__(self, u: Tensor, grid: Grid, values: BoundaryValues) -> None:
        self.u = u
        self.grid = grid
        self.extended = [with_ghosts(u, axis, grid, values) for axis in range(grid.ndim)]

    def laplacian(self) -> Tensor:
        """Sum over axes of (u_{j+1} - 2 u_j + u_{j-1}) / h^2."""
        total = None
        for axis, e in enumerate(self.extended):
            dim, n = axis - self.grid.ndim, self.u.shape[axis - self.grid.ndim]
            d2 = e.narrow(dim, 2, n) - 2 * e.narrow(dim, 1, n) + e.narrow(dim, 0, n)
            total = d2 if total is None else total + d2
        assert total is not None
        return total * self.grid.inv_h2

    def derivative(self, axis: int, flux: Callable[[Tensor], Tensor] | None = None) -> Tensor:
        """(f_{j+1} - f_{j-1}) / (2 h) along `axis`, f = flux(u) (u itself when no flux is given)."""
        dim, n = axis - self.grid.ndim, self.u.shape[axis - self.grid.ndim]
        e = self.extended[axis] if flux is None else flux(self.extended[axis])
        return (e.narrow(dim, 2, n) - e.narrow(dim, 0, n)) * self.grid.half_inv_h


def impose_dirichlet(u: Tensor, grid: Grid, values: BoundaryValues) -> Tensor:
    """`u` with its Dirichlet nodes set to their values (y sides first, so that x sides win the corners)."""
    for side in reversed(sides_of(grid.ndim)):
        if grid.kinds[side] != "dirichlet":
            continue
        axis, high = divmod(SIDES.index(side), 2)
        dim = axis - grid.ndim
        n = u.shape[dim]
        g = values[side].unsqueeze(dim).to(u.dtype)
        u = torch.cat([u.narrow(dim, 0, n - 1), g] if high else [g, u.narrow(dim, 1, n - 1)], dim=dim)
    return u


Tendency = Callable[[Stencils, float], Tensor]
"""F(u) at time t from the state's stencils: what an equation provides."""


def rk_step(
    u: Tensor,
    t: float,
    dt: float,
    order: int,
    rate: Callable[[Tensor, float], Tensor],
    impose: Callable[[Tensor, float], Tensor],
) -> Tensor:
    """One step of SSP-RK3 (Shu-Osher form) or RK4 from time t; every stage state gets its Dirichlet values
    at its own time (`impose`)."""
    if order == 3:
        u1 = impose(u + dt * rate(u, t), t + dt)
        u2 = impose(0.75 * u + 0.25 * (u1 + dt * rate(u1, t + dt)), t + 0.5 * dt)
        return impose(u / 3 + (2 / 3) * (u2 + dt * rate(u2, t + 0.5 * dt)), t + dt)
    k1 = rate(u, t)
    a = impose(u + (0.5 * dt) * k1, t + 0.5 * dt)
    k2 = rate(a, t + 0.5 * dt)
    b = impose(u + (0.5 * dt) * k2, t + 0.5 * dt)
    k3 = rate(b, t + 0.5 * dt)
    c = impose(u + dt * k3, t + dt)
    k4 = rate(c, t + dt)
    return impose(u + (dt / 6) * (k1 + 2 * (k2 + k3) + k4), t + dt)


def integrate(
    u0: Float[Tensor, "batch channels *space"],
    tendency: Tendency,
    grid: Grid,
    boundary: Boundary,
    dt: float,
    steps: int,
    save_every: int,
    order: int,
    write: Callable[[int, Tensor], None],
    forcing: Callable[[float], Tensor] | None = None,
    on_step: Callable[[], None] | None = None,
) -> Tensor:
    """Step `u0` (its Dirichlet nodes set first) `steps` times, handing the first frame and every
    `save_every`-th step to `write(frame_index, u)`; returns the last state. `forcing(t)`, added to F, is
    for manufactured solutions.
    Stage times are n dt + c dt, never accumulated, so a step's numbers depend on n alone."""
    cache: dict[float, BoundaryValues] = {}

    def values_at(t: float) -> BoundaryValues:
        if t not in cache:
            if len(cache) > 4:  # a step needs the values at three times; older ones are never asked again
                cache.clear()
            cache[t] = boundary(t)
        return cache[t]

    def rate(u: Tensor, t: float) -> Tensor:
        f = tendency(Stencils(u, grid, values_at(t)), t)
        return f if forcing is None else f + forcing(t)

    def impose(u: Tensor, t: float) -> Tensor:
        return impose_dirichlet(u, grid, values_at(t))

    check_boundary_values(values_at(0.0), grid, u0.shape[0], u0.shape[1])
    u = impose(u0, 0.0)
    write(0, u)
    for n in range(steps):
        u = rk_step(u, n * dt, dt, order, rate, impose)
        if (n + 1) % save_every == 0:
            write((n + 1) // save_every, u)
        if on_step is not None:
            on_step()
    return u


def stable_dt(order: int, real_extent: float, imaginary_extent: float) -> float:
    """The largest step with dt * (real / R + imaginary / I) <= 1, where R and I are how far the scheme's
    stability region reaches along the negative real and the imaginary axis, `real_extent` bounds the
    decay rates of the discrete operator (diffusion: 4 nu d / h^2) and `imaginary_extent` its oscillation
    rates (central advection: sum_i |c_i| / h). The eigenvalues of these operators lie on an ellipse inside
    the triangle with corners 0, -R and iI, and both schemes' stability regions hold that triangle (|R(z)|
    <= 1 along its edge to 1e-5)."""
    real, imaginary = STABILITY_EXTENT[order]
    rate = real_extent / real + imaginary_extent / imaginary
    return float("inf") if rate == 0 else 1.0 / rate
