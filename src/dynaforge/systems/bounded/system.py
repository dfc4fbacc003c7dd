"""What every bounded system shares: its config section (`BoundedConfig`, with one `SideConfig` per side)
and `BoundedSystem`, which draws samples, builds each sample's boundary values from its parameters and
rolls a batch out with the stepper of `core.py` (whose docstring states the grid and scheme conventions).

Boundary values per side, per sample: g(s, t) = profile(s) (value + amplitude sin(2 pi frequency t)), s the
position along the side (2D), `value`, `amplitude` and `frequency` drawn per sample from their ranges and
stored as parameters `<side>_value`, `<side>_amplitude`, `<side>_frequency`; the sides' kinds are shard
attributes.

Reproducibility: the batch is stepped in blocks whose size comes from the grid alone, each on one intra-op
thread (`systems/batching.py`). A step is shifted views and in-place IEEE additions and products, which
round the same wherever a sample sits in a block; the one transcendental call, the sine of the boundary
values, runs on (block,) tensors padded to whole lane groups, so every value takes the vector path.
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
from dynaforge.config.base import NON_NEGATIVE, POSITIVE, Range, at_least, checked, one_of
from dynaforge.errors import ConfigError
from dynaforge.systems.base import BlockSteppedSystem, InitialStates, RolloutRun
from dynaforge.systems.batching import (
    LANES,
    block_values_for,
    pad_rows,
    power_of_two_block,
)
from dynaforge.systems.bounded.core import (
    KINDS,
    Boundary,
    BoundaryValues,
    Grid,
    Stencils,
    integrate,
    sides_of,
    stable_dt,
)
from dynaforge.systems.pde.initial import draw_from_range, draw_initial_field

SIDE_PARAMETERS = ("value", "amplitude", "frequency")
"""The per-sample numbers of one side, stored as parameters `<side>_<name>`."""

BLOCK_VALUES = {1: 2**17, 2: 2**17}
"""A CPU block holds about this many state values per number of dimensions (about a core's cache in
float64; a 1D block is as large as a 2D one, so that each operation's fixed cost is spread over as many
values: docs/bounded.md, "Speed")."""

BLOCK_MAX_SAMPLES = 1024
"""CPU blocks hold at most this many samples."""


def zero_range() -> Range:
    return Range(0.0, 0.0)


@dataclass
class SideConfig:
    """One side: its kind and its values g(s, t) = profile(s) (value + amplitude sin(2 pi frequency t))."""

    kind: Literal["dirichlet", "neumann"] = "dirichlet"
    """`dirichlet`: u = g on the side; `neumann`: du/dn = g, n the outward normal (g = 0: insulated)."""
    value: Range = field(default_factory=zero_range)
    """Steady part of g (per sample)."""
    amplitude: Range = field(default_factory=zero_range)
    """Amplitude of the oscillating part of g (per sample)."""
    frequency: Range = field(
        default_factory=zero_range, metadata={"check": NON_NEGATIVE.because("cycles per time")}
    )
    """Frequency of the oscillating part, cycles per unit time (per sample)."""
    profile: Literal["uniform", "parabolic"] = "uniform"
    """Shape along the side in 2D: `uniform` (1) or `parabolic` (4 s (1 - s), an inflow profile; s in [0, 1]
    along the side). Unused in 1D."""


@dataclass
class BoundaryConfig:
    """The four sides; a 1D system uses `left` (x = 0) and `right` (x = L) only."""

    left: SideConfig = field(default_factory=SideConfig)
    """x = 0."""
    right: SideConfig = field(default_factory=SideConfig)
    """x = L."""
    bottom: SideConfig = field(default_factory=SideConfig)
    """y = 0 (2D)."""
    top: SideConfig = field(default_factory=SideConfig)
    """y = L (2D)."""


@dataclass
class BoundedConfig(SystemConfig):
    """A PDE on [0, L]^d with a boundary condition per side, finite differences and explicit Runge-Kutta
    (`dynaforge.systems.bounded`, docs/bounded.md)."""

    resolution: int = checked(64, check=at_least(4.0).because("grid points per axis"))
    """Grid nodes per axis, both ends included (h = L / (resolution - 1))."""
    domain_length: Range = field(
        default_factory=lambda: Range(1.0, 1.0), metadata={"check": POSITIVE.because("domain length")}
    )
    """Length L of the domain [0, L]^d (per sample)."""
    dt: float = checked(0.001, check=POSITIVE.because("time step"))
    """Time step of the Runge-Kutta scheme (at most the stability bound, which a larger value's error names)."""
    order: int = checked(3, check=one_of(3, 4))
    """Runge-Kutta scheme: 3 (SSP-RK3) or 4 (classical RK4)."""
    boundary: BoundaryConfig = field(default_factory=BoundaryConfig)
    """The boundary condition of each side."""

    system_class: ClassVar[type | None] = None
    """The system this section configures (set by `BoundedSystem.__init_subclass__`)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if (
            self.system_class is not None
        ):  # the boundary kinds, ndim, order and dt checked as the config loads,
            self.system_class(self)  # before anything is written (building a system allocates nothing)

    def parameter_names(self) -> tuple[str, ...]:
        """The `Range` fields, then `<side>_value`, `<side>_amplitude`, `<side>_frequency` per side used."""
        sides = sides_of(self.ndim) if self.ndim in (1, 2) else ()
        return super().parameter_names() + tuple(f"{s}_{p}" for s in sides for p in SIDE_PARAMETERS)


@dataclass
class DiffusiveBoundedConfig(BoundedConfig):
    """A bounded system whose equation has the diffusion term nu laplacian(u)."""

    diffusivity: Range = field(
        default_factory=lambda: Range(0.01, 0.01), metadata={"check": POSITIVE.because("diffusivity")}
    )
    """Diffusion coefficient nu (per sample)."""


def floor_significant(value: float, digits: int = 3) -> float:
    """`value` rounded down to `digits` significant digits (a safe step to suggest)."""
    scale = 10.0 ** (math.floor(math.log10(value)) - digits + 1)
    return math.floor(value / scale) * scale


class BoundedSystem(BlockSteppedSystem):
    """A batched finite-difference solver on an interval or a square (see the module docstring).

    A subclass sets `name`, `config_class`, and provides `tendency` (its physics) and `rate_extents` (bounds
    on its discrete operator's decay and oscillation rates over the configured ranges, for the time step)."""

    name: ClassVar[str]
    config_class: ClassVar[type[BoundedConfig]]
    channels: ClassVar[int] = 1
    supported_ndim: ClassVar[tuple[int, ...]] = (1, 2)
    supported_kinds: ClassVar[tuple[str, ...]] = KINDS
    rows_per_unit: ClassVar[int] = 1

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "config_class" in cls.__dict__:
            cls.config_class.system_class = cls

    def __init__(self, config: BoundedConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config = config
        self.ndim = config.ndim
        if self.ndim not in self.supported_ndim:
            raise ConfigError(
                f"system.ndim={self.ndim}: {self.name} supports ndim in {self.supported_ndim}; set one of them"
            )
        if config.order not in (3, 4):
            raise ConfigError(
                f"system.order={config.order}: {self.name} steps with SSP-RK3 or RK4; set 3 or 4"
            )
        for side in sides_of(self.ndim):
            kind = getattr(config.boundary, side).kind
            if kind not in self.supported_kinds:
                raise ConfigError(
                    f"system.boundary.{side}.kind={kind!r}: {self.name} takes {' or '.join(self.supported_kinds)} "
                    "on each side; set one of them"
                )
        self.kinds = {side: getattr(config.boundary, side).kind for side in sides_of(self.ndim)}
        self.shape = (config.resolution,) * self.ndim
        self.real_dtype = torch.float64 if config.dtype == "float64" else torch.float32
        bound = self.stability_bound()
        if config.dt > bound:
            raise ConfigError(
                f"system.dt={config.dt:g} is above the stability bound of {self.scheme} for {self.name} at "
                f"resolution {config.resolution} and the configured parameter ranges; the largest safe value is "
                f"about {bound:.4g}: set system.dt <= {floor_significant(bound):g} (or lower system.resolution)"
            )

    # ---- what a subclass provides -------------------------------------------------------------

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        """F(u) of u_t = F(u), from the state's stencils and the per-sample parameters (batch, 1, *ones)."""
        raise NotImplementedError

    def rate_extents(self) -> tuple[float, float]:
        """(decay, oscillation) rate bounds of the discrete operator over the configured ranges."""
        raise NotImplementedError

    # ---- shared helpers ---------------------------------------------------------------------------

    @property
    def scheme(self) -> str:
        return "SSP-RK3" if self.config.order == 3 else "RK4"

    @property
    def smallest_spacing(self) -> float:
        return self.config.domain_length.low / (self.config.resolution - 1)

    def diffusion_extent(self, coefficient: str) -> float:
        """4 nu d / h^2 at the largest nu and the smallest h: the fastest decay of the discrete Laplacian."""
        return 4.0 * getattr(self.config, coefficient).high * self.ndim / self.smallest_spacing**2

    def stability_bound(self) -> float:
        """The largest stable time step for the configured grid and parameter ranges (`core.stable_dt`)."""
        return stable_dt(self.config.order, *self.rate_extents())

    def largest_boundary_value(self) -> float:
        """The largest |g| a Dirichlet side can take (its profile is at most 1)."""
        values = [0.0]
        for side, kind in self.kinds.items():
            if kind == "dirichlet":
                spec = getattr(self.config.boundary, side)
                values.append(
                    max(abs(spec.value.low), abs(spec.value.high))
                    + max(abs(spec.amplitude.low), abs(spec.amplitude.high))
                )
        return max(values)

    def divergence_cause(self) -> str:
        return (
            f"the rollout diverged with system.dt={self.config.dt:g} (estimated stability bound "
            f"{self.stability_bound():.4g} for {self.scheme}); reduce system.dt or raise system.resolution"
        )

    # ---- parameters, initial states, boundary values -------------------------------------------

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    def parameter_range(self, name: str) -> Range:
        side, _, part = name.partition("_")
        if side in sides_of(self.ndim) and part in SIDE_PARAMETERS:
            return getattr(getattr(self.config.boundary, side), part)
        return getattr(self.config, name)

    def draw_parameters(self, rng: np.random.Generator) -> np.ndarray:
        """One sample's parameters, in `parameter_names` order (float64)."""
        return np.asarray([draw_from_range(self.parameter_range(n), rng) for n in self.parameter_names])

    def draw_initial(self, rng: np.random.Generator, parameters: np.ndarray) -> np.ndarray:
        """One sample's initial field (channels, *space), float64; its Dirichlet nodes are set at t = 0."""
        return np.stack(
            [draw_initial_field(self.config.initial, self.shape, rng) for _ in range(self.channels)]
        )

    def draw_samples(self, rngs: Sequence[np.random.Generator]) -> InitialStates:
        """Parameters, then the initial field, from each sample's own generator."""
        params, initial = [], []
        for rng in rngs:
            row = self.draw_parameters(rng)
            params.append(row)
            initial.append(self.draw_initial(rng, row))
        return InitialStates(torch.from_numpy(np.stack(params)), torch.from_numpy(np.stack(initial)))

    def side_profile(self, side: str, device: torch.device) -> Tensor | None:
        """The side's shape along it, (1, 1, n) float64; None where it is 1 (1D, or uniform)."""
        if self.ndim == 1 or getattr(self.config.boundary, side).profile == "uniform":
            return None
        n = self.config.resolution
        s = torch.from_numpy(self.unit_nodes()).to(device)
        return (4 * s * (1 - s)).view(1, 1, n)

    def unit_nodes(self) -> np.ndarray:
        """The nodes of an axis on [0, 1]: j / (n - 1), both ends included."""
        return np.arange(self.config.resolution) / (self.config.resolution - 1)

    def boundary_values(
        self, params: Float[Tensor, "batch n_params"], names: Sequence[str] | None = None
    ) -> Boundary:
        """g(t) of every side for a block of parameter rows (float64, columns `names`, by default
        `parameter_names`), in the state's dtype. The sides' g are computed together: one sine over (batch,
        sides), elementwise, so each value rounds as it would alone."""
        names = list(self.parameter_names if names is None else names)
        batch = params.shape[0]
        sides = list(self.kinds)
        value, amplitude, frequency = (
            params[:, [names.index(f"{side}_{p}") for side in sides]] for p in SIDE_PARAMETERS
        )  # (batch, sides) each

        profiles = [self.side_profile(side, params.device) for side in sides]
        n = self.config.resolution

        def values(t: float) -> BoundaryValues:
            g = value + amplitude * torch.sin((2 * math.pi * t) * frequency)
            result = {}
            for i, (side, shape) in enumerate(zip(sides, profiles, strict=True)):
                g_side = g[:, i].view(batch, 1, *([1] * (self.ndim - 1)))
                if shape is not None:
                    g_side = g_side * shape
                elif self.ndim == 2:  # times 1 along the side: the same numbers, broadcast
                    g_side = g_side.expand(batch, 1, n)
                result[side] = g_side.to(self.real_dtype)
            return result

        return values

    # ---- what the store keeps -------------------------------------------------------------------

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The nodes x_j = L `unit_nodes` of every axis, per sample (both ends included)."""
        lengths = params[:, list(self.parameter_names).index("domain_length")]
        nodes = self.unit_nodes()
        return {axis: lengths[:, None] * nodes[None, :] for axis in self.axis_names}

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        """Each side's kind and profile (its values are per-sample parameters)."""
        attributes: dict[str, Any] = {"boundary_types": ["WALL"] * self.ndim}  # store.format.BOUNDARY_TYPES
        for side, kind in self.kinds.items():
            attributes[f"boundary_{side}"] = kind
            if self.ndim == 2:
                attributes[f"boundary_{side}_profile"] = getattr(self.config.boundary, side).profile
        return attributes

    # ---- stepping -------------------------------------------------------------------------------

    def block_samples(self, device: torch.device) -> int:
        """Samples per block on `device`, from the grid and the device kind alone."""
        values = self.channels * math.prod(self.shape)
        block = power_of_two_block(values, block_values_for(device, BLOCK_VALUES[self.ndim]), LANES)
        return min(block, BLOCK_MAX_SAMPLES) if device.type == "cpu" else block

    def block_stepper(self, run: RolloutRun) -> Callable[[slice], None]:
        """Runge-Kutta steps of a block (`integrate`), padded to whole lane groups; `on_step(samples)` is
        called after every step of a block."""
        initial, params, steps, save_every, frames, report, _ = run
        names = self.parameter_names  # built from the config's fields: once, not per block
        length_column = names.index("domain_length")

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            block_params = pad_rows(params[rows].to(torch.float64), LANES)
            u0 = pad_rows(initial[rows].to(self.real_dtype), LANES)
            grid = Grid.build(self.shape, self.kinds, block_params[:, length_column], self.real_dtype)
            ones = [1] * (self.ndim + 1)
            named = {
                name: block_params[:, i].view(-1, *ones).to(self.real_dtype) for i, name in enumerate(names)
            }

            def write(frame: int, u: Tensor) -> None:
                frames[rows, frame] = u[:count]

            integrate(
                u0,
                lambda stencils, t: self.tendency(stencils, named),
                grid,
                self.boundary_values(block_params, names),
                self.config.dt,
                steps,
                save_every,
                self.config.order,
                write,
                on_step=None if report is None else lambda: report(count),
            )

        return run_block
