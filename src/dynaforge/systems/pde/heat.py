"""Heat (diffusion) equation: u_t = nu * laplacian(u), in any dimension.

Linear with L = -nu |k|^2, so every Fourier mode decays exactly as exp(-nu |k|^2 t); the ETD step
integrates it exactly whatever the order.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import POSITIVE, Range, ranged
from dynaforge.systems.pde.spectral import SpectralSystem


@dataclass
class HeatConfig(SystemConfig):
    """u_t = nu * laplacian(u)."""

    name: str = "heat"
    diffusivity: Range = ranged(0.01, check=POSITIVE.because("diffusivity"))
    """Diffusion coefficient nu."""


class Heat(SpectralSystem):
    name = "heat"
    config_class = HeatConfig
    conserved = ("mass",)
    """u_t = nu laplacian(u): the mean mode does not change; energy decays."""
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        return (-params["diffusivity"] * k2).to(k[0].dtype)
