"""Coefficients of exponential time differencing Runge-Kutta schemes (Cox & Matthews 2002).

For a semi-linear problem v' = L v + N(v) with diagonal L (in Fourier space), each scheme of order 1-4 is
a handful of products of v and N(.) with functions of z = h L:

    phi_0(z) = e^z,  phi_k(z) = (phi_{k-1}(z) - 1/(k-1)!) / z.

Evaluated directly, phi_k cancels catastrophically for small |z|. Following Kassam & Trefethen (2005,
SIAM J. Sci. Comput. 26:1214), they are evaluated as the mean of phi_k over a circle of radius 1
around z (Cauchy's integral formula), which is accurate for every z. The circle is computed in
complex128 and the coefficients are cast down to the solver's precision afterwards.

The algorithms that use these coefficients live in `spectral.py`; this file holds only the tables.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Complex, Inexact
from torch import Tensor

from dynaforge.errors import ConfigError

CONTOUR_POINTS = 32
"""Points on the contour; 32 gives double-precision phi_k for |z| up to ~1e3 (Kassam & Trefethen use 32)."""

NEAR_ORIGIN = 0.5
"""Contour points closer than this to 0 are evaluated by Taylor series instead of the recurrence.

When |z| is close to the contour radius, a contour point w can land very near the origin, where the
recurrence phi_k = (phi_{k-1} - 1/(k-1)!) / w divides rounding errors by |w|^k (measured: 2.5e-11 relative
error in phi_3 for |z| ~ 1 with the plain recurrence). The series sum_j w^j / (j + k)! is exact to
rounding there; 24 terms leave a truncation error below 0.5^24 / 24! ~ 1e-31.
"""

TAYLOR_TERMS = 24


def phi_functions(
    z: Complex[Tensor, "*shape"], count: int, points: int = CONTOUR_POINTS
) -> list[Complex[Tensor, "*shape"]]:
    """phi_1(z) ... phi_count(z) by the contour-integral method (z is complex128)."""
    if z.dtype != torch.complex128:
        raise TypeError(f"phi_functions needs complex128 input for accuracy, got {z.dtype}")
    # For real z (diffusion, Burgers, KS) the contour points come in conjugate pairs and
    # phi_k(conj w) = conj phi_k(w), so the mean over the circle is the real part of the mean over its
    # upper half: half the work (Kassam & Trefethen do the same).
    real_axis = points % 2 == 0 and not bool(z.imag.any())
    used = points // 2 if real_axis else points
    angles = 2.0 * math.pi * (torch.arange(used, dtype=torch.float64, device=z.device) + 0.5) / points
    circle = torch.polar(torch.ones_like(angles), angles)  # (used,)
    w = z.unsqueeze(-1) + circle  # (*shape, used): contour points around each z
    inverse_w = 1.0 / w  # one division; each step of the recurrence then multiplies
    near = contour_points_near_origin(z, w)
    w_near = w[near]  # usually a handful of points, or none
    phi = torch.exp(w)
    result = []
    for k in range(1, count + 1):
        phi = (phi - 1.0 / math.factorial(k - 1)) * inverse_w
        if w_near.numel():
            phi = phi.index_put((near,), phi_taylor(w_near, k))
        mean = phi.mean(dim=-1)
        result.append(mean.real.to(torch.complex128) if real_axis else mean)
    return result


def contour_points_near_origin(z: Complex[Tensor, "*shape"], w: Complex[Tensor, "*shape points"]) -> Tensor:
    """Boolean mask of the contour points w with |w| < NEAR_ORIGIN (only z within 1 + NEAR_ORIGIN of 0 can
    have any, so |w| is computed for those alone)."""
    near = torch.zeros(w.shape, dtype=torch.bool, device=w.device)
    candidates = z.abs() < 1.0 + NEAR_ORIGIN
    if bool(candidates.any()):
        near[candidates] = w[candidates].abs() < NEAR_ORIGIN  # in-place fill of a fresh mask
    return near


def phi_taylor(w: Complex[Tensor, " n"], k: int) -> Complex[Tensor, " n"]:
    """phi_k(w) = sum_{j >= 0} w^j / (j + k)! by Horner's rule, accurate for |w| <= NEAR_ORIGIN."""
    total = torch.full_like(w, 1.0 / math.factorial(TAYLOR_TERMS - 1 + k))
    for j in range(TAYLOR_TERMS - 2, -1, -1):
        total = total * w + 1.0 / math.factorial(j + k)
    return total


class ETDCoefficients(NamedTuple):
    """Diagonal multipliers of one ETDRK step, broadcastable against the spectral state.

    `E` = e^{hL}, `E2` = e^{hL/2}, `P` = h phi1(hL) (a full Euler-like step), `Q` = (h/2) phi1(hL/2)
    (a half step), and `f1, f2, f3` weight the stage nonlinearities in the final combination
    (Cox & Matthews' notation). Coefficients a scheme does not use are None.
    """

    order: int
    E: Tensor
    P: Tensor | None
    E2: Tensor | None
    Q: Tensor | None
    f1: Tensor | None
    f2: Tensor | None
    f3: Tensor | None


def etd_coefficients(
    linear: Inexact[Tensor, "*shape"],
    dt: float,
    order: int,
    dtype: torch.dtype,
    multiplier: Complex[Tensor, "*multiplier_shape"] | None = None,
) -> ETDCoefficients:
    """Coefficients of the ETDRK scheme of `order` for step `dt` and diagonal operator `linear`.

    `multiplier` (complex128, optional) is a diagonal factor M of the nonlinear term, N(v) = M R(v): it is
    folded into every coefficient that multiplies a nonlinear evaluation (P, Q, f1, f2, f3) before they are
    rounded to `dtype`, so that a step evaluates R alone and saves one product per evaluation.

    With h = dt and z = hL:
    - order 1 (ETD Euler) uses P = h phi1(z);
    - order 2 (ETDRK2) uses P and f2 = h phi2(z);
    - orders 3 and 4 (ETDRK3, ETDRK4) use E2, Q = (h/2) phi1(z/2) for the half-step stages, P (order 3
      only) and f1 = h (phi1 - 3 phi2 + 4 phi3), f2 = h (phi2 - 2 phi3), f3 = h (4 phi3 - phi2).
    `dtype` is the complex dtype of the solver state.
    """
    if order not in (1, 2, 3, 4):
        raise ConfigError(f"ETDRK order (system.order) must be 1, 2, 3 or 4, got {order}")
    z = linear.to(torch.complex128) * dt
    E = torch.exp(z).to(dtype)
    factor = 1.0 if multiplier is None else multiplier.to(torch.complex128)

    def weight(values: Tensor) -> Tensor:
        return (values * factor).to(dtype)

    if order <= 2:
        phi = phi_functions(z, order)
        f2 = weight(dt * phi[1]) if order == 2 else None
        return ETDCoefficients(order, E, weight(dt * phi[0]), None, None, None, f2, None)
    phi1, phi2, phi3 = phi_functions(z, 3)
    (half_phi1,) = phi_functions(z / 2, 1)
    return ETDCoefficients(
        order=order,
        E=E,
        P=weight(dt * phi1) if order == 3 else None,
        E2=torch.exp(z / 2).to(dtype),
        Q=weight(dt / 2 * half_phi1),
        f1=weight(dt * (phi1 - 3 * phi2 + 4 * phi3)),
        f2=weight(dt * (phi2 - 2 * phi3)),
        f3=weight(dt * (4 * phi3 - phi2)),
    )
