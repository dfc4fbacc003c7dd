"""Darcy flow: -div(a grad u) = f on the square [0, L]^2, u = 0 on the boundary; a piecewise-constant
permeability a from a thresholded Gaussian random field, as in the FNO paper (Li et al., ICLR 2021, 5.2).

A steady problem stored as a two-frame trajectory, channels first (samples, 2, 1, s, s): frame 0 is the
input a, frame 1 the solution u, in the one channel `a_then_u`; a window of history 1 and horizon 1 is the
operator a -> u (docs/darcy.md says why this layout).

- Permeability: mu ~ N(0, (-Laplacian + tau^2 I)^-alpha) with zero Neumann conditions, as the cosine series
  mu = sum_{k, l < modes, (k, l) != (0, 0)} xi_kl cos(pi k x / L) cos(pi l y / L) / (pi^2 (k^2 + l^2) +
  tau^2)^(alpha / 2), xi_kl ~ N(0, 1) (the mean mode left out, as the paper's generator does); a =
  `permeability_high` where mu >= 0, `permeability_low` elsewhere. Only the sign of mu matters, so its scale
  is not fixed. The series is evaluated on the solve grid with type-I discrete cosine transforms.
- Forcing: f constant per sample, `forcing` (PDEBench's Darcy sets are f = beta for beta in {0.01, 0.1, 1,
  10, 100}: a range of it draws beta per sample, recorded in `params`).
- Grid: the vertex grid of s = `resolution` points per axis, both ends included, x_i = i L / (s - 1). The
  problem is solved on the finer vertex grid of (s - 1) `refinement` + 1 points and every `refinement`-th
  point is kept (the paper solves at 421 and keeps every 5th, 10th, ... point), a and u alike.
- Solver: `five_point.py` (finite volumes, harmonic face averages by default; preconditioned CG to a
  relative residual of `tolerance`), float64, rounded to float32 for the store.
- Reproducibility: a sample's field comes from its own generator (numpy's pocketfft, one thread), and its
  solve runs in a block of a size fixed by the grid and the device kind, padded to that size with copies
  (`systems/batching.py`), each sample stopping on its own residual: the same bytes in any batch, shard
  split or thread count.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import AT_LEAST_ONE, POSITIVE, Range, between, one_of
from dynaforge.errors import ConfigError
from dynaforge.systems.base import InitialStates, SystemBase, Trajectories
from dynaforge.systems.batching import (
    LANES,
    block_values_for,
    pad_rows,
    power_of_two_block,
    run_blocks,
)
from dynaforge.systems.elliptic.five_point import solve
from dynaforge.systems.pde.initial import draw_from_range
from dynaforge.threads import serialised

BLOCK_VALUES = 2**18
"""A CPU block solves about this many solve-grid values (at least `LANES` samples: 16 of the 193 x 193 grid
of the FNO-paper preset), every block padded to its full size."""


@dataclass
class DarcyConfig(SystemConfig):
    """-div(a grad u) = f on [0, L]^2, u = 0 on the boundary (`dynaforge.systems.elliptic.darcy`).

    Steady: the two stored frames are a and u, so `steps` and `save_every` stay 1 and `dt` only labels the
    frames (t = 0: a, t = dt: u); `order` and `initial` are not used."""

    name: str = "darcy"
    ndim: int = 2
    """2: the unit square (Darcy is 2D only)."""
    resolution: int = 49
    """Points per axis of the stored vertex grid, both ends included: x_i = i L / (resolution - 1)."""
    domain_length: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """Side L of the square (per sample); the random field is drawn in units of L, so u scales as L^2."""
    dt: float = 1.0
    """Only labels the two frames: t = 0 for a, t = dt for u."""
    steps: int = 1
    """1: the trajectory is [a, u]."""
    dtype: Literal["float32", "float64"] = "float64"
    """float64: the solve runs in float64 (the store holds float32)."""
    refinement: int = field(
        default=4, metadata={"check": AT_LEAST_ONE.because("solve points per kept point")}
    )
    """The solve grid has (resolution - 1) * refinement + 1 points per axis; every refinement-th is kept."""
    forcing: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """The constant source f (per sample; PDEBench's beta)."""
    permeability_high: float = field(default=12.0, metadata={"check": POSITIVE.because("a permeability")})
    """a where the random field is >= 0 (the FNO paper: 12)."""
    permeability_low: float = field(default=3.0, metadata={"check": POSITIVE.because("a permeability")})
    """a where the random field is < 0 (the FNO paper: 3)."""
    field_alpha: float = field(default=2.0, metadata={"check": POSITIVE.because("a smoothness exponent")})
    """alpha of the field's covariance (-Laplacian + tau^2 I)^-alpha (the FNO paper: 2)."""
    field_tau: float = field(default=3.0, metadata={"check": POSITIVE.because("an inverse length scale")})
    """tau of the field's covariance (the FNO paper: 3)."""
    modes: int = field(default=64, metadata={"check": AT_LEAST_ONE.because("cosine modes per axis")})
    """Cosine modes per axis of the random field (at most the solve grid's points per axis)."""
    face_average: Literal["harmonic", "arithmetic"] = field(
        default="harmonic", metadata={"check": one_of("harmonic", "arithmetic")}
    )
    """How a face's permeability is made from its two points' (docs/darcy.md): `harmonic` keeps the flux
    continuous across a jump; `arithmetic` is the FNO paper's MATLAB solver."""
    tolerance: float = field(
        default=1e-12,
        metadata={"check": between(0.0, 1e-6, open_low=True).because("relative residual of the solve")},
    )
    """Each sample's CG stops when its residual is below this times its right-hand side (2-norms)."""
    max_iterations: int = field(default=1000, metadata={"check": AT_LEAST_ONE.because("CG iterations")})
    """A sample still above the tolerance after this many iterations is refused (NaN: generation stops)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        fixed = {"ndim": 2, "steps": 1, "save_every": 1, "dtype": "float64"}
        for key, value in fixed.items():
            if getattr(self, key) != value:
                raise ConfigError(
                    f"system.{key}={getattr(self, key)!r}: darcy is a steady 2D problem solved in float64 "
                    f"(its two frames are a and u); set system.{key}={value!r} or leave it out"
                )
        if self.modes > self.solve_points:
            raise ConfigError(
                f"system.modes={self.modes}: the random field has at most as many cosine modes per axis as the "
                f"solve grid has points ({self.solve_points}); lower system.modes or raise system.refinement"
            )

    @property
    def solve_points(self) -> int:
        """Points per axis of the grid the problem is solved on."""
        return (self.resolution - 1) * self.refinement + 1


def random_field_scales(config: DarcyConfig) -> np.ndarray:
    """(modes, modes): the standard deviation of each cosine coefficient, 0 for the mean mode."""
    k = np.arange(config.modes, dtype=np.float64)
    wavenumbers = math.pi**2 * (k[:, None] ** 2 + k[None, :] ** 2) + config.field_tau**2
    scales = wavenumbers ** (-config.field_alpha / 2.0)
    scales[0, 0] = 0.0
    return scales


def cosine_series_on_grid(coefficients: np.ndarray, points: int) -> np.ndarray:
    """sum_{k, l} c_kl cos(pi k i / (n - 1)) cos(pi l j / (n - 1)) at i, j = 0 .. n - 1 (n = `points`): the
    type-I DCT of the coefficients zero-padded to n x n, with its end terms' weight 1 and the others 1/2."""
    padded = np.zeros((points, points))
    modes = coefficients.shape[0]
    padded[:modes, :modes] = coefficients
    weights = np.full(points, 0.5)
    weights[[0, -1]] = 1.0
    weighted = padded * weights[:, None] * weights[None, :]
    import scipy.fft  # lazy: scipy.fft loads scipy.special (0.3-0.5 s), only Darcy's permeability needs it

    return scipy.fft.dct(scipy.fft.dct(weighted, type=1, axis=0, workers=1), type=1, axis=1, workers=1)


def draw_permeability(config: DarcyConfig, rng: np.random.Generator) -> np.ndarray:
    """One sample's a on the solve grid (points, points), float64."""
    coefficients = random_field_scales(config) * rng.standard_normal((config.modes, config.modes))
    mu = cosine_series_on_grid(coefficients, config.solve_points)
    return np.where(mu >= 0.0, config.permeability_high, config.permeability_low)


class Darcy(SystemBase):
    """Darcy flow as a system (module docstring); parameters (domain_length, forcing)."""

    name = "darcy"
    config_class = DarcyConfig
    conserved: ClassVar[tuple[str, ...]] = ()
    channels: ClassVar[int] = 1
    rows_per_unit: ClassVar[int] = 1

    def __init__(self, config: DarcyConfig) -> None:
        if not isinstance(config, DarcyConfig):
            raise TypeError(f"Darcy needs a DarcyConfig, got {type(config).__name__}")
        self.config = config
        self.ndim = 2
        self.shape = (config.resolution, config.resolution)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    @property
    def channel_names(self) -> tuple[str, ...]:
        return ("a_then_u",)

    @property
    def axis_names(self) -> tuple[str, ...]:
        return ("x", "y")

    def draw_samples(self, rngs: Sequence[np.random.Generator]) -> InitialStates:
        """Parameters (batch, P) and a on the solve grid (batch, 1, n, n), float64, one generator each
        (parameters first, then the field)."""
        params, fields = [], []
        for rng in rngs:
            params.append([draw_from_range(getattr(self.config, name), rng) for name in self.parameter_names])
            fields.append(draw_permeability(self.config, rng)[None])
        return InitialStates(torch.tensor(params, dtype=torch.float64), torch.from_numpy(np.stack(fields)))

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """x_i = i L / (s - 1), both ends included, per sample and axis (N, s)."""
        lengths = params[:, list(self.parameter_names).index("domain_length")]
        unit = np.linspace(0.0, 1.0, self.config.resolution)
        return {axis: lengths[:, None] * unit[None, :] for axis in self.axis_names}

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        return {
            "boundary_condition": "u = 0 on every side (Dirichlet)",
            "boundary_types": ["WALL", "WALL"],  # x, y in The Well's words (store.format.BOUNDARY_TYPES)
            "frames": "0: permeability a, 1: solution u of -div(a grad u) = forcing",
        }

    def divergence_cause(self) -> str:
        config = self.config
        contrast = config.permeability_high / config.permeability_low
        needed = math.ceil(0.5 * math.sqrt(max(contrast, 1.0 / contrast)) * math.log(2.0 / config.tolerance))
        return (
            f"the conjugate gradient solve did not reach system.tolerance={config.tolerance:g} within "
            f"system.max_iterations={config.max_iterations} (a permeability contrast of {contrast:g} needs about "
            f"{needed}); raise system.max_iterations or system.tolerance"
        )

    def block_samples(self, device: torch.device) -> int:
        """Samples per solve block on `device`: from the grid and the device kind alone, a power of two times
        `LANES`, so that every tensor of a block holds whole lane groups (`systems/batching.py`)."""
        values = self.config.solve_points**2
        return power_of_two_block(values, block_values_for(device, BLOCK_VALUES), LANES)

    def rollout(
        self,
        initial: Float[Tensor, "batch 1 n n"],
        params: Float[Tensor, "batch n_params"],
        on_step: Callable[[int], None] | None = None,
    ) -> Trajectories:
        """[a, u] on the kept grid (batch, 2, 1, s, s) for the permeabilities `initial` on the solve grid.

        Blocks are padded to their full size on every device, so each solve call has one shape whatever the
        batch (a batch of one solves a whole block of copies)."""
        n = self.config.solve_points
        solve_grid = " (the permeability a on the solve grid of system.resolution and system.refinement)"
        self.check_batch(initial, params, (1, n, n), solve_grid)
        names = self.parameter_names
        device = initial.device
        block = self.block_samples(device)
        report = serialised(on_step)
        every = self.config.refinement
        fields = torch.empty(
            (initial.shape[0], 2, 1, *self.shape), dtype=torch.float64, device=device
        )  # filled block by block (in-place writes on purpose; blocks write disjoint rows)
        length = params[:, names.index("domain_length")]
        forcing = params[:, names.index("forcing")]

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            a = pad_rows(initial[rows, 0].to(torch.float64), block)
            rhs = pad_rows(forcing[rows].to(torch.float64), block).view(-1, 1, 1).expand_as(a)
            spacing = pad_rows(length[rows].to(torch.float64), block) / (n - 1)
            solution = solve(
                a, rhs, spacing, self.config.face_average, self.config.tolerance, self.config.max_iterations
            )
            u = torch.where(solution.converged.view(-1, 1, 1), solution.u, torch.nan)
            fields[rows, 0, 0] = a[:count, ::every, ::every]
            fields[rows, 1, 0] = u[:count, ::every, ::every]
            if report is not None:
                report(count)

        run_blocks(run_block, initial.shape[0], block, device)
        time = torch.tensor([0.0, self.config.dt], dtype=torch.float64)
        return Trajectories(fields, time)
