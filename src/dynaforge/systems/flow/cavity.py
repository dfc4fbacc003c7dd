"""The lid-driven cavity: incompressible flow in a closed square whose top wall slides along itself.

The fluid starts at rest and the lid moves at its speed U from t = 0 (an impulsively started lid); each
sample has its own Reynolds number Re = U L / nu, lid speed U and side L (`CavityConfig`), so the
kinematic viscosity is nu = U L / Re. The walls are no-slip: u = v = 0 on the bottom, left and right
walls, u = U, v = 0 on the lid. Solved on the staggered grid of `systems/flow/mac.py` (docs/cavity.md).

Stored channels, at the cell centres x = (i + 1/2) h, y = (j + 1/2) h, h = L / n (first axis x, second
y; the walls lie half a cell outside the grid): `u` and `v`, each the mean of a cell's two faces, and
`pressure`, the pressure (per unit density, zero mean) of the stored velocity.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import POSITIVE, Range, at_least, checked, ranged
from dynaforge.errors import ConfigError
from dynaforge.systems.flow.mac import (
    FaceVelocity,
    FlowCoefficients,
    PoissonSolver,
    WallSpeeds,
    cell_centred,
    pressure,
    raw_divergence,
    ssp_rk3_step,
    stable_time_step,
)
from dynaforge.systems.flow.system import BlockStepping, FlowSystem


class SteadyState(NamedTuple):
    """What `LidDrivenCavity.steady_state` returns."""

    velocity: FaceVelocity
    steps: int
    """Steps taken."""
    change: float
    """The largest max |u(t + T) - u(t)| / (T U) of the batch over the last check interval T."""


class CentreLines(NamedTuple):
    """Velocities on the cavity's centre lines, walls included, positions in units of L (float64, numpy).

    `u` along the vertical line x = L/2 (the faces there), at heights `y`; `v` along the horizontal line
    y = L/2, at `x`. Both start and end at a wall (values 0, or the lid speed)."""

    y: np.ndarray
    """(n + 2,) 0, (j + 1/2) / n, 1."""
    u: np.ndarray
    """(batch, n + 2)."""
    x: np.ndarray
    """(n + 2,)."""
    v: np.ndarray
    """(batch, n + 2)."""


@dataclass
class CavityConfig(SystemConfig):
    """The lid-driven cavity on [0, L]^2 (see `dynaforge.systems.flow.cavity`). `order` and `initial` are
    not used: the scheme is SSP-RK3 and every sample starts at rest."""

    name: str = "cavity"
    ndim: int = 2
    resolution: int = checked(64, check=at_least(8.0).because("cells per side"))
    """Cells per side n (grid spacing h = L / n); the stored fields are n x n."""
    dt: float = 0.004
    """Time step of the SSP-RK3 scheme; a value above its estimated stability bound (from resolution,
    lid_speed.high, reynolds.low and domain_length.low) is refused with the largest safe value."""
    steps: int = 4000
    save_every: int = 40
    domain_length: Range = ranged(1.0, check=POSITIVE.because("cavity side L"))
    """Side L of the square cavity."""
    reynolds: Range = ranged(100.0, 1000.0, check=POSITIVE.because("Reynolds number"))
    """Reynolds number Re = U L / nu."""
    lid_speed: Range = ranged(1.0, check=POSITIVE.because("lid speed"))
    """Speed U of the lid (the top wall moves in +x)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ndim != 2:
            raise ConfigError(f"system.ndim={self.ndim}: the cavity is two-dimensional; set system.ndim=2")
        largest = self.largest_stable_dt()
        if self.dt > largest:
            raise ConfigError(
                f"system.dt={self.dt:g} is above the estimated stability bound of the SSP-RK3 scheme, "
                f"{largest:.4g}, for resolution {self.resolution}, lid_speed up to {self.lid_speed.high:g}, "
                f"reynolds down to {self.reynolds.low:g} and domain_length down to {self.domain_length.low:g}; "
                f"set system.dt <= {largest:.4g} (and steps to cover the same time)"
            )

    @property
    def grid_shape(self) -> tuple[int, int]:
        """Cells along x and along y."""
        return (self.resolution, self.resolution)

    def largest_stable_dt(self) -> float:
        """`mac.stable_time_step` for the fastest, most viscous (per cell) sample the ranges allow: both of
        its terms grow with U and n / L, the viscous one also with 1 / Re."""
        speed, side = self.lid_speed.high, self.domain_length.low
        return stable_time_step(speed, speed * side / self.reynolds.low, side / self.resolution)


class LidDrivenCavity(FlowSystem):
    name: ClassVar[str] = "cavity"
    config_class: ClassVar[type] = CavityConfig
    stored: ClassVar[tuple[str, str, str]] = ("u", "v", "pressure")

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The cell centres (i + 1/2) L / n of each axis, per sample."""
        side = params[:, list(self.parameter_names).index("domain_length")]
        centres = (np.arange(self.config.resolution) + 0.5) / self.config.resolution
        return {axis: side[:, None] * centres[None, :] for axis in self.axis_names}

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        return {
            "boundary": "no-slip walls; the top wall (y = L) moves in +x at each sample's lid_speed",
            "boundary_types": ["WALL", "WALL"],  # x, y in The Well's words (store.format.BOUNDARY_TYPES)
        }

    def divergence_cause(self) -> str:
        return (
            f"the explicit scheme went unstable at system.dt={self.config.dt:g} (the estimated bound "
            f"{self.config.largest_stable_dt():.4g} assumes |u|, |v| <= lid_speed); reduce system.dt"
        )

    # ---- stepping -------------------------------------------------------------------------------

    def coefficients(self, params: Float[Tensor, "batch n_params"]) -> FlowCoefficients:
        """The per-sample scalars of a step, computed in float64 and rounded once to the state dtype."""
        names = self.parameter_names
        params = params.to(torch.float64)
        side, reynolds, speed = (
            params[:, names.index(k)].view(-1, 1, 1) for k in ("domain_length", "reynolds", "lid_speed")
        )
        n = self.config.resolution
        zero = torch.zeros_like(speed).to(self.real_dtype)
        return FlowCoefficients(
            inverse_spacing=(n / side).to(self.real_dtype),
            diffusion=(speed * n * n / (reynolds * side)).to(self.real_dtype),
            dt=torch.full_like(speed, self.config.dt).to(self.real_dtype),
            walls=WallSpeeds(bottom=zero, top=speed.to(self.real_dtype), left=zero, right=zero),
            poisson=PoissonSolver.build(n, self.real_dtype, params.device),
        )

    def at_rest(self, batch: int, device: torch.device) -> FaceVelocity:
        n = self.config.resolution
        return FaceVelocity(
            torch.zeros((batch, n - 1, n), dtype=self.real_dtype, device=device),
            torch.zeros((batch, n, n - 1), dtype=self.real_dtype, device=device),
        )

    def frame(self, velocity: FaceVelocity, c: FlowCoefficients) -> Float[Tensor, "batch 3 n n"]:
        u, v = cell_centred(velocity)
        return torch.stack([u, v, pressure(velocity, c)], dim=1)

    def block_stepping(self, params: Float[Tensor, "batch n_params"]) -> BlockStepping:
        """From rest, SSP-RK3 steps."""
        c = self.coefficients(params)
        return BlockStepping(
            self.at_rest(params.shape[0], params.device),
            lambda velocity: ssp_rk3_step(velocity, c),
            lambda velocity: self.frame(velocity, c),
        )

    # ---- steady states (the Ghia, Ghia & Shin check) ------------------------------------------------

    def steady_state(
        self,
        params: Float[Tensor, "batch n_params"],
        tolerance: float,
        check_every: int = 100,
        max_steps: int = 200_000,
    ) -> SteadyState:
        """Step the batch from rest until the velocity changes by less than `tolerance` lid speeds per unit
        time (max |u(t + T) - u(t)| / (T U) over every face and sample, T = `check_every` steps), or
        `max_steps`; one block, on the calling thread."""
        c = self.coefficients(params)
        velocity = self.at_rest(params.shape[0], params.device)
        scale = 1.0 / (check_every * self.config.dt * c.walls.top.to(torch.float64))  # (B, 1, 1)
        change = math.inf
        steps = 0
        while steps < max_steps:
            previous = velocity
            for _ in range(check_every):
                velocity = ssp_rk3_step(velocity, c)
            steps += check_every
            change = max(
                float(((now - before).abs().to(torch.float64) * scale).max())
                for now, before in zip(velocity, previous, strict=True)
            )
            if change < tolerance:
                break
        return SteadyState(velocity, steps, change)

    def centre_lines(self, velocity: FaceVelocity, params: Float[Tensor, "batch n_params"]) -> CentreLines:
        """u on x = L/2 and v on y = L/2 (an even `resolution` puts faces on both lines)."""
        n = self.config.resolution
        if n % 2:
            raise ConfigError(f"centre lines need an even system.resolution, got {n}")
        speed = params[:, self.parameter_names.index("lid_speed")].to(torch.float64).cpu().numpy()
        u = velocity.u[:, n // 2 - 1].to(torch.float64).cpu().numpy()  # (B, n): x = L/2, y = (j + 1/2) h
        v = velocity.v[:, :, n // 2 - 1].to(torch.float64).cpu().numpy()  # (B, n): y = L/2
        zeros = np.zeros((u.shape[0], 1))
        positions = np.concatenate([[0.0], (np.arange(n) + 0.5) / n, [1.0]])
        return CentreLines(
            y=positions,
            u=np.concatenate([zeros, u, speed[:, None]], axis=1),
            x=positions,
            v=np.concatenate([zeros, v, zeros], axis=1),
        )

    def divergence(self, velocity: FaceVelocity, params: Float[Tensor, "batch n_params"]) -> Tensor:
        """div u at the cell centres (B, n, n)."""
        return raw_divergence(velocity) * self.coefficients(params).inverse_spacing
