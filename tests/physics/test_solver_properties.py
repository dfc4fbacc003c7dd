"""Properties every batched spectral rollout must have: batching changes nothing, precision is what was
asked for, and Burgers conserves the spatial mean."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from physics_helpers import system_from_overrides

from dynaforge.systems.spectral import SpectralSystem

SETTINGS = {
    "burgers": {
        "resolution": 64,
        "dt": 0.01,
        "steps": 40,
        "save_every": 4,
        "viscosity": "{low: 0.01, high: 0.05}",
    },
    "ks": {
        "resolution": 64,
        "dt": 0.05,
        "steps": 40,
        "save_every": 4,
        "domain_length": "{low: 20.0, high: 40.0}",
    },
    "heat": {
        "resolution": 32,
        "dt": 0.01,
        "steps": 10,
        "save_every": 5,
        "diffusivity": "{low: 0.01, high: 0.1}",
    },
    "advection": {
        "resolution": 32,
        "dt": 0.01,
        "steps": 10,
        "save_every": 5,
        "speed": "{low: -1.0, high: 1.0}",
    },
}


def drawn_batch(system: SpectralSystem, size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rngs = [np.random.default_rng([seed, i]) for i in range(size)]
    params, initial = system.draw_samples(rngs)
    return params, initial


@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("order", [2, 4])
def test_batched_rollout_equals_one_sample_at_a_time(name: str, order: int) -> None:
    system = system_from_overrides(name, order=order, **SETTINGS[name])
    params, initial = drawn_batch(system, 5)
    assert len(set(params[:, -1].tolist())) == 5, "samples must differ in their parameters"
    batched = system.rollout(initial, params).fields
    for i in range(5):
        single = system.rollout(initial[i : i + 1], params[i : i + 1]).fields
        # Every operation acts on each sample alone (per-sample coefficients, batched FFTs along the last
        # axis), so the arithmetic is the same whether a sample runs alone or in a batch: bit for bit.
        assert torch.equal(batched[i : i + 1], single), f"{name}: sample {i} differs when batched"


def test_float32_by_default_and_float64_on_request() -> None:
    default = system_from_overrides("burgers", **SETTINGS["burgers"])
    double = system_from_overrides("burgers", dtype="float64", **SETTINGS["burgers"])
    params, initial = drawn_batch(default, 3)
    low = default.rollout(initial, params)
    high = double.rollout(initial, params)
    assert low.fields.dtype == torch.float32
    assert high.fields.dtype == torch.float64
    assert high.time.dtype == torch.float64
    # The two precisions solve the same problem: over 40 smooth steps (|u| <= 1) float32 rounding (~6e-8
    # per operation, a few dozen operations per step; measured 1.5e-7) stays well below 1e-5, itself far
    # below how much the fields change over the run (> 1e-2).
    difference = (low.fields.double() - high.fields).abs().max().item()
    assert difference < 1e-5, f"float32 and float64 rollouts differ by {difference:.2e}"
    assert difference > 0, "float64 was requested but the run was not more precise"


@pytest.mark.parametrize(("dtype", "tolerance"), [("float64", 1e-14), ("float32", 1e-6)])
def test_burgers_conserves_the_mean(dtype: str, tolerance: float) -> None:
    system = system_from_overrides("burgers", dtype=dtype, **SETTINGS["burgers"])
    params, initial = drawn_batch(system, 4)
    initial = initial + torch.tensor([0.0, 0.3, -0.7, 1.5], dtype=torch.float64).view(
        4, 1, 1
    )  # non-zero means
    fields = system.rollout(initial, params).fields.double()
    means = fields.mean(dim=-1)  # (batch, time, channels)
    drift = (means - means[:, :1]).abs().max().item()
    # The k = 0 mode is multiplied by E = 1 and receives P * N = 0 (N = -(ik/2) FFT(u^2) vanishes at k = 0),
    # so it is constant in spectral space; the mean read back from the physical field carries only the
    # inverse-FFT rounding (~eps * |u| each frame): 1e-14 in float64, 1e-6 in float32 (|u| ~ 2.5).
    assert drift < tolerance, f"mean drifted by {drift:.2e}"
    # Meanwhile the field itself does evolve (a frozen solver would also conserve the mean).
    assert (fields[:, -1] - fields[:, 0]).abs().max().item() > 1e-2


def test_shared_parameters_broadcast_gives_the_same_numbers() -> None:
    # With a constant parameter range the operators are set up once and broadcast over the batch; each
    # sample must still get exactly what it gets alone.
    system = system_from_overrides("burgers", **{**SETTINGS["burgers"], "viscosity": 0.02})
    params, initial = drawn_batch(system, 4)
    assert len(set(params[:, -1].tolist())) == 1
    ops = system.operators(params, torch.device("cpu"))
    assert ops.coefficients.E.shape[0] == 1, "shared parameters should be set up once"
    batched = system.rollout(initial, params).fields
    for i in range(4):
        assert torch.equal(batched[i : i + 1], system.rollout(initial[i : i + 1], params[i : i + 1]).fields)
