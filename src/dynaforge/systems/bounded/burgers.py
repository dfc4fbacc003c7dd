"""Viscous Burgers equation on a bounded domain: u_t + sum_i (u^2 / 2)_{x_i} = nu laplacian(u) (in 2D the
scalar Burgers equation with the same flux along both axes), boundary conditions per side. The flux is
differenced centrally in conservative form."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dynaforge.config.base import POSITIVE, Range
from dynaforge.systems.bounded.core import Stencils
from dynaforge.systems.bounded.system import BoundedConfig, BoundedSystem


@dataclass
class BurgersBoundedConfig(BoundedConfig):
    """u_t + div(u^2 / 2 (1, .., 1)) = nu laplacian(u) on [0, L]^d."""

    name: str = "burgers_bounded"
    viscosity: Range = field(
        default_factory=lambda: Range(0.01, 0.01), metadata={"check": POSITIVE.because("kinematic viscosity")}
    )
    """Kinematic viscosity nu (per sample)."""


def half_square(u: Tensor, out: Tensor) -> Tensor:
    """u^2 / 2, written into `out`."""
    return torch.mul(u, u, out=out).mul_(0.5)


class BurgersBounded(BoundedSystem):
    name = "burgers_bounded"
    config_class = BurgersBoundedConfig

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        # in place, into the stage's buffers (`Stencils`), on purpose
        rate = stencils.laplacian().mul_(params["viscosity"])
        for axis in range(self.ndim):
            rate.sub_(stencils.derivative(axis, half_square))
        return rate

    def speed_bound(self) -> float:
        """max |u| the rollout should keep (maximum principle): the initial field's bound (`normalize: max`:
        its amplitude; otherwise 4 amplitudes, a generous bound for unit-variance fields) or a Dirichlet
        value's, whichever is larger."""
        initial = self.config.initial
        start = initial.amplitude if initial.normalize == "max" else 4.0 * initial.amplitude
        return max(start, self.largest_boundary_value())

    def rate_extents(self) -> tuple[float, float]:
        return self.diffusion_extent("viscosity"), self.ndim * self.speed_bound() / self.smallest_spacing
