"""The finite-difference Darcy solver that makes `benchmarks/literature.py`'s Darcy data, against truth.

With a = 1 the problem is Poisson's, -Laplacian u = 1 on the unit square with u = 0 on the boundary, whose
solution is the series u = sum over odd m, n of 16 sin(m pi x) sin(n pi y) / (pi^4 m n (m^2 + n^2)). The
5-point scheme is second order: halving h divides the error by ~4. A coefficient that jumps is checked by
symmetry and by the data's own accuracy check (the record's notes).
"""

from __future__ import annotations

import importlib.util
import itertools
import math
from pathlib import Path

import numpy as np
import pytest

PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "literature_data.py"


@pytest.fixture(scope="module")
def literature_data():
    spec = importlib.util.spec_from_file_location("literature_data", PATH)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def poisson_series(points: int, terms: int = 201) -> np.ndarray:
    """The analytic solution on the vertex grid of `points` x `points`."""
    x = np.linspace(0.0, 1.0, points)
    odd = np.arange(1, terms + 1, 2)
    sines = np.sin(math.pi * np.outer(odd, x))  # (modes, points)
    weights = 16.0 / (math.pi**4 * odd[:, None] * odd[None, :] * (odd[:, None] ** 2 + odd[None, :] ** 2))
    return sines.T @ weights @ sines


def test_constant_coefficient_is_poisson_to_second_order(literature_data):
    errors = []
    for points in (17, 33, 65):
        u = literature_data.darcy_solve(np.ones((points, points)))
        errors.append(np.max(np.abs(u - poisson_series(points))))
    orders = [math.log2(a / b) for a, b in itertools.pairwise(errors)]
    # measured: largest errors 2.26e-4, 5.66e-5, 1.42e-5 (orders 1.99, 2.00); 201 series terms are within
    # 2e-8 of 801 terms here
    assert all(1.9 < order < 2.1 for order in orders), (errors, orders)
    assert errors[-1] < 2e-5


def test_scaling_the_coefficient_scales_the_solution_inversely(literature_data):
    a = literature_data.darcy_coefficient_field(
        literature_data.darcy_coefficients(np.random.default_rng(3)), 33
    )
    assert set(np.unique(a)) == {3.0, 12.0}
    u = literature_data.darcy_solve(a)
    np.testing.assert_allclose(literature_data.darcy_solve(2.0 * a), u / 2.0, rtol=1e-12, atol=0)
    assert np.all(u[1:-1, 1:-1] > 0) and np.all(u[0] == 0) and np.all(u[:, -1] == 0)
    # the transposed coefficient gives the transposed solution (the scheme treats both axes alike)
    np.testing.assert_allclose(literature_data.darcy_solve(a.T), u.T, rtol=1e-10, atol=1e-15)
