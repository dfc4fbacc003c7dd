"""Kuramoto-Sivashinsky equation in 1D: u_t + u u_x + u_xx + u_xxxx = 0.

L = k^2 - k^4 (long waves grow, short waves are damped); N(u) = -(i k / 2) FFT(u^2) as for Burgers.
Chaotic for domain lengths above about 2 pi * 3; the classic benchmark uses L = 32 pi or L = 100.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import Range, ranged
from dynaforge.systems.pde.spectral import (
    Nonlinear,
    SpectralSystem,
    conservative_quadratic,
    quadratic_multiplier,
)


@dataclass
class KSConfig(SystemConfig):
    """u_t + u u_x + u_xx + u_xxxx = 0 (Kuramoto-Sivashinsky)."""

    name: str = "ks"
    domain_length: Range = ranged(100.0)
    resolution: int = 200
    dt: float = 0.1
    steps: int = 500


class KuramotoSivashinsky(SpectralSystem):
    name = "ks"
    config_class = KSConfig
    conserved = ("mass",)
    """Every term of u_t = -(u^2/2)_x - u_xx - u_xxxx is a derivative; energy is not conserved."""

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = k[0] ** 2
        return k2 - k2**2

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        return conservative_quadratic(self)

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        return quadratic_multiplier(self, k[0], mask)
