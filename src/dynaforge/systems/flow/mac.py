"""Incompressible Navier-Stokes in a walled rectangle on a staggered (MAC) grid: the shared core.

Conventions (every flow system built on it):
- Equations: u_t + (u . grad) u = -grad p + nu laplacian(u), div u = 0, density 1, in the square
  [0, L]^2 cut into n x n cells of side h = L / n; the first spatial axis is x, the second y.
- Grid (Harlow & Welch 1965): pressure at cell centres ((i + 1/2) h, (j + 1/2) h); u at the faces
  x = i h (i = 1 .. n-1 are unknowns, the walls i = 0, n carry u = 0); v at the faces y = j h (j = 1 .. n-1
  unknowns, the walls carry v = 0). No flow crosses a wall; each wall moves along itself at a given speed
  (`WallSpeeds`), imposed through a ghost value (u_ghost = 2 U_wall - u_inside).
- Space: second-order central differences in divergence form (Morinishi et al. 1998), which conserve
  momentum and, for a discretely divergence-free field, kinetic energy up to the wall work.
- Pressure: one exact projection per Runge-Kutta stage. The discrete Laplacian div(grad) with no flux through
  the walls is diagonal in the DCT-II basis on each axis, so the Poisson equation is solved by two products
  with an orthonormal DCT matrix per axis; the projected field is divergence-free to rounding.
- Time: the three-stage strong-stability-preserving Runge-Kutta scheme of Shu & Osher (1988), explicit;
  `stable_time_step` estimates its bound. A steady state of the stepper solves the steady discrete
  equations whatever dt.
- Arithmetic: only additions, subtractions and multiplications of whole tensors (each rounded once,
  the same in a kernel's vector loop and its scalar remainder) and matrix products whose shapes the caller
  fixes (`systems/batching.py`), so a sample's numbers do not depend on where in a block it sits.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

SSP_RK3_IMAGINARY_LIMIT = math.sqrt(3.0)
"""The three-stage SSP Runge-Kutta scheme is stable on the imaginary axis up to |z| = sqrt(3)."""

SSP_RK3_REAL_LIMIT = 2.5127453266183286
"""... and on the negative real axis down to z = -2.5127 (the real root of 1 + z + z^2/2 + z^3/6 = -1)."""


class FaceVelocity(NamedTuple):
    """The unknown face velocities of a batch: u on the inner x-faces, v on the inner y-faces."""

    u: Float[Tensor, "batch nx_minus_1 ny"]
    """(B, n-1, n): u at x = i h, i = 1 .. n-1, y = (j + 1/2) h."""
    v: Float[Tensor, "batch nx ny_minus_1"]
    """(B, n, n-1): v at x = (i + 1/2) h, y = j h, j = 1 .. n-1."""


class WallSpeeds(NamedTuple):
    """Tangential speed of each wall per sample, (B, 1, 1) each: the cavity's lid is `top`."""

    bottom: Tensor
    top: Tensor
    left: Tensor
    right: Tensor


class FlowCoefficients(NamedTuple):
    """Per-sample scalars of a step, (B, 1, 1) in the state dtype, and the pressure solver."""

    inverse_spacing: Tensor
    """1 / h."""
    diffusion: Tensor
    """nu / h^2."""
    dt: Tensor
    """The time step."""
    walls: WallSpeeds
    poisson: PoissonSolver


class PoissonSolver(NamedTuple):
    """Solves the unit-spacing Neumann problem (delta_xx + delta_yy) phi = r on an nx x ny grid of cells, phi
    of zero mean, r of zero mean.

    phi = Qx^T ((Qx r Qy^T) * W) Qy, Q the orthonormal DCT-II matrix of its size (Q[k, m] = s_k cos(pi k
    (m + 1/2) / n)), W = -1 / (4 sin^2(pi k / 2 nx) + 4 sin^2(pi l / 2 ny)) and W[0, 0] = 0 (the mean is not
    determined).
    """

    transform_x: Tensor
    """(nx, nx) Qx."""
    transform_y: Tensor
    """(ny, ny) Qy."""
    inverse_eigenvalues: Tensor
    """(nx, ny) W."""

    @classmethod
    def build(cls, nx: int, dtype: torch.dtype, device: torch.device, ny: int | None = None) -> PoissonSolver:
        """Q and W in float64, rounded once to `dtype` (`ny` defaults to `nx`)."""
        ny = nx if ny is None else ny
        qx, ex = dct_basis(nx, device)
        qy, ey = dct_basis(ny, device)
        eigenvalues = ex[:, None] + ey[None, :]
        inverse = torch.where(eigenvalues > 0, -1.0 / torch.where(eigenvalues > 0, eigenvalues, 1.0), 0.0)
        return cls(qx.to(dtype), qy.to(dtype), inverse.to(dtype))

    def solve(self, r: Float[Tensor, "batch nx ny"]) -> Float[Tensor, "batch nx ny"]:
        qx, qy = self.transform_x, self.transform_y
        spectrum = torch.matmul(torch.matmul(qx, r), qy.T)
        return torch.matmul(torch.matmul(qx.T, spectrum * self.inverse_eigenvalues), qy)


def dct_basis(n: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """The orthonormal DCT-II matrix (n, n) and the eigenvalues 4 sin^2(pi k / 2n) of minus the second
    difference with reflecting ends, float64."""
    k = torch.arange(n, dtype=torch.float64, device=device)
    scale = torch.full((n,), math.sqrt(2.0 / n), dtype=torch.float64, device=device)
    scale[0] = math.sqrt(1.0 / n)  # filling a fresh tensor
    transform = scale[:, None] * torch.cos(math.pi * k[:, None] * (k[None, :] + 0.5) / n)
    return transform, 4.0 * torch.sin(math.pi * k / (2 * n)) ** 2


def with_walls(velocity: FaceVelocity) -> tuple[Tensor, Tensor]:
    """u (B, n+1, n) and v (B, n, n+1) with the zero normal velocity of the walls added."""
    return F.pad(velocity.u, (0, 0, 1, 1)), F.pad(velocity.v, (1, 1))


def raw_divergence(velocity: FaceVelocity) -> Float[Tensor, "batch nx ny"]:
    """h div(u) at the cell centres: (u_{i+1} - u_i) + (v_{j+1} - v_j)."""
    u, v = with_walls(velocity)
    return (u[:, 1:] - u[:, :-1]) + (v[:, :, 1:] - v[:, :, :-1])


def face_gradient(phi: Float[Tensor, "batch nx ny"]) -> FaceVelocity:
    """h grad(phi) on the inner faces."""
    return FaceVelocity(phi[:, 1:] - phi[:, :-1], phi[:, :, 1:] - phi[:, :, :-1])


def project(velocity: FaceVelocity, poisson: PoissonSolver) -> FaceVelocity:
    """The divergence-free part of `velocity` (no flow through the walls): u - grad(phi), laplacian(phi) = div u.

    With unit-spacing differences, h^2 laplacian = delta^2 and h div = delta, so phi h^-1 = delta^-2 (h div u)
    and the correction grad(phi) = delta(delta^-2 (h div u)): no h appears."""
    correction = face_gradient(poisson.solve(raw_divergence(velocity)))
    return FaceVelocity(velocity.u - correction.u, velocity.v - correction.v)


def momentum_tendency(velocity: FaceVelocity, c: FlowCoefficients) -> FaceVelocity:
    """-(u . grad) u + nu laplacian(u) on the inner faces of the closed box (the pressure gradient is the
    projection's)."""
    u, v = with_walls(velocity)  # (B, n+1, n), (B, n, n+1)
    walls = c.walls
    # Ghost rows beyond the walls: the tangential velocity's mean across a wall is the wall's speed.
    u_ghost = torch.cat([2 * walls.bottom - u[:, :, :1], u, 2 * walls.top - u[:, :, -1:]], dim=2)
    v_ghost = torch.cat([2 * walls.left - v[:, :1], v, 2 * walls.right - v[:, -1:]], dim=1)
    return face_tendency(u, v, u_ghost, v_ghost, c)


def face_tendency(
    u: Float[Tensor, "batch nx_plus_1 ny"],
    v: Float[Tensor, "batch nx ny_plus_1"],
    u_ghost: Float[Tensor, "batch nx_plus_1 ny_plus_2"],
    v_ghost: Float[Tensor, "batch nx_plus_2 ny_plus_1"],
    c: FlowCoefficients,
) -> FaceVelocity:
    """-(u . grad) u + nu laplacian(u) on the inner faces, from every face value (`u`, `v`) and the ghost
    values beyond the boundaries along each face's tangential axis (`u_ghost`: u with a ghost row below and
    above; `v_ghost`: v with one left and right)."""
    # Products at cell centres (uu, vv) and at cell corners (uv), from two-point means.
    u_centre = (u[:, 1:] + u[:, :-1]) * 0.5  # (B, nx, ny)
    v_centre = (v[:, :, 1:] + v[:, :, :-1]) * 0.5  # (B, nx, ny)
    u_corner = (u_ghost[:, :, 1:] + u_ghost[:, :, :-1]) * 0.5  # (B, nx+1, ny+1)
    v_corner = (v_ghost[:, 1:] + v_ghost[:, :-1]) * 0.5  # (B, nx+1, ny+1)
    uu = u_centre * u_centre
    vv = v_centre * v_centre
    uv = u_corner * v_corner
    advect_u = (uu[:, 1:] - uu[:, :-1]) + (uv[:, 1:-1, 1:] - uv[:, 1:-1, :-1])  # (B, nx-1, ny)
    advect_v = (uv[:, 1:, 1:-1] - uv[:, :-1, 1:-1]) + (vv[:, :, 1:] - vv[:, :, :-1])  # (B, nx, ny-1)
    inner_u = u_ghost[:, 1:-1, 1:-1]
    inner_v = v_ghost[:, 1:-1, 1:-1]
    laplace_u = (u_ghost[:, 2:, 1:-1] - inner_u - inner_u + u_ghost[:, :-2, 1:-1]) + (
        u_ghost[:, 1:-1, 2:] - inner_u - inner_u + u_ghost[:, 1:-1, :-2]
    )
    laplace_v = (v_ghost[:, 2:, 1:-1] - inner_v - inner_v + v_ghost[:, :-2, 1:-1]) + (
        v_ghost[:, 1:-1, 2:] - inner_v - inner_v + v_ghost[:, 1:-1, :-2]
    )
    return FaceVelocity(
        laplace_u * c.diffusion - advect_u * c.inverse_spacing,
        laplace_v * c.diffusion - advect_v * c.inverse_spacing,
    )


def euler_projected(velocity: FaceVelocity, c: FlowCoefficients) -> FaceVelocity:
    """P(u + dt F(u)): one forward Euler step, projected."""
    tendency = momentum_tendency(velocity, c)
    return project(FaceVelocity(velocity.u + c.dt * tendency.u, velocity.v + c.dt * tendency.v), c.poisson)


def combine(a: float, x: FaceVelocity, b: float, y: FaceVelocity) -> FaceVelocity:
    """a x + b y (each product rounded, then the sum)."""
    return FaceVelocity(a * x.u + b * y.u, a * x.v + b * y.v)


def ssp_rk3_step(velocity: FaceVelocity, c: FlowCoefficients) -> FaceVelocity:
    """One step of the SSP Runge-Kutta scheme of order 3, each stage projected (a divergence-free
    combination of divergence-free fields stays divergence-free)."""
    first = euler_projected(velocity, c)
    second = combine(0.75, velocity, 0.25, euler_projected(first, c))
    return combine(1.0 / 3.0, velocity, 2.0 / 3.0, euler_projected(second, c))


def pressure(velocity: FaceVelocity, c: FlowCoefficients) -> Float[Tensor, "batch n n"]:
    """The pressure (zero mean, at the cell centres) of the state: the p for which F(u) - grad p is
    divergence-free, so u_t = F(u) - grad p (h^2 laplacian(p) = h div F, hence p = h delta^-2(h div F))."""
    tendency = momentum_tendency(velocity, c)
    return c.poisson.solve(raw_divergence(tendency)) * (1.0 / c.inverse_spacing)


def cell_centred(velocity: FaceVelocity) -> tuple[Tensor, Tensor]:
    """u and v at the cell centres (B, n, n): the mean of the two faces of each cell."""
    u, v = with_walls(velocity)
    return (u[:, 1:] + u[:, :-1]) * 0.5, (v[:, :, 1:] + v[:, :, :-1]) * 0.5


def stable_time_step(speed: float, viscosity: float, spacing: float) -> float:
    """An estimate of the largest stable dt of `ssp_rk3_step`: the central-difference advection
    eigenvalues are imaginary, at most (|u| + |v|) / h <= 2 speed / h, the diffusion ones real, at most
    8 nu / h^2 in size; dt (a / sqrt(3) + d / 2.5127) <= 1 keeps their sum inside the scheme's stability
    region (the triangle between the two limits lies inside it). `speed` bounds |u| and |v|."""
    advection = 2.0 * speed / spacing
    diffusion = 8.0 * viscosity / spacing**2
    return 1.0 / (advection / SSP_RK3_IMAGINARY_LIMIT + diffusion / SSP_RK3_REAL_LIMIT)
