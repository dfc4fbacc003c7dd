"""Flow through a channel past obstacles given as a mask (volume penalisation), on the staggered grid of
`mac.py`: a first version of issue 35's DFG 2D-2 cylinder (Schäfer & Turek 1996), not yet a registered system.

Conventions: the channel [0, nx h] x [0, ny h], walls (no-slip) at y = 0 and y = ny h; at x = 0 a given
inflow profile u(y) (v = 0); at x = nx h an outflow whose face velocities are set, in each stage, to the last
inner column's shifted by one constant so that what flows out equals what flows in (then the pressure
equation keeps its no-flux form everywhere and `PoissonSolver` solves it exactly). The outflow faces are
part of the state: `FaceVelocity.u` is (B, nx, ny) here, the inner faces then the outflow. An obstacle is a mask chi in [0, 1] on the
faces; inside it the velocity is pulled to rest by the penalisation -chi u / eta (Angot, Bruneau & Fabrie
1999), taken implicitly in each Runge-Kutta stage, so any eta is stable. The force of the fluid on the
obstacle is the integral of chi u / eta: the momentum the penalisation removes.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from dynaforge.systems.flow.mac import (
    FaceVelocity,
    FlowCoefficients,
    PoissonSolver,
    WallSpeeds,
    face_gradient,
    face_tendency,
    stable_time_step,
)


class Channel(NamedTuple):
    """The boundary data and obstacle of a batch of channel flows."""

    inflow: Float[Tensor, "batch 1 ny"]
    """u on the inflow faces x = 0."""
    mask_u: Float[Tensor, "batch nx_minus_1 ny"]
    """chi on the inner u faces."""
    mask_v: Float[Tensor, "batch nx ny_minus_1"]
    """chi on the inner v faces."""
    damping_u: Tensor
    """1 / (1 + dt chi / eta) on the u faces: the implicit penalisation of one Euler stage."""
    damping_v: Tensor
    cell_area: Tensor
    """h^2, (B, 1)."""


class Force(NamedTuple):
    """The force of the fluid on the obstacle per unit depth (x and y components, (B,) each)."""

    x: Tensor
    y: Tensor


def disc_chi(
    x: Tensor, y: Tensor, centre_x: Tensor, centre_y: Tensor, radius: Tensor, spacing: float, width: float
) -> Tensor:
    """chi of discs at the points (x, y) (float64, broadcast against the per-sample (B, 1, 1) centres and
    radii): 1 inside, 0 outside, a linear ramp `width` cells wide centred on the circle (a smoothed
    indicator: the force then varies smoothly as the disc moves against the grid)."""
    distance = torch.sqrt((x - centre_x) ** 2 + (y - centre_y) ** 2)
    return ((radius - distance) * (1.0 / (width * spacing)) + 0.5).clamp(0.0, 1.0)


class Discs(NamedTuple):
    """One disc per sample: centres and radii, each (B, 1, 1) float64."""

    centre_x: Tensor
    centre_y: Tensor
    radius: Tensor


def disc_masks(
    nx: int, ny: int, spacing: float, discs: Discs, width: float = 1.0
) -> tuple[Tensor, Tensor, Tensor]:
    """chi of one disc per sample (centres and radii (B, 1, 1), float64) on the inner u faces (B, nx-1, ny),
    the inner v faces (B, nx, ny-1) and the cell centres (B, nx, ny), float64."""
    centre_x, centre_y, radius = discs
    device = radius.device
    faces_x = torch.arange(1, nx, dtype=torch.float64, device=device) * spacing
    centres_x = (torch.arange(nx, dtype=torch.float64, device=device) + 0.5) * spacing
    faces_y = torch.arange(1, ny, dtype=torch.float64, device=device) * spacing
    centres_y = (torch.arange(ny, dtype=torch.float64, device=device) + 0.5) * spacing

    def chi(x: Tensor, y: Tensor) -> Tensor:
        return disc_chi(x[None, :, None], y[None, None, :], centre_x, centre_y, radius, spacing, width)

    return chi(faces_x, centres_y), chi(centres_x, faces_y), chi(centres_x, centres_y)


def disc_fractions(
    nx: int, ny: int, spacing: float, discs: Discs, points: int = 8
) -> tuple[Tensor, Tensor, Tensor]:
    """The fraction of each face's control volume (the h x h square centred on it) that one disc per sample
    covers, on the inner u faces, the inner v faces and the cells (as `disc_masks`): the mean of the disc's
    indicator over `points` x `points` midpoints of the square (float64; exact to about 1 / points^2 of a
    cut square)."""
    offsets = [((k + 0.5) / points - 0.5) * spacing for k in range(points)]
    sums: list[Tensor] = []
    for dx in offsets:
        for dy in offsets:
            # a ramp of width 1e-9 cells: the disc's indicator at the shifted points
            moved = Discs(discs.centre_x - dx, discs.centre_y - dy, discs.radius)
            shifted = disc_masks(nx, ny, spacing, moved, width=1e-9)
            sums = list(shifted) if not sums else [a + b for a, b in zip(sums, shifted, strict=True)]
    scale = 1.0 / (points * points)
    return sums[0] * scale, sums[1] * scale, sums[2] * scale


def damping(mask: Tensor, dt: float, eta: float) -> Tensor:
    """What one pass multiplies a face velocity by: 1 / (1 + dt chi / eta), the implicit penalisation of
    one Euler stage, for eta > 0; 1 - chi for eta = 0, direct forcing by the covered fraction (the fluid
    part of a face's control volume keeps its velocity; Kajishima et al. 2001)."""
    return 1.0 - mask if eta == 0 else 1.0 / (1.0 + dt * mask / eta)


def disc_mask(
    nx: int,
    ny: int,
    spacing: float,
    centre: tuple[float, float],
    radius: float,
    dtype: torch.dtype,
    width: float = 1.0,
) -> tuple[Tensor, Tensor]:
    """chi of one disc on the inner u and v faces, (1, nx-1, ny) and (1, nx, ny-1) (`disc_masks`)."""
    s = lambda value: torch.full((1, 1, 1), value, dtype=torch.float64)  # noqa: E731
    mask_u, mask_v, _ = disc_masks(nx, ny, spacing, Discs(s(centre[0]), s(centre[1]), s(radius)), width)
    return mask_u.to(dtype), mask_v.to(dtype)


def parabolic_inflow(ny: int, peak: float, dtype: torch.dtype) -> Tensor:
    """u(y) = 4 peak y (H - y) / H^2 at the face centres y = (j + 1/2) H / ny, (1, 1, ny)."""
    y = (torch.arange(ny, dtype=torch.float64) + 0.5) / ny
    return (4.0 * peak * y * (1.0 - y)).to(dtype).view(1, 1, ny)


def full_faces(velocity: FaceVelocity, channel: Channel) -> tuple[Tensor, Tensor]:
    """u on every x-face (inflow, inner, outflow) and v on every y-face (walls 0)."""
    return torch.cat([channel.inflow, velocity.u], dim=1), F.pad(velocity.v, (1, 1))


def with_outflow(inner: Float[Tensor, "batch nx_minus_1 ny"], channel: Channel) -> Tensor:
    """The inner u faces and the outflow faces after them: the last inner column plus the constant that
    makes the outflow equal the inflow."""
    last = inner[:, -1:]  # (B, 1, ny)
    shortfall = (channel.inflow.sum(dim=2, keepdim=True) - last.sum(dim=2, keepdim=True)) * (
        1.0 / last.shape[2]
    )
    return torch.cat([inner, last + shortfall], dim=1)


def project(velocity: FaceVelocity, channel: Channel, poisson: PoissonSolver) -> FaceVelocity:
    """The divergence-free part of `velocity` with the inflow and outflow faces held (`mac.project`)."""
    u, v = full_faces(velocity, channel)
    divergence = (u[:, 1:] - u[:, :-1]) + (v[:, :, 1:] - v[:, :, :-1])
    correction = face_gradient(poisson.solve(divergence))
    inner = velocity.u[:, :-1] - correction.u
    return FaceVelocity(torch.cat([inner, velocity.u[:, -1:]], dim=1), velocity.v - correction.v)


def tendency(velocity: FaceVelocity, channel: Channel, c: FlowCoefficients) -> FaceVelocity:
    """-(u . grad) u + nu laplacian(u) on the inner faces."""
    u, v = full_faces(velocity, channel)
    u_ghost = torch.cat([-u[:, :, :1], u, -u[:, :, -1:]], dim=2)  # no-slip walls below and above
    v_ghost = torch.cat([-v[:, :1], v, v[:, -1:]], dim=1)  # v = 0 at the inflow, dv/dx = 0 at the outflow
    return face_tendency(u, v, u_ghost, v_ghost, c)


PENALTY_PROJECTIONS = 3
"""Penalise-then-project passes per stage. The projection after the penalisation lets flow back into the
obstacle; repeating the pair shrinks what leaks in (measured in docs/cavity.md, "Obstacles")."""


def penalised_stage(
    velocity: FaceVelocity, channel: Channel, c: FlowCoefficients, passes: int = PENALTY_PROJECTIONS
) -> tuple[FaceVelocity, Force]:
    """P(damped(u + dt F(u))) (the pair `passes` times) with the outflow set from it, and the force the
    obstacle took from the fluid in this stage (what each damping removed)."""
    k = tendency(velocity, channel, c)
    u = velocity.u[:, :-1] + c.dt * k.u
    v = velocity.v + c.dt * k.v
    per_time = channel.cell_area[:, 0] / c.dt.view(-1)
    force_x = torch.zeros_like(per_time)
    force_y = torch.zeros_like(per_time)
    for _ in range(passes):
        damped_u = u * channel.damping_u
        damped_v = v * channel.damping_v
        force_x = force_x + (u - damped_u).flatten(1).sum(dim=1) * per_time
        force_y = force_y + (v - damped_v).flatten(1).sum(dim=1) * per_time
        projected = project(FaceVelocity(with_outflow(damped_u, channel), damped_v), channel, c.poisson)
        u, v = projected.u[:, :-1], projected.v
    return projected, Force(force_x, force_y)


def step(velocity: FaceVelocity, channel: Channel, c: FlowCoefficients) -> tuple[FaceVelocity, Force]:
    """One SSP-RK3 step (`mac.ssp_rk3_step`) with the penalisation, and the step's mean force on the
    obstacle (the stages weighted 1/6, 1/6, 2/3, the scheme's weights)."""
    first, f1 = penalised_stage(velocity, channel, c)
    stage, f2 = penalised_stage(first, channel, c)
    second = FaceVelocity(0.75 * velocity.u + 0.25 * stage.u, 0.75 * velocity.v + 0.25 * stage.v)
    stage, f3 = penalised_stage(second, channel, c)
    new = FaceVelocity(velocity.u / 3.0 + 2.0 / 3.0 * stage.u, velocity.v / 3.0 + 2.0 / 3.0 * stage.v)
    force = Force(f1.x / 6.0 + f2.x / 6.0 + f3.x * (2.0 / 3.0), f1.y / 6.0 + f2.y / 6.0 + f3.y * (2.0 / 3.0))
    return new, force


def dfg_channel(
    ny: int,
    dt: float,
    eta: float,
    dtype: torch.dtype = torch.float32,
    viscosity: float = 1e-3,
    width: float = 1.0,
    fraction: bool = False,
) -> tuple[Channel, FlowCoefficients, FaceVelocity]:
    """The DFG 2D-2 setup (channel 2.2 x 0.41, disc of diameter 0.1 at (0.2, 0.2), parabolic inflow of peak
    1.5, nu = 1e-3) on ny cells across, the mask's ramp `width` cells wide: the channel, the coefficients and
    a start (the inflow profile everywhere, projected)."""
    height = 0.41
    h = height / ny
    nx = round(2.2 / h)
    if fraction:
        one = lambda value: torch.full((1, 1, 1), value, dtype=torch.float64)  # noqa: E731
        mask_u, mask_v, _ = (
            m.to(dtype) for m in disc_fractions(nx, ny, h, Discs(one(0.2), one(0.2), one(0.05)))
        )
    else:
        mask_u, mask_v = disc_mask(nx, ny, h, (0.2, 0.2), 0.05, dtype, width)
    inflow = parabolic_inflow(ny, 1.5, dtype)
    channel = Channel(
        inflow=inflow,
        mask_u=mask_u,
        mask_v=mask_v,
        damping_u=damping(mask_u.double(), dt, eta).to(dtype),
        damping_v=damping(mask_v.double(), dt, eta).to(dtype),
        cell_area=torch.full((1, 1), h * h, dtype=dtype),
    )
    s = lambda value: torch.full((1, 1, 1), value, dtype=dtype)  # noqa: E731
    zero = s(0.0)
    c = FlowCoefficients(
        inverse_spacing=s(1.0 / h),
        diffusion=s(viscosity / h**2),
        dt=s(dt),
        walls=WallSpeeds(zero, zero, zero, zero),
        poisson=PoissonSolver.build(nx, dtype, torch.device("cpu"), ny=ny),
    )
    start = FaceVelocity(
        with_outflow(inflow.expand(1, nx - 1, ny) * (1.0 - mask_u), channel),
        torch.zeros((1, nx, ny - 1), dtype=dtype),
    )
    return channel, c, project(start, channel, c.poisson)


def stable_dt(ny: int, speed: float = 2.0, viscosity: float = 1e-3) -> float:
    """`mac.stable_time_step` on the DFG grid with |u|, |v| <= `speed`."""
    return stable_time_step(speed, viscosity, 0.41 / ny)
