"""Kuramoto-Sivashinsky in its scalar gradient form, any dimension (2D by default):

    h_t + laplacian(h) + laplacian^2(h) + |grad h|^2 / 2 = 0.

L = |k|^2 - |k|^4; N(h) = -FFT(|grad h|^2) / 2 with the 2/3 rule. In 1D, u = h_x obeys the conservative
form of `ks.py`. The mean of h drifts (N has a non-zero mean); every other mode is bounded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import Range, ranged
from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem


@dataclass
class KS2DConfig(SystemConfig):
    """Kuramoto-Sivashinsky in its scalar (gradient) form, any dimension:
    h_t + laplacian(h) + laplacian^2(h) + |grad h|^2 / 2 = 0."""

    name: str = "ks2d"
    ndim: int = 2
    resolution: int = 64
    domain_length: Range = ranged(32.0)
    dt: float = 0.05
    steps: int = 400


class KuramotoSivashinsky2D(SpectralSystem):
    name = "ks2d"
    config_class = KS2DConfig
    conserved = ()
    """Nothing: the mean of h drifts (|grad h|^2 has a non-zero mean)."""
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        return k2 - k2**2

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        """R(h) = FFT(|grad h|^2), the gradients of the truncated state; the transforms skip the columns
        of the last axis the 2/3 rule zeroes (`to_physical_dealiased`, `to_spectral_dealiased`)."""
        band = self.kept_band()
        gradient = torch.cat(
            [(1j * axis_k * mask)[..., :band].to(self.complex_dtype) for axis_k in k], dim=1
        )  # (b, d, ...): the columns the 2/3 rule keeps (the product skips the others)

        def nonlinear(v: Tensor) -> Tensor:
            grad = self.to_physical_dealiased(gradient * v[..., :band])
            return self.to_spectral_dealiased((grad * grad).sum(dim=1, keepdim=True))

        return nonlinear

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        return (-0.5 * mask).to(torch.complex128)  # N = -mask FFT(|grad h|^2) / 2
