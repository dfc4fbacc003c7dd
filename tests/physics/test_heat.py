"""Heat equation: every Fourier mode decays exactly as exp(-nu k^2 t).

The ETD step multiplies each mode by E = exp(-nu k^2 dt), the exact propagator, so the only error is
rounding: E is rounded once to the solver's precision and that relative error compounds once per step.
"""

from __future__ import annotations

import math

import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

# (wavenumber index m, cosine amplitude, sine amplitude): a few modes spread over the resolved band.
MODES = ((0, 0.3, 0.0), (1, 1.0, -0.5), (3, 0.25, 0.7), (7, -0.4, 0.1), (20, 0.05, 0.02))
N = 64
DT = 0.02
STEPS = 50
SAVE_EVERY = 10


def exact_heat(x: torch.Tensor, length: float, diffusivity: float, t: float) -> torch.Tensor:
    """sum_m (a_m cos(k_m x) + b_m sin(k_m x)) exp(-nu k_m^2 t), k_m = 2 pi m / L."""
    u = torch.zeros_like(x)
    for m, a, b in MODES:
        k = 2.0 * math.pi * m / length
        u = u + math.exp(-diffusivity * k * k * t) * (a * torch.cos(k * x) + b * torch.sin(k * x))
    return u


def run_heat(dtype: str, samples: list[dict[str, float]]) -> tuple[torch.Tensor, torch.Tensor]:
    system = system_from_overrides(
        "heat", resolution=N, dt=DT, steps=STEPS, save_every=SAVE_EVERY, dtype=dtype
    )
    initial = torch.stack(
        [exact_heat(grid(N, s["domain_length"]), s["domain_length"], 0.0, 0.0) for s in samples]
    )
    result = system.rollout(initial.unsqueeze(1), parameter_table(system, samples))
    return result.fields, result.time


# Per-sample parameters differ, so the test also checks that each sample is stepped with its own L and nu.
SAMPLES = [
    {"domain_length": 1.0, "diffusivity": 0.01},
    {"domain_length": 2.0 * math.pi, "diffusivity": 0.1},
    {"domain_length": 3.0, "diffusivity": 0.003},
]


@pytest.mark.parametrize(
    ("dtype", "tolerance"),
    [
        # float64: E carries a relative rounding error ~1e-16, compounded over 50 steps (~5e-15), plus
        # FFT rounding ~1e-15 on O(1) fields: 1e-12 leaves a wide margin and still catches any wrong factor.
        ("float64", 1e-12),
        # float32: E rounded to complex64 (relative 6e-8) compounds to ~50 * 6e-8 = 3e-6 over 50 steps, plus
        # float32 FFT rounding ~1e-6 on fields of size ~1.5: 1e-5 bounds that with a small margin.
        ("float32", 1e-5),
    ],
)
def test_fourier_modes_decay_exactly(dtype: str, tolerance: float) -> None:
    fields, time = run_heat(dtype, SAMPLES)
    assert fields.dtype == (torch.float64 if dtype == "float64" else torch.float32)
    assert fields.shape == (len(SAMPLES), STEPS // SAVE_EVERY + 1, 1, N)
    for i, sample in enumerate(SAMPLES):
        x = grid(N, sample["domain_length"])
        for j, t in enumerate(time.tolist()):
            expected = exact_heat(x, sample["domain_length"], sample["diffusivity"], t)
            error = (fields[i, j, 0].double() - expected).abs().max().item()
            assert error < tolerance, f"sample {i}, t={t}: max error {error:.3e} >= {tolerance:.0e}"


def test_time_axis_counts_saved_steps() -> None:
    _, time = run_heat("float64", SAMPLES[:1])
    expected = torch.arange(STEPS // SAVE_EVERY + 1, dtype=torch.float64) * DT * SAVE_EVERY
    torch.testing.assert_close(time, expected, rtol=0, atol=1e-15)
