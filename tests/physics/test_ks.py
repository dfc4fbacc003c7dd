"""Kuramoto-Sivashinsky: the error against a fine-step reference falls as dt^order for ETDRK1-4.

Setting of Kassam & Trefethen (2005): L = 32 pi, u0 = cos(x/16) (1 + sin(x/16)), here on 128 points and
up to t = 5, a horizon short enough that the chaotic growth of perturbations (Lyapunov time ~10 at this
L) does not spoil the asymptotic error constants. The reference is ETDRK4 with 6400 steps; its own error
(~1e-15, extrapolated from the measured order-4 errors) is far below the smallest error compared here.
"""

from __future__ import annotations

import math

import pytest
import torch
from physics_helpers import grid, parameter_table, system_from_overrides

LENGTH = 32.0 * math.pi
N = 128
T_END = 5.0


def ks_solution(order: int, steps: int) -> torch.Tensor:
    system = system_from_overrides(
        "ks",
        resolution=N,
        domain_length=LENGTH,
        dt=T_END / steps,
        steps=steps,
        save_every=steps,
        order=order,
        dtype="float64",
    )
    x = grid(N, LENGTH)
    initial = (torch.cos(x / 16) * (1 + torch.sin(x / 16))).view(1, 1, N)
    return system.rollout(initial, parameter_table(system, [{"domain_length": LENGTH}])).fields[0, -1, 0]


@pytest.fixture(scope="module")
def reference() -> torch.Tensor:
    return ks_solution(order=4, steps=6400)


@pytest.mark.parametrize("order", [1, 2, 3, 4])
def test_convergence_order_in_dt(order: int, reference: torch.Tensor) -> None:
    steps = (100, 200, 400)  # dt = 0.05, 0.025, 0.0125: errors from ~1e-2 (order 1) to ~3e-11 (order 4)
    errors = [(ks_solution(order, n) - reference).abs().max().item() for n in steps]
    # Least-squares slope of log(error) against log(dt). Measured when written: 0.99, 2.01, 2.96, 3.97.
    # The next term of the error expansion bends the slope by O(dt) relative; 0.15 allows that and still
    # rejects a scheme of a lower order (or one whose order collapses on this stiff problem).
    log_dt = torch.log(torch.tensor([T_END / n for n in steps], dtype=torch.float64))
    log_err = torch.log(torch.tensor(errors, dtype=torch.float64))
    slope = (
        ((log_dt - log_dt.mean()) * (log_err - log_err.mean())).sum() / ((log_dt - log_dt.mean()) ** 2).sum()
    ).item()
    assert abs(slope - order) < 0.15, f"ETDRK{order}: measured order {slope:.2f}, errors {errors}"
    assert errors[-1] > 1e-13, "errors reached round-off: the slope would be meaningless"
