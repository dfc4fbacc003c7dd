"""Fisher-KPP reaction-diffusion on a bounded domain: u_t = nu laplacian(u) + r u (1 - u), boundary
conditions per side. Initial fields are mapped to [0, 1] (u0 = (1 + f / a) / 2 for a field f of
`normalize: max` with amplitude a), the range the equation keeps."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from dynaforge.config.base import NON_NEGATIVE, Range
from dynaforge.systems.bounded.core import Stencils
from dynaforge.systems.bounded.system import BoundedSystem, DiffusiveBoundedConfig


@dataclass
class FisherKPPBoundedConfig(DiffusiveBoundedConfig):
    """u_t = nu laplacian(u) + r u (1 - u) on [0, L]^d."""

    name: str = "fisher_kpp_bounded"
    reaction_rate: Range = field(
        default_factory=lambda: Range(1.0, 1.0), metadata={"check": NON_NEGATIVE.because("growth rate")}
    )
    """Logistic growth rate r (per sample)."""


class FisherKPPBounded(BoundedSystem):
    name = "fisher_kpp_bounded"
    config_class = FisherKPPBoundedConfig

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        # in place, into the stage's buffers (`Stencils`), on purpose: D lap(u) + r (u (1 - u))
        u = stencils.u
        # -u + 1 is 1 - u exactly
        reaction = torch.neg(u, out=stencils.term()).add_(1).mul_(u).mul_(params["reaction_rate"])
        return stencils.laplacian().mul_(params["diffusivity"]).add_(reaction)

    def draw_initial(self, rng: np.random.Generator, parameters: np.ndarray) -> np.ndarray:
        field = super().draw_initial(rng, parameters)
        scale = max(float(np.abs(field).max()), 1e-300)
        return 0.5 * (1.0 + field / scale)

    def rate_extents(self) -> tuple[float, float]:
        # The reaction's linearisation r (1 - 2u) lies in [-r, r] on [0, 1]; its size joins the decay rates.
        return self.diffusion_extent("diffusivity") + self.config.reaction_rate.high, 0.0
