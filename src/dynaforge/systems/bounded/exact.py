"""Heat on a bounded grid stepped exactly in time: the second-order difference Laplacian of `core.py` (the
same nodes, ghost mirrors and Dirichlet nodes) is diagonal in a sine/cosine basis, so its semi-discrete
solution is advanced from frame to frame in one step with no time error (`docs/bounded.md` says why).

- Basis: per axis, the sines and cosines that vanish on a Dirichlet end and are mirrored through a Neumann
  end (the ghost node): DST-I when both ends are Dirichlet, DCT-I when both are Neumann, the quarter-wave
  bases when they differ (`axis_modes`). Each is an eigenvector of the axis's second difference on its
  evolving nodes, eigenvalue -(4 / h^2) sin^2(theta / 2); in 2D the products of the axes' modes, eigenvalues
  summed. The transforms are one matrix product per axis with the synthesis matrix and its inverse (at the
  32-128 nodes per axis of these datasets a dense product runs near the core's peak, and an FFT-based DST
  of a length like 4 (n - 1) = 4 x 127 falls on a large prime factor).
- Boundary values: the state is w + (the Dirichlet values on their nodes), w zero there. The boundary
  values enter w's equation as a forcing on the nodes next to a Dirichlet node (g / h^2) and on a Neumann
  node (2 g / h, the ghost mirror's 2 h g / h^2), each a fixed pattern per side times the side's
  c(t) = value + amplitude sin(omega t). Each mode a obeys a' = mu a + nu rho c(t) (mu = nu lambda, rho the
  pattern's coefficient), integrated in closed form over a frame:
  a(t1) = e^{mu D} a(t0) + nu rho [value phi(mu, D) + amplitude S(t0, t1)],  D = t1 - t0,
  phi = (e^{mu D} - 1) / mu (D where mu = 0),
  S = (e^{mu D} (mu sin w t0 + w cos w t0) - (mu sin w t1 + w cos w t1)) / (mu^2 + w^2) (0 where both are 0).
- The coefficients are carried from frame to frame and transformed back once per frame, so a rollout costs
  one forward transform, then one inverse transform and a few products per stored frame.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.systems.bounded.chebyshev import cached_chebyshev_basis, laplacian, lift
from dynaforge.systems.bounded.core import SIDES, BoundaryValues, sides_of


class SideSeries(NamedTuple):
    """One side's g(s, t) = profile(s) (value + amplitude sin(angular t)), per sample (float64)."""

    profile: Tensor
    """(batch, 1, *side): g's shape along the side ((batch, 1) in 1D)."""
    value: Tensor
    """(batch,)"""
    amplitude: Tensor
    """(batch,)"""
    angular: Tensor
    """(batch,): 2 pi times the frequency."""


def axis_modes(n: int, low: str, high: str) -> tuple[np.ndarray, np.ndarray]:
    """The eigenvectors of one axis's difference Laplacian on its evolving nodes (float64): the synthesis
    matrix (n, K) whose column k is the mode on the nodes (zero on a Dirichlet end), and each mode's angle
    theta (eigenvalue -(4 / h^2) sin^2(theta / 2)). Both ends Dirichlet: sin(pi k j / (n - 1)), k = 1 .. n - 2
    (DST-I); both Neumann: cos(pi k j / (n - 1)), k = 0 .. n - 1 (DCT-I); Dirichlet then Neumann:
    sin(pi (k + 1/2) j / (n - 1)), Neumann then Dirichlet: cos(pi (k + 1/2) j / (n - 1)), k = 0 .. n - 2
    (the quarter-wave bases)."""
    m = n - 1
    same = np.arange(1, m) if low == "dirichlet" else np.arange(0, n)
    k = same if low == high else np.arange(0, m) + 0.5
    theta = np.pi * k / m
    j = np.arange(n)[:, None]
    synthesis = np.sin(j * theta) if low == "dirichlet" else np.cos(j * theta)
    if high == "dirichlet":
        synthesis[-1] = 0.0  # the node is not evolved (the sine or cosine vanishes there up to rounding)
    return synthesis, theta


def unknown_mask(shape: Sequence[int], kinds: dict[str, str]) -> Tensor:
    """1 on the nodes that evolve (on no Dirichlet side), 0 on the Dirichlet nodes, (1, 1, *shape) bool."""
    mask = torch.ones(tuple(shape), dtype=torch.bool)
    for i, side in enumerate(sides_of(len(shape))):
        if kinds[side] == "dirichlet":
            axis, high = divmod(i, 2)
            mask.narrow(axis, shape[axis] - 1 if high else 0, 1).fill_(False)  # building a mask, in place
    return mask.view(1, 1, *shape)


class AxisSplit(NamedTuple):
    """One axis's synthesis split by the parity of its nodes (`split_axis`): the modes are ordered as
    `order` (the first `pairs`, the unpaired middle one if any, then the partners of the first in the same
    order), and S[j, partner(k)] = sign (-1)^j S[j, k] on every node j."""

    order: np.ndarray
    pairs: int
    sign: float
    even: Tensor
    """(nodes 0, 2, 4 .., pairs + middle): the synthesis on the even nodes, of the first modes."""
    odd: Tensor
    """(nodes 1, 3, .., pairs + middle): on the odd nodes."""


def split_axis(synthesis: np.ndarray, dtype: torch.dtype, device: torch.device) -> AxisSplit:
    """Mode k and mode K - 1 - k of every basis of `axis_modes` differ on node j by a sign sign (-1)^j
    (sin / cos(pi (K' - k) j / m) = -/+ (-1)^j sin / cos(pi k j / m), with K' = m or m - 1 / 2 shifts), so
    the synthesis of a coefficient vector c is, on the even nodes, S_even (c_first + sign c_partner) and on
    the odd ones S_odd (c_first - sign c_partner): two products of half the size (half the flops of one
    product with S), after one sum and one difference. Checked here on the float64 matrices."""
    n, modes = synthesis.shape
    pairs = modes // 2
    order = np.concatenate([np.arange(modes - pairs), np.arange(modes - 1, modes - 1 - pairs, -1)])
    ordered = synthesis[:, order]
    first, partner = ordered[:, :pairs], ordered[:, modes - pairs :]
    parity = np.where(np.arange(n) % 2 == 0, 1.0, -1.0)[:, None]
    sign = 1.0 if np.abs(partner - parity * first).max() < np.abs(partner + parity * first).max() else -1.0
    assert np.abs(partner - sign * parity * first).max() < 1e-12, "a basis without the parity symmetry"
    kept = ordered[:, : modes - pairs]

    def matrix(rows: np.ndarray) -> Tensor:
        return torch.from_numpy(np.ascontiguousarray(rows)).to(dtype=dtype, device=device)

    return AxisSplit(order, pairs, sign, matrix(kept[0::2]), matrix(kept[1::2]))


class Basis:
    """The transforms between a grid of `shape` (the sides' `kinds`) and the eigenbasis of its difference
    Laplacian (built in float64, rounded once to the state's dtype), and the eigenvalues. The coefficients
    live in a working layout: (batch, channels, K) in 1D, (K0, batch, channels, K1) in 2D (`layout`), so that
    each axis's product is one matrix product over the whole block, with each axis's modes in its
    `AxisSplit.order`. The analysis (once per rollout) is one dense product per axis; the synthesis (once
    per frame) is split by node parity (`split_axis`): two half-size products per axis."""

    def __init__(
        self, shape: Sequence[int], kinds: dict[str, str], dtype: torch.dtype, device: torch.device
    ) -> None:
        self.shape = tuple(shape)
        self.ndim = len(shape)
        self.analysis: list[Tensor] = []
        self.splits: list[AxisSplit] = []
        self.synthesis: list[Tensor] = []
        self.angles: list[Tensor] = []
        for axis, n in enumerate(self.shape):
            synthesis, theta = axis_modes(n, kinds[SIDES[2 * axis]], kinds[SIDES[2 * axis + 1]])
            split = split_axis(synthesis, dtype, device)
            synthesis, theta = synthesis[:, split.order], theta[split.order]
            evolving = np.abs(synthesis).sum(axis=1) > 0
            analysis = np.zeros(synthesis.T.shape)
            analysis[:, evolving] = np.linalg.inv(synthesis[evolving])  # square: one mode per evolving node
            self.analysis.append(torch.from_numpy(analysis).to(dtype=dtype, device=device))
            self.splits.append(split)
            self.synthesis.append(
                torch.from_numpy(np.ascontiguousarray(synthesis)).to(dtype=dtype, device=device)
            )
            self.angles.append(torch.from_numpy(np.ascontiguousarray(theta)).to(device))
        self.modes = tuple(len(split.order) for split in self.splits)

    def layout(self, x: Tensor) -> Tensor:
        """(batch, channels, *modes) -> the working layout (a view)."""
        return x if self.ndim == 1 else x.permute(2, 0, 1, 3)

    def per_sample(self, x: Float[Tensor, " batch"]) -> Tensor:
        """A per-sample number as a view that broadcasts against the working layout."""
        return x.view(-1, 1, 1) if self.ndim == 1 else x.view(1, -1, 1, 1)

    def to_spectral(self, u: Float[Tensor, "batch channels *space"]) -> Tensor:
        """The modes' coefficients of `u` on the evolving nodes (its Dirichlet nodes are ignored), in the
        working layout."""
        first = torch.matmul(u, self.analysis[-1].T)
        if self.ndim == 1:
            return first
        batch, channels, n0, k1 = first.shape
        rows = first.permute(2, 0, 1, 3).reshape(n0, -1)  # a copy, once per rollout
        return torch.mm(self.analysis[0], rows).view(-1, batch, channels, k1)

    def workspace(self, batch: int, channels: int) -> dict[str, Tensor]:
        """The buffers `to_grid` writes for a block of `batch` samples, allocated once per rollout: a fresh
        block-sized temporary per frame has its pages faulted in again each time (docs/bounded.md)."""
        dtype, device = self.synthesis[0].dtype, self.synthesis[0].device
        rows = batch * channels
        if self.ndim == 1:
            return {"grid": torch.empty((batch, channels, self.shape[0]), dtype=dtype, device=device)}
        first, n1 = self.splits[0], self.shape[1]

        def buffer(*shape: int) -> Tensor:
            return torch.empty(shape, dtype=dtype, device=device)

        return {
            "columns": buffer(self.modes[0] * rows, n1),
            "plus": buffer(first.even.shape[1], rows * n1),
            "minus": buffer(first.even.shape[1], rows * n1),
            "even": buffer(first.even.shape[0], rows * n1),
            "odd": buffer(first.odd.shape[0], rows * n1),
        }

    def to_grid(
        self, v: Tensor, out: Float[Tensor, "batch channels *space"], work: dict[str, Tensor]
    ) -> Tensor:
        """The nodes from the coefficients `v` (working layout), written into `out` (zero on the Dirichlet
        nodes; any strides), which is returned; `work` from `workspace`. 1D: one product; 2D: one product
        along the last axis, then the first axis split by node parity (`split_axis`)."""
        last = self.synthesis[-1]
        if self.ndim == 1:
            return out.copy_(torch.matmul(v, last.T, out=work["grid"]))
        k0, batch, channels, k1 = v.shape
        columns = torch.mm(v.view(-1, k1), last.T, out=work["columns"]).view(k0, -1)
        first = self.splits[0]
        plus, minus = halves(columns, first, work["plus"], work["minus"])
        for rows, matrix, product, name in (
            (slice(0, None, 2), first.even, plus, "even"),
            (slice(1, None, 2), first.odd, minus, "odd"),
        ):
            grid = torch.mm(matrix, product, out=work[name]).view(-1, batch, channels, self.shape[1])
            out[:, :, rows].copy_(grid.permute(1, 2, 0, 3))
        return out

    def laplacian_eigenvalues(self, h: Float[Tensor, " batch"]) -> Tensor:
        """-sum over axes of (4 / h^2) sin^2(theta / 2), (batch, 1, *modes), float64 (the modes in each
        axis's `order`)."""
        total = torch.zeros((), dtype=torch.float64, device=h.device)
        for axis, theta in enumerate(self.angles):
            view = [1] * self.ndim
            view[axis] = -1
            total = total + torch.sin(theta / 2).square().view(view)
        return -4.0 * total.unsqueeze(0).unsqueeze(0) / h.view(-1, 1, *([1] * self.ndim)).square()


def halves(x: Tensor, split: AxisSplit, plus: Tensor, minus: Tensor) -> tuple[Tensor, Tensor]:
    """Into `plus` and `minus`: the first modes of `x` (along its first axis) plus and minus (times the
    split's sign) their partners, the middle mode kept: what the even and the odd nodes' products take."""
    kept, pairs = split.even.shape[1], split.pairs
    torch.add(x[:pairs], x[kept:], alpha=split.sign, out=plus[:pairs])
    torch.sub(x[:pairs], x[kept:], alpha=split.sign, out=minus[:pairs])
    plus[pairs:] = minus[pairs:] = x[pairs:kept]
    return plus, minus


@functools.lru_cache(maxsize=16)
def cached_basis(
    shape: tuple[int, ...], kinds: tuple[tuple[str, str], ...], dtype: torch.dtype, device: torch.device
) -> Basis:
    """The `Basis` of a grid, built once per grid, sides' kinds, dtype and device (a rollout runs block after
    block on one grid; the build inverts a matrix per axis in numpy). Its tensors are never written to."""
    return Basis(shape, dict(kinds), dtype, device)


def forcing_pattern(side: str, kind: str, series: SideSeries, h: Tensor, shape: Sequence[int]) -> Tensor:
    """Where a unit c(t) of `side` enters the Laplacian: profile / h^2 on the nodes next to a Dirichlet
    side, 2 profile / h on a Neumann side's nodes (the ghost mirror), (batch, 1, *shape), float64."""
    ndim = len(shape)
    axis, high = divmod(SIDES.index(side), 2)
    n = shape[axis]
    hv = h.view(-1, 1, *([1] * ndim))
    pattern = torch.zeros((h.shape[0], 1, *shape), dtype=torch.float64, device=h.device)
    if kind == "dirichlet":
        layer, weight = (n - 2 if high else 1), 1.0 / hv.square()
    else:
        layer, weight = (n - 1 if high else 0), 2.0 / hv
    values = (series.profile * weight.squeeze(axis + 2)).unsqueeze(axis + 2)
    pattern.narrow(axis + 2, layer, 1).copy_(values.expand_as(pattern.narrow(axis + 2, layer, 1)))
    return pattern


def frame_multiplier(mu: Tensor, growth: Tensor, angular: Tensor, t0: float, t1: float) -> Tensor:
    """S(t0, t1) of the module docstring: the integral of e^{mu (t1 - s)} sin(angular s) over [t0, t1]
    (`angular` per sample, shaped to broadcast against `mu`)."""
    w = angular
    s0, c0, s1, c1 = torch.sin(w * t0), torch.cos(w * t0), torch.sin(w * t1), torch.cos(w * t1)
    numerator = growth * (mu * s0 + w * c0) - (mu * s1 + w * c1)
    denominator = mu.square() + w.square()
    return torch.where(denominator == 0, 0.0, numerator / torch.where(denominator == 0, 1.0, denominator))


def exact_heat(
    u0: Float[Tensor, "batch channels *space"],
    diffusivity: Float[Tensor, " batch"],
    lengths: Float[Tensor, " batch"],
    kinds: dict[str, str],
    sides: dict[str, SideSeries],
    boundary: Callable[[float], BoundaryValues],
    dt: float,
    steps: int,
    save_every: int,
    write: Callable[[int, Tensor], None],
    on_frame: Callable[[int], None] | None = None,
    into: Tensor | None = None,
    discretisation: str = "finite_difference",
) -> None:
    """The semi-discrete heat solution from `u0` at the frame times k save_every dt (k = 0 .. steps //
    save_every), each handed to `write(k, u)` (the Dirichlet nodes set from `boundary`, which must agree
    with `sides`); `on_frame(steps)` after each frame with the steps it spans. Per-sample numbers
    (`diffusivity`, `lengths`, `sides`) are float64; the transforms run in u0's dtype."""
    shape = tuple(u0.shape[2:])
    ndim = len(shape)
    dtype = u0.dtype
    chebyshev = discretisation == "chebyshev"
    key = tuple(sorted(kinds.items()))
    basis = (cached_chebyshev_basis if chebyshev else cached_basis)(shape, key, dtype, u0.device)
    h = lengths / (shape[0] - 1)
    # every per-mode array in the basis's working layout (`Basis.layout`)
    eigenvalues = basis.laplacian_eigenvalues(lengths if chebyshev else h)
    mu = basis.layout(diffusivity.view(-1, 1, *([1] * ndim)) * eigenvalues)
    span = save_every * dt
    growth = torch.exp(mu * span)
    phi = torch.where(mu == 0, span, torch.expm1(mu * span) / torch.where(mu == 0, 1.0, mu))

    def spectral(pattern: Tensor) -> Tensor:
        return basis.to_spectral(pattern.to(dtype))

    mask = unknown_mask(shape, kinds).to(u0.device)
    steady: Tensor | None = None
    oscillating = []
    offsets = []  # Chebyshev: (lift on the Neumann nodes, series), added to each frame
    for side, series in sides.items():
        moving = bool((series.amplitude != 0).any())
        if not bool((series.value != 0).any()) and not moving:
            continue
        if chebyshev:
            lifted = lift(side, kinds, series.profile, lengths, shape)
            pattern = spectral(laplacian(lifted, lengths))  # read on the evolved nodes only
            offsets.append((torch.where(mask, lifted, 0.0), series))
        else:
            pattern = spectral(torch.where(mask, forcing_pattern(side, kinds[side], series, h, shape), 0.0))
        scale = basis.per_sample(diffusivity)
        term = pattern * (scale * basis.per_sample(series.value) * phi).to(dtype)
        steady = term if steady is None else steady + term
        if moving:
            amplitude = scale * basis.per_sample(series.amplitude)
            oscillating.append((pattern, amplitude, basis.per_sample(series.angular)))
    decay = growth.to(dtype).contiguous()

    def impose(u: Tensor, t: float) -> Tensor:
        """`u` with its Dirichlet nodes set, y sides first so that x sides win the corners (and the
        Chebyshev lifts added on the Neumann nodes); in place on purpose."""
        for lifted, series in offsets:
            c = series.value + series.amplitude * torch.sin(series.angular * t)
            u.add_((lifted * c.view(-1, *([1] * (lifted.dim() - 1)))).to(dtype))
        values = boundary(t)
        for side in reversed(sides_of(ndim)):
            if kinds[side] == "dirichlet":
                axis, high = divmod(SIDES.index(side), 2)
                dim = axis - ndim
                u.narrow(dim, shape[axis] - 1 if high else 0, 1).copy_(values[side].unsqueeze(dim))
        return u

    work = basis.workspace(u0.shape[0], u0.shape[1])
    if chebyshev:  # the Neumann nodes from the evolved ones and the boundary values (they are not free)
        start = impose(basis.to_grid(basis.to_spectral(u0), torch.empty_like(u0), work), 0.0)
    else:
        start = impose(u0.clone(), 0.0)
    if into is None:
        write(0, start)
    else:
        into[:, 0].copy_(start)
    v = basis.to_spectral(start)  # a fresh tensor, advanced in place below
    grid = start  # each frame's nodes, written over (`write` copies them)
    for k in range(1, steps // save_every + 1):
        t0, t1 = (k - 1) * save_every * dt, k * save_every * dt
        v.mul_(decay)
        if steady is not None:
            v.add_(steady)
        for pattern, amplitude, angular in oscillating:
            v.add_(pattern * (amplitude * frame_multiplier(mu, growth, angular, t0, t1)).to(dtype))
        if into is None:
            write(k, impose(basis.to_grid(v, grid, work), t1))
        else:
            impose(basis.to_grid(v, into[:, k], work), t1)
        if on_frame is not None:
            on_frame(save_every)
    if on_frame is not None and steps % save_every:
        on_frame(steps % save_every)
