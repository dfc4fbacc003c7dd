"""ETD coefficients: phi functions by the contour integral against closed forms and Taylor series.

phi_1(z) = (e^z - 1) / z, phi_2 = (e^z - 1 - z) / z^2, phi_3 = (e^z - 1 - z - z^2/2) / z^3. Evaluated
directly, phi_k(z) carries an absolute rounding error of a few eps * S_k(z), with
S_k(z) = (|e^z| + sum_{j<k} |z|^j / j!) / |z|^k the size of its largest term; that is accurate once |z| is
not small. Near z = 0 the Taylor series sum_j z^j / (j + k)! is the truth instead.
"""

from __future__ import annotations

import math

import pytest
import torch

from dynaforge.systems.pde.etdrk import etd_coefficients, phi_functions

EPS = torch.finfo(torch.float64).eps


def phi_direct(z: torch.Tensor) -> list[torch.Tensor]:
    e = torch.exp(z)
    return [(e - 1) / z, (e - 1 - z) / z**2, (e - 1 - z - z**2 / 2) / z**3]


def phi_series(z: torch.Tensor, k: int, terms: int = 20) -> torch.Tensor:
    return sum(z**j / float(math.factorial(j + k)) for j in range(terms))


def term_size(z: torch.Tensor, k: int) -> torch.Tensor:
    """S_k(z): the size of the largest term of the closed form of phi_k (see the module docstring)."""
    return (torch.exp(z).abs() + sum(z.abs() ** j / math.factorial(j) for j in range(k))) / z.abs() ** k


def polar_grid(low: float, high: float, radii: int = 60, angles: int = 72) -> torch.Tensor:
    """Points with |z| log-spaced in [10^low, 10^high] on rays all around the origin, complex128."""
    r = torch.logspace(low, high, radii, dtype=torch.float64)
    theta = 2 * math.pi * torch.arange(angles, dtype=torch.float64) / angles
    return torch.polar(r[:, None].expand(-1, angles), theta[None, :].expand(radii, -1)).reshape(-1)


def test_phi_matches_taylor_series_near_zero() -> None:
    z = torch.cat([polar_grid(-8, -1), torch.zeros(1, dtype=torch.complex128)])
    for k, phi in enumerate(phi_functions(z, 3), start=1):
        exact = phi_series(z, k)  # 20 terms: truncation error < 0.1^20 / 20!, far below rounding
        error = ((phi - exact).abs() / exact.abs()).max().item()
        # phi_k(0) = 1/k!; the contour average of O(1) values has a relative rounding error of a few eps.
        assert error < 1e-14, f"phi_{k}: relative error {error:.2e} near z = 0"


def test_phi_matches_closed_form_all_around_the_origin() -> None:
    # 0.5 <= |z| <= 100 in every direction with Re z <= 10 (stiff linear operators have Re z <= 0; KS has
    # small positive z). This ring includes |z| ~ 1, where contour points pass close to the origin.
    z = polar_grid(math.log10(0.5), 2)
    z = z[z.real <= 10]
    for k, (phi, exact) in enumerate(zip(phi_functions(z, 3), phi_direct(z)), start=1):
        # Both sides are accurate to a few eps * S_k (measured max: 5.2); 32 leaves room for platform libm
        # differences and rejects any error of the method (a wrong phi_k is off by O(|phi_k|) >> eps S_k).
        ratio = ((phi - exact).abs() / (EPS * term_size(z, k))).max().item()
        assert ratio < 32, f"phi_{k}: error {ratio:.1f} eps * S_k"


def test_phi_on_the_negative_real_axis_up_to_very_stiff() -> None:
    # Diffusion and KS: z = -nu k^2 dt reaches 1e4 for fine grids; there e^z vanishes and the closed form
    # is accurate to a few ulp, so the contour result must match to a relative 1e-14 (measured 2e-15).
    z = -torch.logspace(-0.3, 4, 200, dtype=torch.float64).to(torch.complex128)
    for k, (phi, exact) in enumerate(zip(phi_functions(z, 3), phi_direct(z)), start=1):
        error = ((phi - exact).abs() / exact.abs()).max().item()
        assert error < 1e-14, f"phi_{k}: relative error {error:.2e}"


def test_phi_on_the_imaginary_axis() -> None:
    # Advection: z = -i c k dt. The contour points w = z + e^{i theta} are rounded with an absolute error
    # ~eps |z|, which exp turns into a relative error ~eps |z| of e^w: the bound is a few eps (1 + |z|) S_k
    # (measured max: 0.5 eps |z| S_k up to |z| = 1e3).
    z = 1j * torch.logspace(-0.3, 3, 200, dtype=torch.float64)
    for k, (phi, exact) in enumerate(zip(phi_functions(z, 3), phi_direct(z)), start=1):
        ratio = ((phi - exact).abs() / (EPS * (1 + z.abs()) * term_size(z, k))).max().item()
        assert ratio < 4, f"phi_{k}: error {ratio:.1f} eps (1 + |z|) S_k"


def test_phi_needs_complex128() -> None:
    with pytest.raises(TypeError, match="complex128"):
        phi_functions(torch.zeros(3, dtype=torch.complex64), 1)


def cox_matthews_weights(z: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ETDRK4 weights f1, f2, f3 divided by h, in the closed form of Cox & Matthews (2002)."""
    e = torch.exp(z)
    f1 = (-4 - z + e * (4 - 3 * z + z**2)) / z**3
    f2 = (2 + z + e * (-2 + z)) / z**3
    f3 = (-4 - 3 * z - z**2 + e * (4 - z)) / z**3
    return f1, f2, f3


@pytest.mark.parametrize("direction", [-1.0 + 0j, 1j, -0.6 + 0.8j])
def test_etdrk4_weights_match_cox_matthews(direction: complex) -> None:
    # 5 <= |z| <= 200, where the closed forms lose little to cancellation (measured max 1.7e-13 relative).
    dt = 0.1
    z = direction * torch.logspace(math.log10(5), math.log10(200), 50, dtype=torch.float64)
    linear = (z / dt).to(torch.complex128)
    z = linear * dt  # the z the solver sees: (z / dt) * dt may differ from z in the last bit
    c = etd_coefficients(linear, dt, order=4, dtype=torch.complex128)
    for name, got, exact in zip(("f1", "f2", "f3"), (c.f1, c.f2, c.f3), cox_matthews_weights(z)):
        error = ((got / dt - exact).abs() / exact.abs()).max().item()
        assert error < 1e-12, f"{name}: relative error {error:.2e} along {direction}"
    torch.testing.assert_close(c.E, torch.exp(z), rtol=1e-15, atol=0)
    torch.testing.assert_close(c.E2, torch.exp(z / 2), rtol=1e-15, atol=0)
    torch.testing.assert_close(c.Q, dt / 2 * phi_direct(z / 2)[0], rtol=1e-13, atol=0)


def test_etd_weights_reduce_to_runge_kutta_as_z_goes_to_zero() -> None:
    # With L = 0 the ETD schemes are the classical explicit RK methods: P = h, Q = h/2 and the ETDRK4
    # weights h/6, h/6 (doubled for the two middle stages: h/3) and h/6.
    dt = 0.25
    linear = torch.zeros(4, dtype=torch.complex128)
    c4 = etd_coefficients(linear, dt, order=4, dtype=torch.complex128)
    for value, expected in ((c4.Q, dt / 2), (c4.f1, dt / 6), (c4.f2, dt / 6), (c4.f3, dt / 6), (c4.E, 1.0)):
        torch.testing.assert_close(value, torch.full_like(value, expected), rtol=1e-15, atol=0)
    c2 = etd_coefficients(linear, dt, order=2, dtype=torch.complex128)
    torch.testing.assert_close(c2.P, torch.full_like(c2.P, dt), rtol=1e-15, atol=0)
    torch.testing.assert_close(c2.f2, torch.full_like(c2.f2, dt / 2), rtol=1e-15, atol=0)
    assert c2.Q is None and c2.f1 is None and c2.f3 is None  # order 2 needs only E, P and f2


def test_coefficients_are_rounded_once_to_the_solver_precision() -> None:
    linear = -torch.linspace(0, 1e3, 64, dtype=torch.float64).to(torch.complex128)
    c64 = etd_coefficients(linear, 0.01, order=4, dtype=torch.complex64)
    c128 = etd_coefficients(linear, 0.01, order=4, dtype=torch.complex128)
    for name in ("E", "E2", "Q", "f1", "f2", "f3"):
        low, high = getattr(c64, name), getattr(c128, name)
        assert low.dtype == torch.complex64
        # One rounding of an accurate complex128 value: within half an ulp of float32 per component.
        assert torch.equal(low, high.to(torch.complex64)), name
