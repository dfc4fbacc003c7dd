"""Heat (diffusion) equation: u_t = nu * laplacian(u), in any dimension.

Linear with L = -nu |k|^2, so every Fourier mode decays exactly as exp(-nu |k|^2 t); the ETD step
integrates it exactly whatever the order.
"""

from __future__ import annotations

from torch import Tensor

from dynaforge.config import HeatConfig
from dynaforge.systems.pde.spectral import SpectralSystem


class Heat(SpectralSystem):
    name = "heat"
    config_class = HeatConfig
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        return (-params["diffusivity"] * k2).to(k[0].dtype)
