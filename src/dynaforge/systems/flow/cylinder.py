"""Flow past a cylinder in a channel, the obstacle a per-sample mask: the DFG 2D-2 setup of Schäfer & Turek
(1996) as a system, each sample with its own cylinder (centre and radius drawn from ranges), Reynolds number
and inflow speed (`CylinderConfig`).

The channel [0, L] x [0, H] (first axis x along the flow, second y across), no-slip walls at y = 0 and
y = H, a parabolic inflow u(y) = 4 U y (H - y) / H^2 (peak U, mean 2U/3) at x = 0, an outflow at x = L; the
cylinder is a volume-penalised mask (`systems/flow/channel.py`, the staggered grid of `mac.py`). The kinematic
viscosity is nu = (2U/3) D / Re, D = 2r, so the DFG default (U = 1.5, r = 0.05, Re = 100) has nu = 1e-3.
Each sample starts from the inflow profile everywhere outside the cylinder (projected), runs `spin_up`
unstored steps (long enough for the wake to start shedding), then stores `steps` more.

Stored channels, at the cell centres x = (i + 1/2) h, y = (j + 1/2) h, h = H / resolution: `u` and `v`
(each the mean of a cell's two faces) and `obstacle`, the mask chi at the cell centre (1 inside the
cylinder, 0 in the fluid, a ramp across its edge): the same in every frame of a sample, so a model sees where
its cylinder is (as Darcy's permeability `a` is its first frame). The centre and radius are also `params`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, ClassVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import POSITIVE, Range, at_least, checked, ranged
from dynaforge.errors import ConfigError
from dynaforge.systems.flow.channel import Channel, Discs, disc_masks, full_faces, project, step, with_outflow
from dynaforge.systems.flow.mac import (
    FaceVelocity,
    FlowCoefficients,
    PoissonSolver,
    WallSpeeds,
    stable_time_step,
)
from dynaforge.systems.flow.system import BlockStepping, FlowSystem

SPEED_BOUND = 4.0 / 3.0
"""|u|, |v| <= this times the inflow peak, for the stability estimate (the flow speeds up past the cylinder:
measured at most 1.26 peaks at 41 cells across, DFG 2D-2)."""

CLEARANCE_CELLS = 1.0
"""Cells of fluid the mask (its ramp included) must leave between itself and the inflow, the walls and the
outflow."""


@dataclass
class CylinderConfig(SystemConfig):
    """Flow past a cylinder in a channel (see `dynaforge.systems.flow.cylinder`). `order` and `initial` are
    not used: the scheme is SSP-RK3 and every sample starts from its inflow profile."""

    name: str = "cylinder"
    ndim: int = 2
    resolution: int = checked(41, check=at_least(8.0).because("cells across the channel"))
    """Cells across the channel n (h = height / n); the grid is round(L / h) x n cells."""
    height: float = field(default=0.41, metadata={"check": POSITIVE.because("channel height H")})
    """Height H of the channel (walls at y = 0 and y = H)."""
    domain_length: Range = ranged(2.2, check=POSITIVE.because("channel length L"))
    """Length L of the channel (one value: every sample has the same grid), rounded to whole cells."""
    dt: float = 0.003
    """Time step of the SSP-RK3 scheme; a value above its estimated stability bound (from resolution,
    inflow_peak.high and the largest viscosity the ranges allow) is refused with the largest safe value."""
    steps: int = 300
    """Stored steps, after `spin_up`."""
    save_every: int = 10
    spin_up: int = checked(0, check=at_least(0.0).because("unstored steps"))
    """Steps taken from the start before the first stored frame (not stored)."""
    reynolds: Range = ranged(100.0, check=POSITIVE.because("Reynolds number"))
    """Re = (2U/3) D / nu: mean inflow speed times diameter over viscosity."""
    inflow_peak: Range = ranged(1.5, check=POSITIVE.because("inflow peak speed"))
    """Peak U of the parabolic inflow profile."""
    centre_x: Range = ranged(0.2, check=POSITIVE.because("cylinder centre x"))
    """x of the cylinder's centre."""
    centre_y: Range = ranged(0.2, check=POSITIVE.because("cylinder centre y"))
    """y of the cylinder's centre."""
    radius: Range = ranged(0.05, check=POSITIVE.because("cylinder radius"))
    """Radius r of the cylinder."""
    penalisation: float = field(default=1e-4, metadata={"check": POSITIVE.because("penalisation time eta")})
    """eta of the volume penalisation -chi u / eta (taken implicitly: any value is stable)."""
    mask_width: float = field(default=0.25, metadata={"check": POSITIVE.because("mask ramp width in cells")})
    """Width in cells of the mask's linear ramp across the cylinder's edge: 0.25 lifts the DFG 2D-2 largest
    lift from 0.71 (1 cell) to 0.88 at 20 cells per diameter (docs/cavity.md, "A sharper mask")."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ndim != 2:
            raise ConfigError(f"system.ndim={self.ndim}: the channel is two-dimensional; set system.ndim=2")
        if self.domain_length.low != self.domain_length.high:
            raise ConfigError(
                f"system.domain_length={{low: {self.domain_length.low:g}, high: {self.domain_length.high:g}}}: "
                f"every sample shares one grid; give one value (system.domain_length={self.domain_length.low:g})"
            )
        self.check_obstacle()
        largest = self.largest_stable_dt()
        if self.dt > largest:
            raise ConfigError(
                f"system.dt={self.dt:g} is above the estimated stability bound of the SSP-RK3 scheme, "
                f"{largest:.4g}, for resolution {self.resolution}, inflow_peak up to {self.inflow_peak.high:g} "
                f"and viscosity up to {self.largest_viscosity():.4g} (reynolds down to {self.reynolds.low:g}); "
                f"set system.dt <= {largest:.4g} (and steps to cover the same time)"
            )

    @property
    def spacing(self) -> float:
        return self.height / self.resolution

    @property
    def cells_along(self) -> int:
        """Cells along the channel: L / h rounded."""
        return max(1, round(self.domain_length.low / self.spacing))

    def check_obstacle(self) -> None:
        """Refuse a cylinder (any the ranges allow) that closes the channel or comes within
        `CLEARANCE_CELLS` of the inflow, a wall or the outflow."""
        h = self.spacing
        reach = self.radius.high + 0.5 * self.mask_width * h  # where the mask's ramp ends
        gap = CLEARANCE_CELLS * h
        length = self.cells_along * h
        if 2.0 * reach + 2.0 * gap > self.height:
            raise ConfigError(
                f"system.radius up to {self.radius.high:g} closes the channel of height {self.height:g} (the "
                f"mask reaches {reach:.4g} from the centre at resolution {self.resolution}); set "
                f"system.radius.high < {0.5 * self.height - gap - 0.5 * self.mask_width * h:.4g}"
            )
        if self.centre_y.low - reach < gap or self.centre_y.high + reach > self.height - gap:
            raise ConfigError(
                f"system.centre_y in [{self.centre_y.low:g}, {self.centre_y.high:g}] lets a cylinder of radius "
                f"up to {self.radius.high:g} touch a wall (y = 0 or {self.height:g}); keep system.centre_y "
                f"within [{reach + gap:.4g}, {self.height - reach - gap:.4g}] or lower system.radius"
            )
        if self.centre_x.low - reach < gap:
            raise ConfigError(
                f"system.centre_x down to {self.centre_x.low:g} lets a cylinder of radius up to "
                f"{self.radius.high:g} cover the inflow (x = 0); set system.centre_x.low >= {reach + gap:.4g}"
            )
        if self.centre_x.high + reach > length - gap:
            raise ConfigError(
                f"system.centre_x up to {self.centre_x.high:g} lets a cylinder of radius up to "
                f"{self.radius.high:g} reach the outflow (x = {length:.4g}); set system.centre_x.high <= "
                f"{length - reach - gap:.4g}"
            )

    def largest_viscosity(self) -> float:
        """nu = (2U/3) 2r / Re at its largest over the ranges."""
        return (2.0 / 3.0) * self.inflow_peak.high * 2.0 * self.radius.high / self.reynolds.low

    @property
    def grid_shape(self) -> tuple[int, int]:
        """Cells along x and along y."""
        return (self.cells_along, self.resolution)

    def largest_stable_dt(self) -> float:
        """`mac.stable_time_step` with |u|, |v| <= `SPEED_BOUND` inflow peaks and the largest viscosity."""
        return stable_time_step(SPEED_BOUND * self.inflow_peak.high, self.largest_viscosity(), self.spacing)


class CylinderFlow(FlowSystem):
    name: ClassVar[str] = "cylinder"
    config_class: ClassVar[type] = CylinderConfig
    stored: ClassVar[tuple[str, str, str]] = ("u", "v", "obstacle")

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The cell centres (i + 1/2) h of each axis, the same for every sample."""
        h = self.config.spacing
        return {
            axis: np.broadcast_to((np.arange(n) + 0.5) * h, (params.shape[0], n)).copy()
            for axis, n in zip(self.axis_names, self.shape, strict=True)
        }

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        return {
            "boundary": "no-slip walls at y = 0 and y = height; parabolic inflow of each sample's inflow_peak at "
            "x = 0; outflow at x = L; a cylinder per sample (centre_x, centre_y, radius) as the mask `obstacle`",
            "boundary_types": ["OPEN", "WALL"],  # x, y in The Well's words (store.format.BOUNDARY_TYPES)
        }

    def divergence_cause(self) -> str:
        return (
            f"the explicit scheme went unstable at system.dt={self.config.dt:g} (the estimated bound "
            f"{self.config.largest_stable_dt():.4g} assumes |u|, |v| <= {SPEED_BOUND:.3g} inflow_peak); "
            f"reduce system.dt"
        )

    # ---- stepping -------------------------------------------------------------------------------

    def setup(self, params: Float[Tensor, "batch n_params"]) -> tuple[Channel, FlowCoefficients, Tensor]:
        """The channel (inflow, masks and their damping), the coefficients and chi at the cell centres of a
        batch, computed in float64 and rounded once to the state dtype."""
        config, names, dtype = self.config, self.parameter_names, self.real_dtype
        params = params.to(torch.float64)
        reynolds, peak, cx, cy, radius = (
            params[:, names.index(k)].view(-1, 1, 1)
            for k in ("reynolds", "inflow_peak", "centre_x", "centre_y", "radius")
        )
        nx, ny = self.shape
        h = config.spacing
        mask_u, mask_v, mask_c = disc_masks(nx, ny, h, Discs(cx, cy, radius), config.mask_width)
        y = (torch.arange(ny, dtype=torch.float64, device=params.device) + 0.5) / ny
        inflow = 4.0 * peak * (y * (1.0 - y)).view(1, 1, ny)
        dt, eta = config.dt, config.penalisation
        channel = Channel(
            inflow=inflow.to(dtype),
            mask_u=mask_u.to(dtype),
            mask_v=mask_v.to(dtype),
            damping_u=(1.0 / (1.0 + dt * mask_u / eta)).to(dtype),
            damping_v=(1.0 / (1.0 + dt * mask_v / eta)).to(dtype),
            cell_area=torch.full((params.shape[0], 1), h * h, dtype=dtype, device=params.device),
        )
        viscosity = (2.0 / 3.0) * peak * 2.0 * radius / reynolds
        scalar = torch.ones_like(peak)
        zero = (scalar * 0.0).to(dtype)
        c = FlowCoefficients(
            inverse_spacing=(scalar / h).to(dtype),
            diffusion=(viscosity * (1.0 / (h * h))).to(dtype),
            dt=(scalar * dt).to(dtype),
            walls=WallSpeeds(zero, zero, zero, zero),
            poisson=PoissonSolver.build(nx, dtype, params.device, ny=ny),
        )
        return channel, c, mask_c.to(dtype)

    def start(self, channel: Channel, c: FlowCoefficients) -> FaceVelocity:
        """The inflow profile everywhere outside the cylinder, projected."""
        nx, ny = self.shape
        batch = channel.inflow.shape[0]
        inner = channel.inflow.expand(batch, nx - 1, ny) * (1.0 - channel.mask_u)
        v = torch.zeros((batch, nx, ny - 1), dtype=self.real_dtype, device=inner.device)
        return project(FaceVelocity(with_outflow(inner, channel), v), channel, c.poisson)

    def frame(self, velocity: FaceVelocity, channel: Channel, obstacle: Tensor) -> Tensor:
        """(B, 3, nx, ny): u and v at the cell centres, and chi there."""
        u, v = full_faces(velocity, channel)
        return torch.stack(
            [(u[:, 1:] + u[:, :-1]) * 0.5, (v[:, :, 1:] + v[:, :, :-1]) * 0.5, obstacle], dim=1
        )

    def spin_up_steps(self) -> int:
        return self.config.spin_up

    def block_stepping(self, params: Float[Tensor, "batch n_params"]) -> BlockStepping:
        """From the inflow profile outside the cylinder (projected), penalised SSP-RK3 steps."""
        channel, c, obstacle = self.setup(params)
        return BlockStepping(
            self.start(channel, c),
            lambda velocity: step(velocity, channel, c)[0],
            lambda velocity: self.frame(velocity, channel, obstacle),
        )
