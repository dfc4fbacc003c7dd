"""Darcy flow (`dynaforge.systems.elliptic`) against truth: scipy's sparse direct solve of the same scheme, a
manufactured solution (second order), and a sample's bytes whatever else is in its batch."""

from __future__ import annotations

import itertools
import math
import re
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse
import scipy.sparse.linalg
import torch

from dynaforge.config import load_config
from dynaforge.errors import ConfigError, DatasetError
from dynaforge.generate import generate
from dynaforge.seeds import Rows
from dynaforge.systems.elliptic import five_point
from dynaforge.systems.elliptic.darcy import Darcy, DarcyConfig, draw_permeability

CONFIGS = Path(__file__).resolve().parents[2] / "configs"

SMALL = {"resolution": 17, "refinement": 4, "modes": 32}
"""A 65 x 65 solve grid (3,969 unknowns): scipy solves it in milliseconds."""


def independent_matrix(a: np.ndarray, average: str) -> scipy.sparse.csc_matrix:
    """h^2 times the five-point finite-volume matrix of the interior points of the vertex grid `a` (s, s),
    written out point by point, apart from the library's code."""
    s = a.shape[0]
    m = s - 2
    matrix = scipy.sparse.lil_matrix((m * m, m * m))
    for i, j in itertools.product(range(1, s - 1), repeat=2):
        row = (i - 1) * m + (j - 1)
        for di, dj in ((-1, 0), (1, 0), (0, -1), (0, 1)):
            left, right = a[i, j], a[i + di, j + dj]
            w = 2 * left * right / (left + right) if average == "harmonic" else (left + right) / 2
            matrix[row, row] += w
            if 1 <= i + di <= s - 2 and 1 <= j + dj <= s - 2:
                matrix[row, (i + di - 1) * m + (j + dj - 1)] = -w
    return matrix.tocsc()


@pytest.mark.parametrize("average", ["harmonic", "arithmetic"])
def test_solution_agrees_with_scipy_sparse_direct_solve_of_the_same_scheme(average: str) -> None:
    config = DarcyConfig(**SMALL, face_average=average)
    a = draw_permeability(config, np.random.default_rng(7))
    assert set(np.unique(a)) == {3.0, 12.0}
    s = a.shape[0]
    h = 1.0 / (s - 1)
    matrix = independent_matrix(a, average)
    rows, cols, values = five_point.sparse_matrix(torch.from_numpy(a), average)
    library = scipy.sparse.csc_matrix((values.numpy(), (rows.numpy(), cols.numpy())), shape=matrix.shape)
    assert abs(library - matrix).max() < 1e-12  # the library's own sparse form is the same scheme
    forcing = 1.7
    expected = scipy.sparse.linalg.spsolve(matrix, np.full(matrix.shape[0], forcing * h**2))
    a_tensor = torch.from_numpy(a)[None]
    solution = five_point.solve(
        a_tensor, torch.full_like(a_tensor, forcing), torch.tensor([h], dtype=torch.float64), average
    )
    u = solution.u[0].numpy()
    relative = np.linalg.norm(u[1:-1, 1:-1].ravel() - expected) / np.linalg.norm(expected)
    # measured: 0.6e-14 - 2.3e-14 over seeds 0-2 at 33 and 65 points, both averages, in 24-27 iterations
    assert relative < 1e-10, relative
    assert bool(solution.converged[0]) and 15 <= int(solution.iterations[0]) <= 40
    assert np.all(u[0] == 0) and np.all(u[-1] == 0) and np.all(u[:, 0] == 0) and np.all(u[:, -1] == 0)


def poisson_series(points: int, terms: int = 201) -> np.ndarray:
    """-Laplacian u = 1 on the unit square, u = 0 on the boundary: u = sum over odd m, n of
    16 sin(m pi x) sin(n pi y) / (pi^4 m n (m^2 + n^2)), on the vertex grid of `points` x `points`."""
    x = np.linspace(0.0, 1.0, points)
    odd = np.arange(1, terms + 1, 2)
    sines = np.sin(math.pi * np.outer(odd, x))  # (modes, points)
    weights = 16.0 / (math.pi**4 * odd[:, None] * odd[None, :] * (odd[:, None] ** 2 + odd[None, :] ** 2))
    return sines.T @ weights @ sines


def test_unit_permeability_and_forcing_is_the_poisson_series_to_second_order() -> None:
    errors = []
    for points in (17, 33, 65):
        a = torch.ones((1, points, points), dtype=torch.float64)
        u = five_point.solve(a, a, torch.tensor([1.0 / (points - 1)], dtype=torch.float64)).u[0]
        errors.append(np.max(np.abs(u.numpy() - poisson_series(points))))
    orders = [math.log2(e / f) for e, f in itertools.pairwise(errors)]
    # measured with the finite-difference solver this replaced (the same scheme): 2.26e-4, 5.66e-5, 1.42e-5;
    # 201 series terms are within 2e-8 of 801 terms here
    assert all(abs(order - 2.0) < 0.1 for order in orders), (errors, orders)
    assert errors[-1] < 2e-5


def manufactured(points: int, variable: bool) -> float:
    """The largest error of the solve against u = sin(pi x) sin(pi y) on a `points` x `points` grid, with
    f = -div(a grad u) for a constant a, or for a smooth variable one."""
    x = torch.linspace(0.0, 1.0, points, dtype=torch.float64)
    X, Y = torch.meshgrid(x, x, indexing="ij")
    u = torch.sin(math.pi * X) * torch.sin(math.pi * Y)
    ux = math.pi * torch.cos(math.pi * X) * torch.sin(math.pi * Y)
    uy = math.pi * torch.sin(math.pi * X) * torch.cos(math.pi * Y)
    if variable:
        a = 1.0 + 0.5 * torch.sin(2 * math.pi * X) * torch.cos(math.pi * Y) + X * Y
        ax = math.pi * torch.cos(2 * math.pi * X) * torch.cos(math.pi * Y) + Y
        ay = -0.5 * math.pi * torch.sin(2 * math.pi * X) * torch.sin(math.pi * Y) + X
    else:
        a, ax, ay = torch.full_like(X, 2.5), torch.zeros_like(X), torch.zeros_like(X)
    f = -(ax * ux + ay * uy) + 2 * math.pi**2 * a * u
    spacing = torch.tensor([1.0 / (points - 1)], dtype=torch.float64)
    return float((five_point.solve(a[None], f[None], spacing).u[0] - u).abs().max())


@pytest.mark.parametrize("variable", [False, True], ids=["constant a", "smooth a"])
def test_manufactured_solution_converges_at_second_order(variable: bool) -> None:
    errors = [manufactured(points, variable) for points in (17, 33, 65)]
    orders = [math.log2(e / f) for e, f in itertools.pairwise(errors)]
    # measured: constant a 3.22e-3, 8.04e-4, 2.01e-4 (orders 2.002, 2.001); smooth a 3.77e-3, 9.45e-4,
    # 2.36e-4 (1.998, 2.000)
    assert all(abs(order - 2.0) < 0.2 for order in orders), (errors, orders)
    assert errors[-1] < 3e-4


def test_a_sample_stops_on_its_own_residual_whatever_else_is_in_the_batch() -> None:
    config = DarcyConfig(**SMALL)
    s = config.solve_points
    rough = torch.from_numpy(draw_permeability(config, np.random.default_rng(1)))
    flat = torch.full((s, s), 5.0, dtype=torch.float64)  # the preconditioner is exact: one iteration
    spacing = torch.full((2,), 1.0 / (s - 1), dtype=torch.float64)

    def solved(first: torch.Tensor, second: torch.Tensor) -> five_point.Solution:
        a = torch.stack([first, second])
        return five_point.solve(a, torch.ones_like(a), spacing)

    alone, mixed = solved(flat, flat), solved(flat, rough)
    assert alone.iterations.tolist() == [1, 1] and mixed.iterations[1] > 10
    assert torch.equal(alone.u[0], mixed.u[0])  # frozen after its own iteration, not stepped on with rough's
    assert torch.equal(solved(rough, rough).u[0], mixed.u[1])


def test_rows_are_the_same_bytes_in_any_batch_and_the_stored_frames_are_a_and_u() -> None:
    darcy = Darcy(DarcyConfig(resolution=9, refinement=2, modes=8))
    cpu = torch.device("cpu")
    together = darcy.sample_rows(Rows("train", 0, 5, 3), cpu)
    assert together.fields.shape == (5, 2, 1, 9, 9) and together.fields.dtype == torch.float32
    for start in range(5):
        alone = darcy.sample_rows(Rows("train", start, start + 1, 3), cpu)
        assert torch.equal(alone.fields[0], together.fields[start])
    a, u = together.fields[:, 0, 0], together.fields[:, 1, 0]
    assert set(torch.unique(a).tolist()) <= {3.0, 12.0}
    assert torch.all(u[:, 1:-1, 1:-1] > 0) and torch.all(u[:, 0] == 0) and torch.all(u[:, :, -1] == 0)
    assert together.time.tolist() == [0.0, 1.0]
    assert darcy.coordinates(together.params)["x"][0].tolist() == np.linspace(0, 1, 9).tolist()


def test_forcing_and_domain_scale_the_solution() -> None:
    """-div(a grad u) = f on [0, L]^2: u is linear in f and scales as L^2 (the same field in units of L)."""
    config = DarcyConfig(resolution=9, refinement=2, modes=8)
    darcy = Darcy(config)
    drawn = darcy.draw_samples([np.random.default_rng(0)])
    base = darcy.rollout(drawn.initial, torch.tensor([[1.0, 1.0]], dtype=torch.float64)).fields
    scaled = darcy.rollout(drawn.initial, torch.tensor([[2.0, 3.0]], dtype=torch.float64)).fields
    torch.testing.assert_close(scaled[:, 1], base[:, 1] * 12.0, rtol=1e-12, atol=0)


@pytest.mark.parametrize(
    ("override", "named"),
    [
        ("system.steps=2", "system.steps=1"),
        ("system.dtype=float32", "system.dtype='float64'"),
        ("system.modes=100", "lower system.modes"),
        ("system.face_average=mean", "harmonic, arithmetic"),
        ("system.permeability_low=0", "permeability_low must be > 0"),
    ],
)
def test_bad_input_is_a_config_error_that_names_the_fix(override: str, named: str) -> None:
    with pytest.raises(ConfigError, match=re.escape(named)):
        load_config(CONFIGS / "darcy.yaml", ["system.resolution=9", override])


def test_a_solve_that_does_not_converge_stops_generation_naming_the_setting(tmp_path: Path) -> None:
    config = load_config(
        CONFIGS / "darcy.yaml",
        ["system.resolution=9", "system.refinement=2", "system.modes=8", "system.max_iterations=3"]
        + [f"dataset.n_{split}=1" for split in ("train", "val", "test")],
    )
    with pytest.raises(DatasetError, match=re.escape("raise system.max_iterations")):
        generate(config, tmp_path / "data", progress=False)
