"""Linear advection: u_t + c . grad(u) = 0 with the same speed c along every axis.

Linear with L = -i c sum(k): the solution is the initial field shifted by c t (periodically), which the
ETD step reproduces exactly in Fourier space.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import Range, ranged
from dynaforge.systems.pde.spectral import SpectralSystem


@dataclass
class AdvectionConfig(SystemConfig):
    """u_t + c u_x = 0 (c along every axis in more than one dimension)."""

    name: str = "advection"
    speed: Range = ranged(1.0)
    """Transport speed c."""


class Advection(SpectralSystem):
    name = "advection"
    config_class = AdvectionConfig
    conserved = ("mass", "energy")
    """u_t + c u_x = 0 translates u: every mode keeps its amplitude."""
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k_sum = sum(k)
        return -1j * params["speed"] * k_sum
