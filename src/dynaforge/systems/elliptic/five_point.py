"""-div(a grad u) = f with u = 0 on the boundary of a square, on a vertex grid, solved for a batch at once.

Conventions:
- Grid: s x s points x_i = i h, i = 0 .. s - 1, both ends included (h = L / (s - 1)); the s - 2 interior
  points per axis are the unknowns, the boundary points hold u = 0. Arrays are (batch, s, s), axes (x, y).
- Scheme: the five-point finite-volume scheme on the dual cells around the points. The flux through the
  face between two neighbouring points is w (u_right - u_left) / h with w the face average of a:
  `harmonic` (2 a_l a_r / (a_l + a_r), the conductance of the two half cells in series, which keeps the
  flux continuous across a jump of a) or `arithmetic` ((a_l + a_r) / 2, the FNO paper's MATLAB solver).
  Row (i, j) of the matrix is the sum of the four face weights on the diagonal and minus each on the
  neighbour's column, divided by h^2: symmetric positive definite.
- Solver: conjugate gradients preconditioned by the inverse of the constant-coefficient five-point
  Laplacian, applied exactly with sine transforms (DST-I, by FFTs of the odd extension). Every face weight
  lies in [min a, max a], so the preconditioned matrix has a condition number of at most max a / min a
  whatever the grid (4 for the FNO paper's 3 / 12 coefficient): the iteration count does not grow with the
  resolution. float64 throughout.
- Batch independence by construction: each sample stops on its own test (its residual below `tolerance`
  times its right-hand side, both in its own 2-norm); a stopped sample's iterate is frozen by selection, not
  by arithmetic, so its result is the iterate of its own stopping step, whatever the others do. The caller
  fixes the shape of every call (`systems/batching.py`): then a sample's numbers do not depend on the batch.
"""

from __future__ import annotations

import math
from typing import Literal, NamedTuple

import torch
import torch.nn.functional as F
from jaxtyping import Bool, Float, Int
from torch import Tensor

FaceAverage = Literal["harmonic", "arithmetic"]


class FaceWeights(NamedTuple):
    """The face averages of a on the faces between interior-row neighbours (h^2 not divided out)."""

    x: Float[Tensor, "batch faces_x interior_y"]
    """(B, s - 1, s - 2): between points (i, j) and (i + 1, j), j interior."""
    y: Float[Tensor, "batch interior_x faces_y"]
    """(B, s - 2, s - 1): between points (i, j) and (i, j + 1), i interior."""


class Solution(NamedTuple):
    """What `solve` returns."""

    u: Float[Tensor, "batch s s"]
    """(B, s, s), zero on the boundary."""
    iterations: Int[Tensor, " batch"]
    """CG iterations each sample took to reach the tolerance."""
    converged: Bool[Tensor, " batch"]
    """Whether the sample reached the tolerance within the iteration limit."""


def face_average(left: Tensor, right: Tensor, average: FaceAverage) -> Tensor:
    if average == "harmonic":
        return 2.0 * left * right / (left + right)
    return 0.5 * (left + right)


def face_weights(a: Float[Tensor, "batch s s"], average: FaceAverage) -> FaceWeights:
    """The face averages of the point values `a` (every value must be positive)."""
    return FaceWeights(
        x=face_average(a[:, :-1, 1:-1], a[:, 1:, 1:-1], average),
        y=face_average(a[:, 1:-1, :-1], a[:, 1:-1, 1:], average),
    )


def apply_operator(weights: FaceWeights, u: Float[Tensor, "batch m m"]) -> Float[Tensor, "batch m m"]:
    """h^2 times -div(a grad u) at the interior points, u given at the interior points (zero outside)."""
    padded = F.pad(u, (1, 1, 1, 1))  # (B, m + 2, m + 2), the boundary's u = 0
    flux_x = weights.x * (padded[:, 1:, 1:-1] - padded[:, :-1, 1:-1])  # (B, m + 1, m)
    flux_y = weights.y * (padded[:, 1:-1, 1:] - padded[:, 1:-1, :-1])  # (B, m, m + 1)
    return (flux_x[:, :-1] - flux_x[:, 1:]) + (flux_y[:, :, :-1] - flux_y[:, :, 1:])


def sparse_matrix(a_values: Tensor, average: FaceAverage) -> tuple[Tensor, Tensor, Tensor]:
    """(rows, columns, values) of h^2 times the matrix of one sample's interior unknowns, row-major (i, j):
    the same scheme as `apply_operator` written out for a sparse direct solve (tests, comparisons)."""
    s = a_values.shape[-1]
    m = s - 2
    w = face_weights(a_values[None], average)
    index = torch.arange(m * m, dtype=torch.int64).view(m, m)
    west, east = w.x[0, :-1], w.x[0, 1:]  # faces to (i - 1, j) and (i + 1, j): (m, m)
    south, north = w.y[0, :, :-1], w.y[0, :, 1:]
    rows, cols, values = [index.flatten()], [index.flatten()], [(west + east + south + north).flatten()]
    for weight, di, dj in ((west, -1, 0), (east, 1, 0), (south, 0, -1), (north, 0, 1)):
        keep = torch.zeros((m, m), dtype=torch.bool)
        keep[max(0, -di) : m - max(0, di), max(0, -dj) : m - max(0, dj)] = True
        rows.append(index[keep])
        cols.append(torch.roll(index, shifts=(-di, -dj), dims=(0, 1))[keep])
        values.append(-weight[keep])
    return torch.cat(rows), torch.cat(cols), torch.cat(values)


def sine_transform(x: Float[Tensor, "... m"]) -> Float[Tensor, "... m"]:
    """DST-I along the last axis, X_k = sum_n x_n sin(pi (k + 1) (n + 1) / (m + 1)), from the FFT of the odd
    extension (0, x, 0, -reversed x) of length 2 (m + 1), whose coefficient k + 1 is -2 i X_k."""
    zero = torch.zeros_like(x[..., :1])
    odd = torch.cat([zero, x, zero, -x.flip(-1)], dim=-1)
    return -0.5 * torch.fft.rfft(odd, dim=-1).imag[..., 1:-1]


def laplacian_eigenvalues(m: int, dtype: torch.dtype, device: torch.device) -> Float[Tensor, "m m"]:
    """h^2 times the eigenvalues of the five-point -Laplacian on m x m interior points (Dirichlet), on the
    sine basis: 4 sin^2(pi p / (2 (m + 1))) + 4 sin^2(pi q / (2 (m + 1)))."""
    p = torch.arange(1, m + 1, dtype=torch.float64, device=device)
    one_axis = 4.0 * torch.sin(math.pi * p / (2 * (m + 1))) ** 2
    return (one_axis[:, None] + one_axis[None, :]).to(dtype)


def poisson_preconditioner(
    r: Float[Tensor, "batch m m"], eigenvalues: Float[Tensor, "m m"]
) -> Float[Tensor, "batch m m"]:
    """The five-point -Laplacian (h^2 divided out) inverted on `r`: sine transform on both axes, divided by
    the eigenvalues, transformed back (DST-I is its own inverse up to the factor 2 / (m + 1) per axis)."""
    m = r.shape[-1]
    spectrum = sine_transform(sine_transform(r).transpose(-1, -2)).transpose(-1, -2)
    scaled = spectrum * ((2.0 / (m + 1)) ** 2 / eigenvalues)
    return sine_transform(sine_transform(scaled).transpose(-1, -2)).transpose(-1, -2)


def per_sample_dot(x: Tensor, y: Tensor) -> Float[Tensor, "batch 1 1"]:
    return (x * y).sum(dim=(-2, -1), keepdim=True)


def solve(
    a: Float[Tensor, "batch s s"],
    rhs: Float[Tensor, "batch s s"],
    spacing: Float[Tensor, " batch"],
    average: FaceAverage = "harmonic",
    tolerance: float = 1e-12,
    max_iterations: int = 1000,
) -> Solution:
    """u with -div(a grad u) = rhs at the interior points and u = 0 on the boundary (module docstring), a
    and rhs given at every point of the s x s grid (the boundary's rhs is not used), grid spacing h per
    sample. Stops each sample when ||r|| <= tolerance ||h^2 rhs||."""
    weights = face_weights(a, average)
    b = rhs[:, 1:-1, 1:-1] * (spacing**2).view(-1, 1, 1)  # (B, m, m)
    eigenvalues = laplacian_eigenvalues(b.shape[-1], b.dtype, b.device)
    x = torch.zeros_like(b)
    r = b
    z = poisson_preconditioner(r, eigenvalues)
    p = z
    rz = per_sample_dot(r, z)
    limit = tolerance**2 * per_sample_dot(b, b)
    active = per_sample_dot(r, r) > limit  # (B, 1, 1); a zero right-hand side is solved by x = 0
    iterations = torch.zeros(b.shape[0], dtype=torch.int64, device=b.device)
    for _ in range(max_iterations):
        if not bool(active.any()):
            break
        ap = apply_operator(weights, p)
        alpha = rz / per_sample_dot(p, ap)
        x = torch.where(active, x + alpha * p, x)
        r = torch.where(active, r - alpha * ap, r)
        z = poisson_preconditioner(r, eigenvalues)
        rz_next = per_sample_dot(r, z)
        p = torch.where(active, z + (rz_next / rz) * p, p)
        rz = torch.where(active, rz_next, rz)
        iterations = iterations + active.view(-1).to(torch.int64)
        active = active & (per_sample_dot(r, r) > limit)
    return Solution(F.pad(x, (1, 1, 1, 1)), iterations, ~active.view(-1))
