"""Viscous Burgers equation in 1D: u_t + u u_x = nu u_xx, written as u_t = nu u_xx - (u^2 / 2)_x.

L = -nu k^2 is treated exactly; the conservative nonlinearity N(u) = -(i k / 2) FFT(u^2) is evaluated
pseudo-spectrally with 2/3 dealiasing. The spatial mean of u is conserved.
"""

from __future__ import annotations

from dataclasses import dataclass

from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import POSITIVE, Range, ranged
from dynaforge.systems.pde.spectral import (
    Nonlinear,
    SpectralSystem,
    conservative_quadratic,
    quadratic_multiplier,
)


@dataclass
class BurgersConfig(SystemConfig):
    """u_t + u u_x = nu u_xx."""

    name: str = "burgers"
    viscosity: Range = ranged(0.01, check=POSITIVE.because("kinematic viscosity"))
    """Kinematic viscosity nu."""


class Burgers(SpectralSystem):
    name = "burgers"
    config_class = BurgersConfig
    conserved = ("mass",)
    """u_t + (u^2 / 2)_x = nu u_xx is a conservation law; energy is dissipated by viscosity."""

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        return -params["viscosity"] * k[0] ** 2

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        return conservative_quadratic(self)

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        return quadratic_multiplier(self, k[0], mask)
