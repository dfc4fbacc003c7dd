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


def padded_buffer(u: Tensor) -> Tensor:
    """A zeroed buffer for `u` with one ghost layer on each side of every space axis,
    (batch, channels, *(n + 2))."""
    space = u.shape[2:]
    return torch.zeros((*u.shape[:2], *(n + 2 for n in space)), dtype=u.dtype, device=u.device)


def axis_view(padded: Tensor, axis: int, ndim: int) -> Tensor:
    """`padded` with the ghost nodes of every axis but `axis` cut off: that axis's nodes and its two ghosts."""
    for other in range(ndim):
        if other != axis:
            dim = other - ndim
            padded = padded.narrow(dim, 1, padded.shape[dim] - 2)
    return padded


class Layers(NamedTuple):
    """The boundary values at one time as the layers a step writes: per Dirichlet side its values g, per
    Neumann side its ghost offset 2 h g, each shaped as one layer of the grid across the side's axis."""

    dirichlet: dict[str, Tensor]
    neumann: dict[str, Tensor]


def boundary_layers(values: BoundaryValues, grid: Grid) -> Layers:
    """The `Layers` of boundary values `values`."""
    dirichlet, neumann = {}, {}
    for side in sides_of(grid.ndim):
        g = values[side].unsqueeze(SIDES.index(side) // 2 - grid.ndim)
        if grid.kinds[side] == "dirichlet":
            dirichlet[side] = g
        else:
            neumann[side] = grid.two_h * g
    return Layers(dirichlet, neumann)


class PaddedState:
    """A state held inside a padded buffer, with the views a stage reads and writes, made once: the state
    (the interior), per axis the three shifted views of the second difference, and per side the boundary
    layer of nodes, the layer next to it and the ghost layer beyond it."""

    def __init__(self, padded: Tensor, ndim: int) -> None:
        self.padded = padded
        interior = padded
        for dim in range(-ndim, 0):
            interior = interior.narrow(dim, 1, padded.shape[dim] - 2)
        self.u = interior
        self.shifted = []  # per axis: u_{j-1}, u_j, u_{j+1} over the nodes
        self.node, self.inner, self.ghost = {}, {}, {}
        for axis in range(ndim):
            dim = axis - ndim
            e = axis_view(padded, axis, ndim)
            n = e.shape[dim] - 2
            self.shifted.append(tuple(e.narrow(dim, k, n) for k in range(3)))
            low, high = SIDES[2 * axis], SIDES[2 * axis + 1]
            self.node[low], self.inner[low], self.ghost[low] = (e.narrow(dim, k, 1) for k in (1, 2, 0))
            self.node[high], self.inner[high], self.ghost[high] = (
                e.narrow(dim, k, 1) for k in (n, n - 1, n + 1)
            )


def fill_ghosts(state: PaddedState, layers: Layers) -> None:
    """The Neumann ghost layers of `state`: u_neighbour + 2 h g (the mirror that centres du/dn = g on the
    boundary node). A Dirichlet side's ghost stays zero: it only enters its own boundary node's difference,
    and that node is overwritten by its value after every stage. In-place writes on purpose."""
    for side, offset in layers.neumann.items():
        torch.add(state.inner[side], offset, out=state.ghost[side])


class Workspace:
    """The block-sized buffers a batch is stepped in, allocated once per rollout. Reusing them spares every
    stage a fresh allocation of each temporary, whose pages the C library maps and faults in anew each
    time (most of a 2D step's time before), and the states live inside padded buffers, so their ghost
    layers are written beside them with no copy. In-place writes on purpose: each buffer's use is in the
    comments of `Stencils` and `rk_step`."""

    def __init__(self, u0: Tensor, order: int) -> None:
        ndim = u0.ndim - 2
        self.states = [PaddedState(padded_buffer(u0), ndim) for _ in range(4 if order == 3 else 6)]
        """The step's state, its stage states and rates (`rk_step`), each in its padded buffer."""
        self.by_address = {state.u.data_ptr(): state for state in self.states}
        self.flux = PaddedState(padded_buffer(u0), ndim)
        """A flux f(u) on the padded grid (`Stencils.derivative`)."""
        self.scratch = torch.empty_like(u0)
        """The second axis's difference in `Stencils.laplacian`."""
        self.term = torch.empty_like(u0)
        """One term of a tendency (`Stencils.term`: a derivative, a reaction)."""

    def state_of(self, u: Tensor) -> PaddedState:
        """The padded state `u` is the interior of."""
        return self.by_address[u.data_ptr()]


class Stencils:
    """The difference quotients of one state (a `Workspace` state, its ghost layers filled once per
    evaluation by `fill_ghosts`). Each quotient is a few whole-block operations on shifted views of the
    padded buffer, written into preallocated buffers: `laplacian` into `out` (the stage's rate, which the
    tendency then updates in place), `derivative` and `term` into the workspace's `term` buffer (one at a
    time: use each before asking for the next)."""

    def __init__(self, u: Tensor, grid: Grid, layers: Layers, workspace: Workspace, out: Tensor) -> None:
        self.u = u
        self.grid = grid
        self.workspace = workspace
        self.out = out
        self.state = workspace.state_of(u)
        fill_ghosts(self.state, layers)
        self.layers = layers

    def laplacian(self) -> Tensor:
        """Sum over axes of (u_{j+1} - 2 u_j + u_{j-1}) / h^2, in `out`."""
        for axis, (before, here, after) in enumerate(self.state.shifted):
            d2 = self.out if axis == 0 else self.workspace.scratch
            # u_{j+1} - 2 u_j (2 u_j is exact, so this rounds as one subtraction), then + u_{j-1}
            torch.sub(after, here, alpha=2, out=d2).add_(before)
            if axis > 0:
                self.out.add_(d2)
        return self.out.mul_(self.grid.inv_h2)

    def term(self) -> Tensor:
        """The workspace's buffer for one more term of a tendency (the state's shape)."""
        return self.workspace.term

    def derivative(self, axis: int, flux: Callable[[Tensor, Tensor], Tensor] | None = None) -> Tensor:
        """(f_{j+1} - f_{j-1}) / (2 h) along `axis`, in the `term` buffer; f = u, or `flux(u, out)`, which
        writes f(u) into `out` and returns it."""
        before, _, after = self.state.shifted[axis]
        if flux is not None:
            flux(
                axis_view(self.state.padded, axis, self.grid.ndim),
                axis_view(self.workspace.flux.padded, axis, self.grid.ndim),
            )
            before, _, after = self.workspace.flux.shifted[axis]
        return torch.sub(after, before, out=self.term()).mul_(self.grid.half_inv_h)


def impose_dirichlet(u: Tensor, workspace: Workspace, layers: Layers) -> Tensor:
    """`u` (a workspace state) with its Dirichlet nodes set to their values (y sides first, so that x sides
    win the corners), written in place: `u` is a stage's own fresh result (a hot loop, on purpose)."""
    state = workspace.state_of(u)
    for side in reversed(SIDES):
        if side in layers.dirichlet:
            state.node[side].copy_(layers.dirichlet[side])
    return u


Tendency = Callable[[Stencils, float], Tensor]
"""F(u) at time t from the state's stencils, written into `stencils.out` (start from `stencils.laplacian()`
and update it in place, taking other terms from `stencils.derivative` or `stencils.term()`): what an
equation provides."""

Rate = Callable[[Tensor, float, Tensor], Tensor]
"""F(u) at time t, written into the given buffer (the third argument) and returned."""


def rk_step(
    u: Tensor,
    t: float,
    dt: float,
    order: int,
    rate: Rate,
    impose: Callable[[Tensor, float], Tensor],
    buffers: Sequence[Tensor],
) -> Tensor:
    """One step of SSP-RK3 (Shu-Osher form) or RK4 from time t; every stage state gets its Dirichlet values
    at its own time (`impose`). The stages are written into `buffers` other than `u` (4 for SSP-RK3, 6 for
    RK4, `u` one of them) and the new state is one of them. Each product and sum is the out-of-place
    formula's, updated in place (the same roundings)."""
    free = [b for b in buffers if b is not u]
    if order == 3:
        s1, s2, s3 = free[:3]
        u1 = impose(rate(u, t, s1).mul_(dt).add_(u), t + dt)
        stage = rate(u1, t + dt, s2).mul_(dt).add_(u1).mul_(0.25).add_(torch.mul(u, 0.75, out=s3))
        u2 = impose(stage, t + 0.5 * dt)  # u1 is no longer needed: s1 takes the last stage
        stage = rate(u2, t + 0.5 * dt, s1).mul_(dt).add_(u2).mul_(2 / 3).add_(torch.div(u, 3, out=s3))
        return impose(stage, t + dt)
    k1, k2, k3, k4, stage = free[:5]
    rate(u, t, k1)
    a = impose(torch.mul(k1, 0.5 * dt, out=stage).add_(u), t + 0.5 * dt)
    rate(a, t + 0.5 * dt, k2)
    b = impose(torch.mul(k2, 0.5 * dt, out=stage).add_(u), t + 0.5 * dt)  # a is read: stage is free
    rate(b, t + 0.5 * dt, k3)
    c = impose(torch.mul(k3, dt, out=stage).add_(u), t + dt)
    rate(c, t + dt, k4)
    # u + (dt / 6) (k1 + 2 (k2 + k3) + k4)
    return impose(k1.add_(k2.add_(k3).mul_(2)).add_(k4).mul_(dt / 6).add_(u), t + dt)


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
    `save_every`-th step to `write(frame_index, u)` (copy it: the buffer is reused); returns the last state.
    `forcing(t)`, added to F, is for manufactured solutions.
    Stage times are n dt + c dt, never accumulated, so a step's numbers depend on n alone."""
    cache: dict[float, Layers] = {}

    def layers_at(t: float) -> Layers:
        if t not in cache:
            if len(cache) > 4:  # a step needs the values at three times; older ones are never asked again
                cache.clear()
            cache[t] = boundary_layers(boundary(t), grid)
        return cache[t]

    workspace = Workspace(u0, order)

    def rate(u: Tensor, t: float, out: Tensor) -> Tensor:
        f = tendency(Stencils(u, grid, layers_at(t), workspace, out), t)
        if f is not out:  # a tendency written out of place: its result joins the workspace's buffers
            out.copy_(f)
        return out if forcing is None else out.add_(forcing(t))

    def impose(u: Tensor, t: float) -> Tensor:
        return impose_dirichlet(u, workspace, layers_at(t))

    check_boundary_values(boundary(0.0), grid, u0.shape[0], u0.shape[1])
    u = impose(workspace.states[0].u.copy_(u0), 0.0)
    write(0, u)
    for n in range(steps):
        u = rk_step(u, n * dt, dt, order, rate, impose, [state.u for state in workspace.states])
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
