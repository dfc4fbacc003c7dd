"""The dealiased quadratic term -(u^2 / 2)_x of Burgers and KS.

The product is formed on a fast FFT length n' >= n (`product_grid_size`); these tests check that this
gives the 2/3-rule result of the n-point grid, and the exact truncated product for a known field.
"""

from __future__ import annotations

import math

import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem, dealias_mask, product_grid_size

LENGTH = 3.0


def quadratic_term(resolution: int) -> tuple[SpectralSystem, Nonlinear]:
    system = system_from_overrides("burgers", resolution=resolution, dtype="float64")
    params = parameter_table(system, [{"domain_length": LENGTH, "viscosity": 0.01}])
    ops = system.operators(params, torch.device("cpu"))
    assert ops.nonlinear is not None
    return system, ops.nonlinear_term


@pytest.mark.parametrize("resolution", [200, 75, 129, 256, 96])
def test_product_grid_gives_the_two_thirds_rule_of_the_native_grid(resolution: int) -> None:
    _, nonlinear = quadratic_term(resolution)
    generator = torch.Generator().manual_seed(resolution)
    modes = resolution // 2 + 1
    v = torch.randn(2, 1, modes, dtype=torch.complex128, generator=generator)  # energy in every mode
    v[..., 0] = v[..., 0].real  # a real field's mean mode is real
    # The 2/3 rule evaluated on the n-point grid itself, written out independently of the solver.
    mask = dealias_mask((resolution,), torch.device("cpu"), torch.float64)
    k = 2 * math.pi * torch.fft.rfftfreq(resolution, d=1.0 / resolution).to(torch.float64) / LENGTH
    u = torch.fft.irfft(mask * v, n=resolution)
    expected = -0.5j * k * mask * torch.fft.rfft(u * u)
    got = nonlinear(v)
    assert got.shape == expected.shape
    # Same arithmetic up to the order of roundings in two FFTs of length <= 2n: a few eps * log n relative.
    error = ((got - expected).abs().max() / expected.abs().max()).item()
    assert error < 1e-13, f"n={resolution} (product grid {product_grid_size(resolution)}): {error:.2e}"


def test_dealiased_product_of_two_modes_is_exact() -> None:
    # u = cos(a x') + cos(b x'), x' = 2 pi x / L: u^2 holds modes 0, a - b, 2b, a + b, 2a. With n = 200 the
    # 2/3 rule keeps |m| <= 66: for a = 60, b = 50 only a - b = 10 (and the mean) survive, so
    # N = -(1/2) d/dx cos(10 x') = (1/2) (2 pi 10 / L) sin(10 x'). Modes 110 and 120 would alias onto
    # 90 and 80 on the n-point grid, and onto 146 and 136 on the 256-point product grid: outside the kept band.
    resolution, a, b = 200, 60, 50
    system, nonlinear = quadratic_term(resolution)
    x = 2 * math.pi * grid(resolution, LENGTH) / LENGTH
    u = torch.cos(a * x) + torch.cos(b * x)
    got = system.to_physical(nonlinear(system.to_spectral(u.view(1, 1, -1))))[0, 0]
    expected = 0.5 * (2 * math.pi * (a - b) / LENGTH) * torch.sin((a - b) * x)
    # Exact up to rounding, which the derivative amplifies: FFT round-off on u^2 (|u^2| <= 4) lands in every
    # kept mode and is multiplied by k up to 2 pi 66 / L ~ 140, so the bound is about
    # eps * 4 * 140 * n' (n' = 256 the worst-case growth of FFT rounding) ~ 3e-11 (measured: 5e-12).
    error = (got - expected).abs().max().item()
    assert error < 3e-11, f"max error {error:.2e}"


def test_product_grid_size_is_the_smallest_fast_length_at_least_n() -> None:
    fast = sorted({2**a for a in range(2, 13)} | {3 * 2**a for a in range(1, 12)})
    for n in range(4, 2100):
        assert product_grid_size(n) == min(size for size in fast if size >= n), n
