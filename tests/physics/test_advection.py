"""Linear advection: the solution is the initial field shifted by c t, periodically.

The initial field is a trigonometric polynomial with modes well below the grid's Nyquist mode, so its
shift by any distance (not a whole number of cells) is known exactly at every grid point: it is the same
trigonometric polynomial evaluated at x - c t, which is also what shifting each Fourier mode gives.
"""

from __future__ import annotations

import math

import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

# (m, cosine amplitude, sine amplitude) with m <= 10, far below the Nyquist mode 32 of a 64-point grid.
MODES = ((0, 0.2, 0.0), (1, 0.8, 0.3), (2, -0.5, 0.4), (5, 0.3, -0.2), (10, 0.1, 0.15))
N = 64
DT = 0.01
STEPS = 37


def band_limited(x: torch.Tensor, length: float) -> torch.Tensor:
    u = torch.zeros_like(x)
    for m, a, b in MODES:
        k = 2.0 * math.pi * m / length
        u = u + a * torch.cos(k * x) + b * torch.sin(k * x)
    return u


SAMPLES = [
    {"domain_length": 1.0, "speed": 0.37},
    {"domain_length": 2.0, "speed": -1.3},
    {"domain_length": 5.0, "speed": 2.9},
]


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        # float64: the step multiplies each mode by exp(-i c k dt) rounded to complex128 (relative 1e-16);
        # over 37 steps the phase error stays ~1e-14 on O(1) fields. 1e-12 leaves margin for FFT rounding.
        ("float64", 1e-12),
        # float32: the multiplier's complex64 rounding (6e-8) compounds over 37 steps to ~2e-6 per mode on
        # fields of size ~1.5, plus float32 FFT rounding ~1e-6: bounded by 1e-5.
        ("float32", 1e-5),
    ],
)
def test_exact_periodic_shift(dtype: str, tolerance: float) -> None:
    system = system_from_overrides(
        "advection", resolution=N, dt=DT, steps=STEPS, save_every=STEPS, dtype=dtype
    )
    initial = torch.stack([band_limited(grid(N, s["domain_length"]), s["domain_length"]) for s in SAMPLES])
    result = system.rollout(initial.unsqueeze(1), parameter_table(system, SAMPLES))
    t = STEPS * DT
    for i, sample in enumerate(SAMPLES):
        length, speed = sample["domain_length"], sample["speed"]
        cells = speed * t / (length / N)
        # The shift must fall between grid points, or a mere index roll would pass the test.
        assert abs(cells - round(cells)) > 0.1, f"sample {i}: shift of {cells} cells is too close to whole"
        expected = band_limited(grid(N, length) - speed * t, length)
        error = (result.fields[i, -1, 0].double() - expected).abs().max().item()
        assert error < tolerance, f"sample {i}: max error {error:.3e} >= {tolerance:.0e}"


def test_shift_matches_spectral_phase_factor() -> None:
    """The same check written in Fourier space: each mode picks up the phase exp(-i c k t)."""
    system = system_from_overrides(
        "advection", resolution=N, dt=DT, steps=STEPS, save_every=STEPS, dtype="float64"
    )
    sample = SAMPLES[1]
    length, speed = sample["domain_length"], sample["speed"]
    initial = band_limited(grid(N, length), length).view(1, 1, N)
    final = system.rollout(initial, parameter_table(system, [sample])).fields[0, -1, 0]
    k = 2.0 * math.pi * torch.fft.rfftfreq(N, d=1.0 / N).to(torch.float64) / length
    phase = torch.exp(-1j * speed * k * (STEPS * DT))
    expected = torch.fft.irfft(torch.fft.rfft(initial[0, 0]) * phase, n=N)
    assert (final - expected).abs().max().item() < 1e-12  # both exact up to float64 rounding (see above)
