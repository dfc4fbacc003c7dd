"""The `system` section: `SystemConfig`, the fields every grid system shares, and the random CNN operators'
section. Each PDE declares its own section beside its physics, in its module of `dynaforge.systems.pde`;
`system_config_class` finds the section a `system.name` stands for."""

from __future__ import annotations

import dataclasses
import importlib
from dataclasses import dataclass, field
from typing import Any, Literal

from dynaforge.config.base import (
    AT_LEAST_ONE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    InitialConfig,
    Range,
    at_least,
    check_values,
    checked,
    is_range_field,
    one_of,
    ranged,
)

DEFAULT_SYSTEM = "burgers"
"""The system of a config that names none."""

SYSTEM_REGISTRY = "dynaforge.systems.registry"
"""The module holding every system and the rule for names given by import path (`system_class`)."""


def system_config_class(name: object, key: str = "system.name") -> type[Any]:
    """The dataclass of the `system` section that `system.name` = `name` stands for; a `ConfigError` naming
    `key` for an unknown name or an import path that leads to no dynaforge system.

    The dataclass is declared beside its system's physics, one layer up (`dynaforge.systems`), so the config
    layer reaches the registry by name when a config is built rather than by an import statement: the same
    by-name import that a user's system needs (its module is named by the config, docs/user-systems.md), and
    the one reference of this layer to the one above it (docs/architecture.md, "Layers")."""
    if not isinstance(name, str):
        raise ConfigError(f"{key} must be a string (a system's name or import path), got {name!r}")
    registry = importlib.import_module(SYSTEM_REGISTRY)
    return registry.system_config_class(name, key)


@dataclass
class SystemConfig:
    """A periodic PDE on [0, L)^d solved pseudo-spectrally (see `dynaforge.systems.pde.spectral`)."""

    name: str = DEFAULT_SYSTEM
    """Which system: one of `dynaforge.systems.SYSTEMS`, or a system of your own named by import path
    (`mypackage.pdes:SwiftHohenberg`, docs/user-systems.md)."""
    resolution: int = checked(256, check=at_least(4.0).because("grid points per axis"))
    """Grid points per axis."""
    ndim: int = checked(1, check=one_of(1, 2, 3))
    """Spatial dimensions (1, 2 or 3; each system lists the ones it supports)."""
    domain_length: Range = ranged(1.0, check=POSITIVE.because("domain length"))
    """Length L of the periodic domain (per sample)."""
    dt: float = checked(0.01, check=POSITIVE.because("time step"))
    """Inner time step of the solver."""
    steps: int = checked(200, check=AT_LEAST_ONE)
    """Inner steps per trajectory."""
    save_every: int = checked(1, check=AT_LEAST_ONE)
    """Keep every k-th inner step (the initial state is always kept)."""
    order: int = checked(4, check=one_of(1, 2, 3, 4))
    """Order of the exponential time differencing Runge-Kutta scheme: 1, 2, 3 or 4."""
    dtype: Literal["float32", "float64"] = "float32"
    """Precision of the solver state (the store always holds float32)."""
    fused: bool = False
    """Periodic PDEs: run the elementwise work of each ETDRK step as a few loops compiled by `torch.compile`
    (inductor; a C++ compiler on the CPU) instead of one pass per operation. The same numbers as the eager
    step to rounding (identical bytes measured on the AMD EPYC), and as independent of batch and thread
    count; compiling takes seconds once per process (docs/generation_speed.md, "Fused step")."""
    initial: InitialConfig = field(default_factory=InitialConfig)
    """Initial-condition families and normalisation."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.steps % self.save_every:
            raise ConfigError(f"steps ({self.steps}) must be a multiple of save_every ({self.save_every})")

    @property
    def n_frames(self) -> int:
        """Frames stored per trajectory, the initial one included."""
        return self.steps // self.save_every + 1

    def parameter_names(self) -> tuple[str, ...]:
        """Names of the per-sample physical parameters (every `Range` field), in storage order."""
        return tuple(f.name for f in dataclasses.fields(self) if is_range_field(type(self), f.name))


@dataclass
class ParameterSpec:
    """One dimension of a sampled parameter space; a unit-cube coordinate q in [0, 1) maps to a value.

    - `int`: integers low..high inclusive, equal mass each (floor(low + q (high - low + 1))).
    - `real`: low + q (high - low), or log-uniform when `log`.
    - `choice`: one of `choices` (name -> weight), by inverse CDF over the weights in the listed order.
    - `bool`: true when q < probability.
    """

    kind: Literal["int", "real", "choice", "bool"] = "real"
    """Type of the parameter."""
    low: float = 0.0
    """`int`/`real`: smallest value."""
    high: float = 1.0
    """`int`/`real`: largest value."""
    log: bool = False
    """`real`: log-uniform (needs low > 0)."""
    choices: dict[str, float] = field(
        default_factory=dict, metadata={"check": NON_NEGATIVE.because("an option's weight")}
    )
    """`choice`: option -> weight (non-negative, positive sum)."""
    probability: float = checked(0.5, check=FRACTION.because("a probability"))
    """`bool`: probability of true."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.kind in ("int", "real") and self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"an int parameter needs integer bounds, got [{self.low}, {self.high}]")
        if self.kind == "real" and self.log and self.low <= 0:
            raise ConfigError(f"a log-scaled parameter needs low > 0, got {self.low}")
        if self.kind == "choice" and (not self.choices or sum(self.choices.values()) <= 0):
            raise ConfigError(
                f"a choice needs options with non-negative weights, positive sum: {self.choices}"
            )


def _int_spec(low: int, high: int) -> ParameterSpec:
    return ParameterSpec(kind="int", low=float(low), high=float(high))


def _choice_spec(**weights: float) -> ParameterSpec:
    return ParameterSpec(kind="choice", choices=dict(weights))


def _real_spec(low: float, high: float, log: bool = False) -> ParameterSpec:
    return ParameterSpec(kind="real", low=low, high=high, log=log)


@dataclass
class OperatorSpace:
    """The parameter space of random CNN operators; each field is one Sobol dimension, in this order.

    An operator is: stem conv (C -> stem_width, then activation); `depth` layers, layer l a
    kernel_size x kernel_size conv to min(stem_width * 2^(l+1), width_cap) channels, normalisation,
    activation (a `residual` block adds its input back when the width is unchanged); a 1x1 conv back to C;
    plus Gaussian noise of std noise_scale per output value. See `dynaforge.systems.random_cnn`.
    """

    depth: ParameterSpec = field(default_factory=lambda: _int_spec(2, 3))
    """Number of hidden conv layers after the stem (2..N)."""
    stem_width: ParameterSpec = field(default_factory=lambda: _choice_spec(**{"16": 1.0, "32": 1.0}))
    """Channels after the stem."""
    width_cap: ParameterSpec = field(default_factory=lambda: _choice_spec(**{"64": 1.0}))
    """Largest hidden width (layers double the width until they reach it)."""
    kernel_size: ParameterSpec = field(default_factory=lambda: _choice_spec(**{"3": 2.0, "5": 1.0}))
    """Odd spatial kernel size of the stem and hidden convs (periodic padding)."""
    block: ParameterSpec = field(default_factory=lambda: _choice_spec(conv=1.0, residual=1.0))
    """Hidden layer type: `conv` or `residual`."""
    norm: ParameterSpec = field(default_factory=lambda: _choice_spec(instance=1.0, group=1.0))
    """Normalisation after each hidden conv: `instance`, or `group` (groups of 8 channels)."""
    activation: ParameterSpec = field(default_factory=lambda: _choice_spec(gelu=1.0, silu=1.0, relu=1.0))
    """Activation: `gelu`, `silu`, `relu` or `tanh`."""
    weight_gain: ParameterSpec = field(default_factory=lambda: _real_spec(0.5, 2.0, log=True))
    """Scale of the weights relative to a unit-variance (fan-in) initialisation."""
    noise_scale: ParameterSpec = field(default_factory=lambda: _real_spec(1e-3, 1e-1, log=True))
    """Standard deviation of the additive Gaussian noise on the operator output."""
    policy: ParameterSpec = field(
        default_factory=lambda: _choice_spec(autoregressive=1.0, residual=1.0, convex=1.0)
    )
    """Update: `autoregressive` x <- O(x), `residual` x <- x + dt O(x), `convex` x <- a x + (1 - a) O(x)."""
    residual_dt: ParameterSpec = field(default_factory=lambda: _real_spec(0.05, 0.5, log=True))
    """dt of the residual policy."""
    convex_alpha: ParameterSpec = field(default_factory=lambda: _real_spec(0.5, 0.95))
    """a of the convex policy."""


@dataclass
class RandomCNNConfig(SystemConfig):
    """Random neural operators: each sampled operator (a stochastic CNN) is iterated from an initial field.

    Trajectories are stored operator by operator, `realizations` consecutive rows each (same operator,
    same initial field, independent noise). `n_train`/`n_val`/`n_test` and `shard_size` count rows and
    must be multiples of `realizations`. `dt` only labels the frames (the residual policy has its own).
    `order` and `domain_length` are unused but for the grid coordinates.
    """

    name: str = "random_cnn"
    ndim: int = 2
    resolution: int = 64
    dt: float = 1.0
    steps: int = 64
    channels: int = checked(3, check=AT_LEAST_ONE)
    """Channels of the state (the operator maps C channels to C channels)."""
    realizations: int = checked(3, check=AT_LEAST_ONE)
    """Stochastic realizations (noise streams) per operator."""
    space: OperatorSpace = field(default_factory=OperatorSpace)
    """The sampled parameter space (scrambled Sobol points)."""
    initial: InitialConfig = field(
        default_factory=lambda: InitialConfig(
            families={"grf": 1.0, "multiscale": 1.0, "blobs": 1.0, "stripes": 1.0}, normalize="std"
        )
    )
    precision: Literal["auto", "bfloat16", "float32"] = "auto"
    """Precision of the convolutions (the state and the noise stay float32). `auto`: bfloat16 where the
    device has bf16 matrix units (AMX on a CPU, tensor cores on a GPU), where it is the fastest; float32
    elsewhere (on AVX-512 bf16 without AMX, float32 measured faster: docs/random_cnn.md). The choice is
    recorded in every shard (`conv_precision`)."""
    channels_last: bool = True
    """Run the grouped engine's convolutions in channels-last layout (the fused engine always does)."""
    engine: Literal["fused", "grouped"] = "fused"
    """`fused`: one operator at a time, its M realizations together, each layer's activations kept in cache
    and its normalisation, activation and padding fused (fastest on CPU). `grouped`: K operators of an
    architecture as one grouped convolution per layer (fewest kernel launches, the GPU layout)."""
    compile: bool = True
    """torch.compile the fused engine's step: one graph per architecture (about 10-20 s on first use,
    cached on disk by torch), reused by all its operators. Off: the same step runs eagerly (slower)."""
    max_group: int = checked(16, check=AT_LEAST_ONE)
    """Most operators of one architecture batched into one grouped convolution."""
    memory_budget_gb: float = checked(4.0, check=POSITIVE)
    """Memory a group's activations and trajectory buffer may use; bigger groups are split."""
    features: bool = False
    """Also compute per-trajectory summary features (stored as `features` with `feature_names`)."""
    spectrum_bins: int = checked(8, check=AT_LEAST_ONE)
    """Radial bins of the power-spectrum features."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ndim != 2:
            raise ConfigError(f"random_cnn runs in 2D only (ndim=2), got ndim={self.ndim}")
