"""Swift-Hohenberg pattern formation, a system of your own in one file (docs/user-systems.md).

    u_t = r u - (1 + laplacian)^2 u + g2 u^2 - u^3        on the periodic box [0, L)^d, d = 1 or 2.

In Fourier space (1 + laplacian) is 1 - |k|^2, so the linear part is L(k) = r - (1 - |k|^2)^2: for r > 0 a
band of wavenumbers around |k| = 1 grows (rolls of wavelength 2 pi), everything else decays. The rest,
N(u) = g2 u^2 - u^3, is evaluated on the grid with the 2/3 rule and saturates the growth. The equation is a
gradient flow: the free energy F[u] = mean(-r u^2 / 2 + ((1 + laplacian) u)^2 / 2 - g2 u^3 / 3 + u^4 / 4)
never increases. Nothing is conserved.

Use it from YAML without editing dynaforge, with this folder on the Python path:

    system:
      name: swift_hohenberg:SwiftHohenberg
      r: 0.3

    PYTHONPATH=examples dynaforge generate my.yaml --out data

The file is what a user writes: a config dataclass (fields with their check and documentation) and a
`SpectralSystem` subclass naming it, its linear operator and its nonlinear term; dynaforge's ETDRK stepper,
initial conditions, batching and store do the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import Range, one_of
from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem


@dataclass
class SwiftHohenbergConfig(SystemConfig):
    """u_t = r u - (1 + laplacian)^2 u + g2 u^2 - u^3 (Swift-Hohenberg; examples/swift_hohenberg.py)."""

    name: str = "swift_hohenberg:SwiftHohenberg"
    ndim: int = field(default=1, metadata={"check": one_of(1, 2).because("this example runs in 1D or 2D")})
    resolution: int = 64
    domain_length: Range = field(
        default_factory=lambda: Range(16 * 3.141592653589793, 16 * 3.141592653589793)
    )
    """Length L of the periodic domain (per sample); 16 pi holds 8 rolls of the critical wavelength 2 pi."""
    dt: float = 0.5
    steps: int = 200
    save_every: int = 5
    r: Range = field(default_factory=lambda: Range(0.2, 0.2))
    """Control parameter r: the growth rate of the critical mode |k| = 1 (patterns for r > 0)."""
    g2: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """Quadratic coefficient g2 (0: the symmetric equation, u -> -u; > 0 favours hexagons in 2D)."""


class SwiftHohenberg(SpectralSystem):
    name = "swift_hohenberg"
    config_class = SwiftHohenbergConfig
    conserved = ()
    """Nothing: the flow descends its free energy."""
    supported_ndim = (1, 2)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        return params["r"] - (1.0 - k2) ** 2

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        """R(v) = FFT(g2 u^2 - u^3) of the truncated state u; the mask after the product is the multiplier."""
        mask_c = mask.to(self.complex_dtype)
        g2 = params["g2"]

        def nonlinear(v: Tensor) -> Tensor:
            u = self.to_physical(mask_c * v)
            return self.to_spectral(u * u * (g2 - u))

        return nonlinear

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        return mask.to(torch.complex128)
