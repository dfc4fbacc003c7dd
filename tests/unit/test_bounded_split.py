"""The exact heat stepper's parity-split synthesis (`systems/bounded/exact.py`) against the dense product
with the same basis, for every pair of end kinds and an even and an odd node count."""

import numpy as np
import pytest
import torch

from dynaforge.systems.bounded.exact import Basis, axis_modes, split_axis

KINDS = ("dirichlet", "neumann")


@pytest.mark.parametrize("n", [16, 17])
@pytest.mark.parametrize("low", KINDS)
@pytest.mark.parametrize("high", KINDS)
def test_split_synthesis_matches_dense(n: int, low: str, high: str) -> None:
    synthesis, _ = axis_modes(n, low, high)
    split = split_axis(synthesis, torch.float64, torch.device("cpu"))
    kinds = {"left": low, "right": high, "bottom": high, "top": low}
    basis = Basis((n, n), kinds, torch.float64, torch.device("cpu"))
    rng = np.random.default_rng(0)
    coefficients = torch.from_numpy(rng.standard_normal((3, 1, *basis.modes)))  # (batch, channels, K0, K1)
    dense = [
        torch.from_numpy(axis_modes(n, *pair)[0][:, s.order])
        for pair, s in zip(((low, high), (high, low)), basis.splits, strict=True)
    ]
    expected = torch.einsum("ik,bckl,jl->bcij", dense[0], coefficients, dense[1])
    out = torch.empty((3, 1, n, n), dtype=torch.float64)
    got = basis.to_grid(basis.layout(coefficients).contiguous(), out, basis.workspace(3, 1))
    # rounding only: products of O(1) numbers summed over ~n terms, float64
    assert torch.allclose(got, expected, rtol=0, atol=1e-12)
    assert split.pairs == len(split.order) // 2
