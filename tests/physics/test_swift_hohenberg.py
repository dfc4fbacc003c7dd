"""The example user system, examples/swift_hohenberg.py, against what is known of Swift-Hohenberg.

u_t = r u - (1 + laplacian)^2 u + g2 u^2 - u^3. Three facts, each checking a different part of the file:
- a single small Fourier mode u = eps cos(k x) grows (or decays) at the linear rate r - (1 - k^2)^2 (the
  linear operator, its sign and its wavenumbers);
- a uniform state obeys the ODE u' = (r - 1) u + g2 u^2 - u^3 and settles on its stable root: with r = 1.5,
  g2 = 0.5 the root is exactly u* = 1 (the nonlinear term, g2's sign included);
- the free energy F[u] = mean(-r u^2 / 2 + ((1 + laplacian) u)^2 / 2 - g2 u^3 / 3 + u^4 / 4) never
  increases along a trajectory from a random field (the equation is its gradient flow).
"""

from __future__ import annotations

import math
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

from dynaforge.systems.pde.spectral import SpectralSystem

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
NAME = "swift_hohenberg:SwiftHohenberg"
LENGTH = 16 * math.pi  # k_m = m / 8


@pytest.fixture(autouse=True)
def examples_on_path(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))


def sh_system(**fields: object) -> SpectralSystem:
    return system_from_overrides(NAME, dtype="float64", resolution=64, **fields)


@pytest.mark.parametrize("m", [4, 8, 11, 16])  # |k| = 0.5, 1 (critical), 1.375, 2
def test_a_small_mode_grows_at_the_linear_rate(m: int) -> None:
    r, eps, dt, steps = 0.2, 1e-7, 0.25, 40
    system = sh_system(dt=dt, steps=steps, save_every=steps, domain_length=LENGTH)
    k = 2 * math.pi * m / LENGTH
    u0 = eps * torch.cos(k * grid(64, LENGTH)).view(1, 1, 64)
    params = parameter_table(system, [{"domain_length": LENGTH, "r": r, "g2": 0.0}])
    final = system.rollout(u0, params).fields[0, -1, 0]
    rate = r - (1 - k * k) ** 2
    expected = u0[0, 0] * math.exp(rate * dt * steps)
    assert torch.allclose(final, expected, rtol=1e-6, atol=1e-12 * eps), (m, rate)


def test_a_uniform_state_settles_on_the_root_of_its_ode() -> None:
    system = sh_system(dt=0.1, steps=400, save_every=400, domain_length=LENGTH)
    params = parameter_table(system, [{"domain_length": LENGTH, "r": 1.5, "g2": 0.5}])
    final = system.rollout(torch.full((1, 1, 64), 0.3, dtype=torch.float64), params).fields[0, -1]
    assert torch.allclose(final, torch.ones_like(final), atol=1e-10)  # u* = (g2 + sqrt(g2^2 + 4 (r - 1))) / 2


def free_energy(u: torch.Tensor, r: float, g2: float, length: float) -> torch.Tensor:
    """F[u] per frame for fields (frames, X) on [0, length)."""
    n = u.shape[-1]
    k = 2 * math.pi * torch.fft.rfftfreq(n, d=1.0 / n, dtype=torch.float64) / length
    lu = torch.fft.irfft((1 - k**2) * torch.fft.rfft(u, dim=-1), n=n, dim=-1)  # (1 + laplacian) u
    return (-r * u**2 / 2 + lu**2 / 2 - g2 * u**3 / 3 + u**4 / 4).mean(dim=-1)


def test_the_free_energy_never_increases() -> None:
    r, g2 = 0.3, 0.4
    system = sh_system(dt=0.2, steps=300, save_every=10, domain_length=LENGTH, r=r, g2=g2)
    params, initial = system.draw_samples([np.random.default_rng(seed) for seed in range(3)])
    fields = system.rollout(initial.to(torch.float64), params).fields[:, :, 0]  # (batch, frames, X)
    for u in fields:
        energy = free_energy(u, r, g2, LENGTH)
        assert (energy.diff() <= 1e-9).all(), energy
        assert energy[-1] < energy[0] - 1e-3  # it does move: patterns form


def test_the_example_is_not_part_of_the_package() -> None:
    import dynaforge.systems

    assert NAME not in dynaforge.systems.SYSTEMS and "swift_hohenberg" in sys.modules
