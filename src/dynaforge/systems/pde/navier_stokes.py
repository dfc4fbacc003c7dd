"""Incompressible Navier-Stokes in 2D, vorticity form (see `NavierStokesConfig` for the equations).

With w the vorticity and psi the streamfunction (laplacian(psi) = -w, so psi_hat = w_hat / |k|^2 and the
mean mode of psi is zero), the velocity is u = psi_y, v = -psi_x. L = -nu |k|^2 - drag is treated
exactly; N(w) = -(u w_x + v w_y) + f is evaluated pseudo-spectrally with the 2/3 rule (the state is
truncated before the products, the product after), in flux form -(d_x(u w) + d_y(v w)), equal for the
divergence-free truncated velocity: (u, v, w) by one batched inverse FFT, (u w, v w) by one forward FFT,
both skipping the columns the 2/3 rule zeroes.
Axis order: the first spatial axis is x, the second y. The mean vorticity is conserved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import NON_NEGATIVE, POSITIVE, Range, checked, ranged
from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem


@dataclass
class NavierStokesConfig(SystemConfig):
    """Incompressible Navier-Stokes in vorticity form on [0, L)^2:

    w_t + u . grad(w) = nu laplacian(w) - drag w + f,  u = (psi_y, -psi_x),  laplacian(psi) = -w,
    with Kolmogorov forcing f = -A k_f cos(k_f y), the curl of the body force (A sin(k_f y), 0),
    k_f = 2 pi forcing_wavenumber / L.
    """

    name: str = "navier_stokes"
    ndim: int = 2
    resolution: int = 128
    domain_length: Range = ranged(2 * math.pi)
    dt: float = 0.01
    viscosity: Range = ranged(1e-3, check=POSITIVE.because("kinematic viscosity"))
    """Kinematic viscosity nu."""
    drag: Range = ranged(0.0, check=NON_NEGATIVE.because("drag coefficient"))
    """Linear (Rayleigh) drag coefficient; 0 switches it off."""
    forcing_amplitude: Range = ranged(0.0)
    """Amplitude A of the Kolmogorov body force; 0 switches it off."""
    forcing_wavenumber: int = checked(4, check=NON_NEGATIVE)
    """Integer wavenumber of the Kolmogorov forcing along y."""


class NavierStokes2D(SpectralSystem):
    name = "navier_stokes"
    config_class = NavierStokesConfig
    conserved = ("mass",)
    """The mean vorticity of a periodic flow is 0 and stays 0 (forcing and drag keep it)."""
    supported_ndim = (2,)

    @property
    def channel_names(self) -> tuple[str, ...]:
        """The one channel is the vorticity w (datasets written before this name call it `u`)."""
        return ("vorticity",)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        kx, ky = k
        return -params["viscosity"] * (kx**2 + ky**2) - params["drag"]

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        kx, ky = k
        cdtype = self.complex_dtype
        k2 = kx**2 + ky**2
        inverse_k2 = torch.where(k2 > 0, 1.0 / torch.where(k2 > 0, k2, 1.0), 0.0)
        mask_c = mask.to(cdtype)
        # Multipliers taking w_hat to the truncated (u, v, w) spectra, stacked on the channel axis.
        fields = torch.cat([1j * ky * inverse_k2, -1j * kx * inverse_k2, 1 + 0 * (kx + ky)], dim=1)
        # Only the columns of the last axis the 2/3 rule keeps are multiplied; the rest are zero.
        band = self.kept_band()
        width = self.shape[-1] // 2 + 1
        fields = (fields.to(cdtype) * mask_c)[..., :band].contiguous()  # (batch, 3, X, band)
        divergence = torch.cat([1j * kx + 0 * ky, 1j * ky + 0 * kx], dim=1).to(cdtype) * mask_c
        divergence = divergence[..., :band].contiguous()  # (batch, 2, X, band)
        forcing = self.forcing_spectrum(params)

        def nonlinear(v: Tensor) -> Tensor:
            # u . grad(w) = d_x(u w) + d_y(v w) since d_x u + d_y v = 0 (exactly, for the truncated fields):
            # three inverse transforms and two forward ones instead of four and one.
            parts = self.to_physical_dealiased(fields * v[..., :band])  # (batch, 3, X, Y): u, v, w
            flux = self.to_spectral_band(parts[:, 0:2] * parts[:, 2:3])  # (batch, 2, X, band)
            result = F.pad(-(divergence * flux).sum(dim=1, keepdim=True), (0, width - band))
            return result + forcing if forcing is not None else result

        return nonlinear

    def forcing_spectrum(self, params: dict[str, Tensor]) -> Tensor | None:
        """Spectrum of f = -A k_f cos(k_f y), k_f = 2 pi n_f / L (None when A = 0 for every sample)."""
        amplitude = params["forcing_amplitude"]  # (batch, 1, 1, 1)
        if not bool((amplitude != 0).any()):
            return None
        n = self.config.resolution
        n_f = self.config.forcing_wavenumber
        k_f = 2.0 * math.pi * n_f / params["domain_length"]
        y_phase = 2.0 * math.pi * n_f * torch.arange(n, dtype=amplitude.dtype, device=amplitude.device) / n
        field = -amplitude * k_f * torch.cos(y_phase).view(1, 1, 1, n)  # (batch, 1, 1, Y)
        # One row at a time: a transform's shape must not depend on how many rows are set up together.
        rows = [self.to_spectral(row.expand(1, 1, n, n).contiguous()) for row in field.split(1)]
        return torch.cat(rows).to(self.complex_dtype)
