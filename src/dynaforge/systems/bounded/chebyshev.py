"""Chebyshev collocation for the exact heat stepper (`discretisation: chebyshev`, `exact.py`): spectrally
accurate in space, so a smooth solution needs far fewer nodes than the second-order differences for the
same error (`docs/bounded.md` says why and by how much).

- Nodes: the Gauss-Lobatto points x_j = L (1 - cos(pi j / (n - 1))) / 2, j = 0 .. n - 1, both ends
  included, ascending; D the collocation derivative on them (from the barycentric weights of the nodes),
  D2 = D D.
- Boundary rows eliminated per axis: a Dirichlet end's node is not evolved (its value is imposed); a
  Neumann end's node is solved from its derivative row, D[B, B] u_B = L g_B - D[B, rest] u_rest (the
  outward derivative: +du/dx at the high end, -du/dx at the low end), so it is an affine function of the
  evolved nodes. What is left on the evolved (interior) nodes is A = D2[I, I] + D2[I, B] E, E = -D[B, B]^-1
  D[B, I], whose eigenvalues are real and negative (checked when built): the exact stepper's machinery
  applies unchanged with the eigenvectors of A in place of the sines and cosines.
- In 2D the operator is the sum of the axes' (tensor products), the Neumann nodes of y filled first, then
  those of x along every row (so a Neumann-Neumann corner takes both eliminations), never over a node of a
  Dirichlet side of the other axis (impose wins there).
- Boundary values: the state is w + sum over sides of c_s(t) lift_s, lift_s zero on the evolved nodes, the
  side's profile on its Dirichlet nodes and the Neumann nodes filled from it (`lift`); w obeys the
  homogeneous conditions and is forced on the evolved nodes by c_s(t) laplacian(lift_s) (`laplacian`).
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from dynaforge.systems.bounded.core import SIDES

IMAGINARY_TOLERANCE = 1e-8
"""Largest |imaginary part| / |eigenvalue| accepted from the reduced operator (measured: 0 to rounding,
~1e-13, for n = 4 .. 64 and every pair of kinds)."""


def unit_nodes(n: int) -> np.ndarray:
    """The Gauss-Lobatto nodes on [0, 1], ascending, both ends included."""
    return (1.0 - np.cos(np.pi * np.arange(n) / (n - 1))) / 2.0


@functools.lru_cache(maxsize=32)
def derivative(n: int) -> np.ndarray:
    """The collocation first derivative on `unit_nodes(n)` (float64, (n, n)): off the diagonal w_j / (w_i
    (x_i - x_j)) with the barycentric weights w_j = (-1)^j (halved at both ends), on it minus the row's other
    entries (so that a constant has derivative 0 to rounding)."""
    x = unit_nodes(n)
    weights = (-1.0) ** np.arange(n)
    weights[[0, -1]] *= 0.5
    difference = x[:, None] - x[None, :]
    np.fill_diagonal(difference, 1.0)
    matrix = weights[None, :] / (weights[:, None] * difference)
    np.fill_diagonal(matrix, 0.0)
    np.fill_diagonal(matrix, -matrix.sum(axis=1))
    matrix.setflags(write=False)
    return matrix


def axis_nodes(n: int, low: str, high: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The evolved, the Neumann and the Dirichlet node indices of one axis."""
    ends = {0: low, n - 1: high}
    evolved = np.asarray([j for j in range(n) if j not in ends])
    neumann = np.asarray([j for j, kind in ends.items() if kind == "neumann"], dtype=int)
    dirichlet = np.asarray([j for j, kind in ends.items() if kind == "dirichlet"], dtype=int)
    return evolved, neumann, dirichlet


def neumann_solve(n: int, low: str, high: str) -> tuple[np.ndarray, np.ndarray]:
    """For the Neumann nodes B of an axis: (D[B, B]^-1, D[B, :] with its B columns zeroed), so that
    u_B = inverse (L g_B - rest u) with g the outward derivative's sign-adjusted values."""
    d = derivative(n)
    _, neumann, _ = axis_nodes(n, low, high)
    inverse = np.linalg.inv(d[np.ix_(neumann, neumann)]) if len(neumann) else np.zeros((0, 0))
    rest = d[neumann].copy()
    rest[:, neumann] = 0.0
    return inverse, rest


def axis_operator(n: int, low: str, high: str) -> tuple[np.ndarray, np.ndarray]:
    """The eigen-decomposition of one axis's reduced operator on [0, 1] (module docstring): the synthesis
    (n, K) (the eigenvectors on the evolved nodes, E times them on the Neumann nodes, 0 on the Dirichlet
    nodes) and the eigenvalues (K,), real, ascending in magnitude."""
    d = derivative(n)
    second = d @ d
    evolved, neumann, _ = axis_nodes(n, low, high)
    inverse, _ = neumann_solve(n, low, high)
    elimination = -inverse @ d[np.ix_(neumann, evolved)] if len(neumann) else np.zeros((0, len(evolved)))
    reduced = second[np.ix_(evolved, evolved)] + second[np.ix_(evolved, neumann)] @ elimination
    values, vectors = np.linalg.eig(reduced)
    tolerance = IMAGINARY_TOLERANCE * np.abs(values).max()
    if np.abs(values.imag).max() > tolerance or values.real.max() > tolerance:
        raise ValueError(f"Chebyshev operator on {n} nodes ({low}, {high}) is not real negative")
    order = np.argsort(-values.real)
    values, vectors = values.real[order], vectors.real[:, order]
    values[np.abs(values) <= tolerance] = 0.0  # the constant of a Neumann-Neumann axis, exactly
    synthesis = np.zeros((n, len(evolved)))
    synthesis[evolved] = vectors
    synthesis[neumann] = elimination @ vectors
    return synthesis, values


class ChebyshevBasis:
    """The transforms between a Chebyshev grid of `shape` and the eigenbasis of its reduced collocation
    Laplacian, the same interface as `exact.Basis` (working layout (batch, channels, K) in 1D, (K0, batch,
    channels, K1) in 2D); plain dense products per axis (no parity split: these bases have none)."""

    def __init__(
        self, shape: Sequence[int], kinds: dict[str, str], dtype: torch.dtype, device: torch.device
    ) -> None:
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.kinds = kinds
        self.analysis: list[Tensor] = []
        self.synthesis: list[Tensor] = []
        self.values: list[Tensor] = []
        for axis, n in enumerate(self.shape):
            low, high = kinds[SIDES[2 * axis]], kinds[SIDES[2 * axis + 1]]
            synthesis, values = axis_operator(n, low, high)
            evolved, _, _ = axis_nodes(n, low, high)
            analysis = np.zeros(synthesis.T.shape)
            analysis[:, evolved] = np.linalg.inv(synthesis[evolved])
            self.analysis.append(torch.from_numpy(analysis).to(dtype=dtype, device=device))
            self.synthesis.append(torch.from_numpy(synthesis).to(dtype=dtype, device=device))
            self.values.append(torch.from_numpy(values).to(device))
        self.modes = tuple(len(v) for v in self.values)

    def layout(self, x: Tensor) -> Tensor:
        """(batch, channels, *modes) -> the working layout (a view)."""
        return x if self.ndim == 1 else x.permute(2, 0, 1, 3)

    def per_sample(self, x: Tensor) -> Tensor:
        """A per-sample number as a view that broadcasts against the working layout."""
        return x.view(-1, 1, 1) if self.ndim == 1 else x.view(1, -1, 1, 1)

    def to_spectral(self, u: Tensor) -> Tensor:
        """The coefficients of `u`'s evolved nodes (the others are ignored), in the working layout."""
        first = torch.matmul(u, self.analysis[-1].T)
        if self.ndim == 1:
            return first
        batch, channels, n0, k1 = first.shape
        rows = first.permute(2, 0, 1, 3).reshape(n0, -1)
        return torch.mm(self.analysis[0], rows).view(-1, batch, channels, k1)

    def workspace(self, batch: int, channels: int) -> dict[str, Tensor]:
        """The buffers `to_grid` writes, allocated once per rollout."""
        dtype, device = self.synthesis[0].dtype, self.synthesis[0].device
        rows = batch * channels
        if self.ndim == 1:
            return {"grid": torch.empty((batch, channels, self.shape[0]), dtype=dtype, device=device)}
        return {
            "columns": torch.empty((self.modes[0] * rows, self.shape[1]), dtype=dtype, device=device),
            "grid": torch.empty((self.shape[0], rows * self.shape[1]), dtype=dtype, device=device),
        }

    def to_grid(self, v: Tensor, out: Tensor, work: dict[str, Tensor]) -> Tensor:
        """All nodes from the coefficients `v` (zero on the Dirichlet nodes), written into `out`."""
        last = self.synthesis[-1]
        if self.ndim == 1:
            return out.copy_(torch.matmul(v, last.T, out=work["grid"]))
        k0, batch, channels, k1 = v.shape
        columns = torch.mm(v.view(-1, k1), last.T, out=work["columns"]).view(k0, -1)
        grid = torch.mm(self.synthesis[0], columns, out=work["grid"]).view(-1, batch, channels, self.shape[1])
        return out.copy_(grid.permute(1, 2, 0, 3))

    def laplacian_eigenvalues(self, lengths: Tensor) -> Tensor:
        """Sum over axes of the unit eigenvalues, over L^2: (batch, 1, *modes), float64."""
        total = torch.zeros((), dtype=torch.float64, device=lengths.device)
        for axis, values in enumerate(self.values):
            view = [1] * self.ndim
            view[axis] = -1
            total = total + values.view(view)
        return total.unsqueeze(0).unsqueeze(0) / lengths.view(-1, 1, *([1] * self.ndim)).square()


@functools.lru_cache(maxsize=16)
def cached_chebyshev_basis(
    shape: tuple[int, ...], kinds: tuple[tuple[str, str], ...], dtype: torch.dtype, device: torch.device
) -> ChebyshevBasis:
    """The `ChebyshevBasis` of a grid, built once per grid, kinds, dtype and device; never written to."""
    return ChebyshevBasis(shape, dict(kinds), dtype, device)


def along(matrix: np.ndarray, u: Tensor, axis: int) -> Tensor:
    """`matrix` (m, n) applied along spatial `axis` of u (batch, channels, *space), float64."""
    m = torch.from_numpy(np.ascontiguousarray(matrix)).to(u.device)
    return torch.movedim(torch.tensordot(m, torch.movedim(u, axis + 2, 0), dims=1), 0, axis + 2)


def lift(side: str, kinds: dict[str, str], profile: Tensor, lengths: Tensor, shape: Sequence[int]) -> Tensor:
    """lift_s of the module docstring for a unit c(t) of `side` with `profile` ((batch, 1, *side), float64):
    the profile on a Dirichlet side's nodes, then the Neumann nodes of y, then of x, solved from their
    derivative rows (the profile as the outward derivative of a Neumann `side`, 0 for the others); zero on
    the evolved nodes. (batch, 1, *shape), float64."""
    ndim = len(shape)
    batch = lengths.shape[0]
    result = torch.zeros((batch, 1, *shape), dtype=torch.float64, device=lengths.device)
    axis, high = divmod(SIDES.index(side), 2)
    n = shape[axis]
    layer = n - 1 if high else 0
    dim = axis + 2
    if kinds[side] == "dirichlet":
        result.narrow(dim, layer, 1).copy_(profile.unsqueeze(dim).expand_as(result.narrow(dim, layer, 1)))
    for fill in reversed(range(ndim)):
        low_kind, high_kind = kinds[SIDES[2 * fill]], kinds[SIDES[2 * fill + 1]]
        _, neumann, _ = axis_nodes(shape[fill], low_kind, high_kind)
        if not len(neumann):
            continue
        inverse, rest = neumann_solve(shape[fill], low_kind, high_kind)
        rhs = -along(rest, result, fill)  # (batch, 1, .., |B|, ..)
        if fill == axis and kinds[side] == "neumann":
            index = int(np.flatnonzero(neumann == layer)[0])
            sign = 1.0 if high else -1.0
            scaled = (sign * profile * lengths.view(-1, *([1] * (profile.dim() - 1)))).unsqueeze(dim)
            rhs.narrow(dim, index, 1).add_(scaled)  # building the right-hand side, in place
        solved = along(inverse, rhs, fill)
        keep = torch.ones(tuple(shape), dtype=torch.bool, device=result.device)
        for other in range(ndim):
            if other != fill:
                for j, kind in (
                    (0, kinds[SIDES[2 * other]]),
                    (shape[other] - 1, kinds[SIDES[2 * other + 1]]),
                ):
                    if kind == "dirichlet":
                        keep.narrow(other, j, 1).fill_(False)  # building a mask, in place
        for i, j in enumerate(neumann.tolist()):
            target = result.narrow(fill + 2, j, 1)
            mask = keep.narrow(fill, j, 1)
            target.copy_(torch.where(mask, solved.narrow(fill + 2, i, 1), target))
    return result


def laplacian(u: Tensor, lengths: Tensor) -> Tensor:
    """The collocation Laplacian of u (batch, channels, *space) on nodes of per-sample length `lengths`,
    float64 (every node; only the evolved nodes' values are used)."""
    ndim = u.dim() - 2
    total = torch.zeros_like(u)
    for axis in range(ndim):
        d = derivative(u.shape[axis + 2])
        total = total + along(d @ d, u, axis)
    return total / lengths.view(-1, 1, *([1] * ndim)).square()
