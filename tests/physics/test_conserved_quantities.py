"""The conservation table of `dynaforge.metrics.physics` holds for dynaforge's own solvers.

Each system's ground-truth rollout keeps the quantities the table lists (to round-off), and the quantities
it leaves out do change, so a drift check is neither missing nor charging a model for physics.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from physics_helpers import system_from_overrides

from dynaforge.metrics.physics import CONSERVED, energy, mass

SETTINGS = {
    "heat": {"resolution": 64, "dt": 0.01, "steps": 40, "diffusivity": 0.01},
    "advection": {"resolution": 64, "dt": 0.01, "steps": 40, "speed": 0.7},
    "burgers": {"resolution": 64, "dt": 0.005, "steps": 80, "viscosity": 0.02},
    "ks": {"resolution": 64, "domain_length": 22.0, "dt": 0.05, "steps": 80},
}


def rollout(name: str) -> torch.Tensor:
    """(batch, frames, C, X) float64 ground truth from random initial fields."""
    # Gaussian random fields have a mean of their own, so that mass conservation is not 0 = 0.
    system = system_from_overrides(
        name, dtype="float64", **{"initial.families": "{grf: 1.0}"}, **SETTINGS[name]
    )
    params, initial = system.draw_samples([np.random.default_rng(seed) for seed in range(3)])
    return system.rollout(initial.to(torch.float64), params).fields


@pytest.mark.parametrize("name", sorted(SETTINGS))
def test_listed_quantities_are_conserved_and_others_are_not(name: str) -> None:
    fields = rollout(name)
    quantities = {"mass": mass(fields), "energy": energy(fields)}  # (batch, frames, C)
    assert quantities["mass"][:, 0].abs().max() > 1e-3  # a non-trivial mass to conserve
    for quantity, values in quantities.items():
        change = (values[:, -1] - values[:, 0]).abs().max().item()
        scale = values.abs().max().item() + 1e-12
        if quantity in CONSERVED[name]:
            assert change < 1e-10 * max(scale, 1.0), f"{name} should conserve {quantity}: changed by {change}"
        elif quantity == "energy":  # heat, Burgers dissipate; KS pumps and dissipates: never constant
            assert change > 1e-4 * scale, f"{name} is listed as not conserving energy, but it does"
