"""Advection-diffusion on a bounded domain: u_t + c . grad(u) = nu laplacian(u), a constant velocity c per
sample (`velocity_x`, `velocity_y`), boundary conditions per side. The advection term is centred (second
order); its cell Peclet number |c| h / nu above 2 lets the discrete solution wiggle near an outflow wall."""

from __future__ import annotations

from dataclasses import dataclass, field

from torch import Tensor

from dynaforge.config.base import Range
from dynaforge.systems.bounded.core import Stencils
from dynaforge.systems.bounded.system import BoundedSystem, DiffusiveBoundedConfig


@dataclass
class AdvectionDiffusionBoundedConfig(DiffusiveBoundedConfig):
    """u_t + c . grad(u) = nu laplacian(u) on [0, L]^d."""

    name: str = "advection_diffusion_bounded"
    velocity_x: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """x component of the advecting velocity (per sample)."""
    velocity_y: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """y component of the advecting velocity (per sample; unused in 1D)."""


class AdvectionDiffusionBounded(BoundedSystem):
    name = "advection_diffusion_bounded"
    config_class = AdvectionDiffusionBoundedConfig

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        # in place, into the stage's buffers (`Stencils`), on purpose
        rate = stencils.laplacian().mul_(params["diffusivity"])
        for axis, velocity in enumerate(("velocity_x", "velocity_y")[: self.ndim]):
            rate.sub_(stencils.derivative(axis).mul_(params[velocity]))
        return rate

    def rate_extents(self) -> tuple[float, float]:
        speeds = [getattr(self.config, v) for v in ("velocity_x", "velocity_y")[: self.ndim]]
        oscillation = sum(max(abs(s.low), abs(s.high)) for s in speeds) / self.smallest_spacing
        return self.diffusion_extent("diffusivity"), oscillation
