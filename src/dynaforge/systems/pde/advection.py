"""Linear advection: u_t + c . grad(u) = 0 with the same speed c along every axis.

Linear with L = -i c sum(k): the solution is the initial field shifted by c t (periodically), which the
ETD step reproduces exactly in Fourier space.
"""

from __future__ import annotations

from torch import Tensor

from dynaforge.config import AdvectionConfig
from dynaforge.systems.pde.spectral import SpectralSystem


class Advection(SpectralSystem):
    name = "advection"
    config_class = AdvectionConfig
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k_sum = sum(k)
        return -1j * params["speed"] * k_sum
