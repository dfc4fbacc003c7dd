"""Heat (diffusion) equation on a bounded domain: u_t = nu laplacian(u), boundary conditions per side."""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynaforge.systems.bounded.core import Stencils
from dynaforge.systems.bounded.system import BoundedSystem, DiffusiveBoundedConfig


@dataclass
class HeatBoundedConfig(DiffusiveBoundedConfig):
    """u_t = nu laplacian(u) on [0, L]^d."""

    name: str = "heat_bounded"


class HeatBounded(BoundedSystem):
    name = "heat_bounded"
    config_class = HeatBoundedConfig

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        return stencils.laplacian().mul_(params["diffusivity"])  # into the stage's buffer, on purpose

    def rate_extents(self) -> tuple[float, float]:
        return self.diffusion_extent("diffusivity"), 0.0
