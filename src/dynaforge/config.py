"""Typed configuration: nested dataclasses, loaded from YAML presets, overridden with dotted keys.

A preset is a small YAML file in `configs/`. On the command line, `key.sub=value` overrides any field
(`system.viscosity.low=0.005`). Values are parsed as YAML scalars. Every key is checked against the
dataclasses below: an unknown or mistyped key stops with an error that names it and lists the valid keys.

The system section is chosen by its `name` (`burgers`, `ks`, ...): each system has its own dataclass with
its own physical parameters, each a `Range` drawn per sample.
"""

from __future__ import annotations

import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml
from omegaconf import OmegaConf
from omegaconf.errors import OmegaConfBaseException

from dynaforge.atomic import atomic_write_text


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and what would be valid."""


# --------------------------------------------------------------------------------------------------
# Building blocks


@dataclass
class Range:
    """A physical parameter drawn per sample, uniformly in [low, high] (log-uniformly when `log`).

    A plain number in YAML (`viscosity: 0.01`) means a constant: low = high.
    """

    low: float
    """Smallest value drawn."""
    high: float
    """Largest value drawn."""
    log: bool = False
    """Draw uniformly in log space (needs low > 0)."""

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.low <= 0:
            raise ConfigError(f"a log-uniform range needs low > 0, got low={self.low}")


@dataclass
class InitialConfig:
    """Initial conditions. Each sample picks a family by weight, draws a field, then normalises it.

    Families (1D and up; the last four are in `dynaforge.systems.initial`):
    - `fourier`: sum over wavenumbers m = 1..max_wavenumber of a_m sin(2 pi m x / L + phi_m) per axis,
      a_m ~ U(-1, 1), phi_m ~ U(0, 2 pi).
    - `grf`: a Gaussian random field with squared-exponential covariance exp(-r^2 / (2 l^2)),
      l = length_scale * L, synthesised in Fourier space with random complex Gaussian coefficients.
    - `multiscale`: a sum of `octaves` band-limited noises, band j holding |m| in [2^j, 2^(j+1)), equal variance.
    - `blobs`: 1..n_blobs periodic Gaussian bumps of random sign, centre and radius (~ blob_radius L).
    - `stripes`: a plane wave sin(2 pi m.x / L + phi) with a random integer direction m, |m_i| <= max.

    Normalisation (`normalize`): `max` scales so that max |u0| = amplitude; `std` so that the spatial
    standard deviation equals amplitude (unit variance with amplitude 1); `none` only multiplies the draw by amplitude.
    With `zero_mean` the spatial mean is removed first.
    """

    families: dict[str, float] = field(default_factory=lambda: {"fourier": 1.0})
    """Family name -> weight (weights need not sum to one)."""
    max_wavenumber: int = 8
    """`fourier`: highest wavenumber of the truncated series."""
    length_scale: float = 0.1
    """`grf`: correlation length as a fraction of the domain length."""
    normalize: Literal["max", "std", "none"] = "max"
    """How each initial field is scaled (see the class docstring)."""
    amplitude: float = 1.0
    """Target of the normalisation."""
    zero_mean: bool = False
    """Remove the spatial mean before normalising."""
    n_blobs: int = 6
    """`blobs`: largest number of Gaussian bumps (each field draws 1..n_blobs, signs random)."""
    blob_radius: float = 0.08
    """`blobs`: mean bump radius as a fraction of the domain length."""
    max_stripe_wavenumber: int = 6
    """`stripes`: highest wavenumber of the plane wave's random integer direction."""
    octaves: int = 4
    """`multiscale`: number of dyadic bands of band-limited noise, each with equal variance."""

    def __post_init__(self) -> None:
        if (
            not self.families
            or any(w < 0 for w in self.families.values())
            or sum(self.families.values()) <= 0
        ):
            raise ConfigError(f"families needs non-negative weights with a positive sum, got {self.families}")
        if self.max_wavenumber < 1:
            raise ConfigError(f"max_wavenumber must be >= 1, got {self.max_wavenumber}")
        if self.length_scale <= 0:
            raise ConfigError(f"length_scale must be > 0, got {self.length_scale}")
        if self.n_blobs < 1 or self.blob_radius <= 0 or self.max_stripe_wavenumber < 1 or self.octaves < 1:
            raise ConfigError("n_blobs, max_stripe_wavenumber and octaves must be >= 1, blob_radius > 0")


# --------------------------------------------------------------------------------------------------
# Systems


@dataclass
class SystemConfig:
    """A periodic PDE on [0, L)^d solved pseudo-spectrally (see `dynaforge.systems.spectral`)."""

    name: str = "burgers"
    """Which system: one of `dynaforge.systems.SYSTEMS`."""
    resolution: int = 256
    """Grid points per axis."""
    ndim: int = 1
    """Spatial dimensions (1, 2 or 3; each system lists the ones it supports)."""
    domain_length: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """Length L of the periodic domain (per sample)."""
    dt: float = 0.01
    """Inner time step of the solver."""
    steps: int = 200
    """Inner steps per trajectory."""
    save_every: int = 1
    """Keep every k-th inner step (the initial state is always kept)."""
    order: int = 4
    """Order of the exponential time differencing Runge-Kutta scheme: 1, 2, 3 or 4."""
    dtype: Literal["float32", "float64"] = "float32"
    """Precision of the solver state (the store always holds float32)."""
    initial: InitialConfig = field(default_factory=InitialConfig)
    """Initial-condition families and normalisation."""

    def __post_init__(self) -> None:
        if self.ndim not in (1, 2, 3):
            raise ConfigError(f"ndim must be 1, 2 or 3, got {self.ndim}")
        if self.resolution < 4:
            raise ConfigError(f"resolution must be >= 4, got {self.resolution}")
        if self.dt <= 0:
            raise ConfigError(f"dt must be > 0, got {self.dt}")
        if self.steps < 1 or self.save_every < 1:
            raise ConfigError(f"steps and save_every must be >= 1, got {self.steps} and {self.save_every}")
        if self.steps % self.save_every:
            raise ConfigError(f"steps ({self.steps}) must be a multiple of save_every ({self.save_every})")
        if self.order not in (1, 2, 3, 4):
            raise ConfigError(f"order must be 1, 2, 3 or 4, got {self.order}")
        if self.domain_length.low <= 0:
            raise ConfigError("domain_length must be > 0")

    @property
    def n_frames(self) -> int:
        """Frames stored per trajectory, the initial one included."""
        return self.steps // self.save_every + 1

    def parameter_names(self) -> tuple[str, ...]:
        """Names of the per-sample physical parameters (every `Range` field), in storage order."""
        return tuple(f.name for f in dataclasses.fields(self) if _is_range_field(type(self), f.name))


@dataclass
class HeatConfig(SystemConfig):
    """u_t = nu * laplacian(u)."""

    name: str = "heat"
    diffusivity: Range = field(default_factory=lambda: Range(0.01, 0.01))
    """Diffusion coefficient nu."""


@dataclass
class AdvectionConfig(SystemConfig):
    """u_t + c u_x = 0 (c along every axis in more than one dimension)."""

    name: str = "advection"
    speed: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """Transport speed c."""


@dataclass
class BurgersConfig(SystemConfig):
    """u_t + u u_x = nu u_xx."""

    name: str = "burgers"
    viscosity: Range = field(default_factory=lambda: Range(0.01, 0.01))
    """Kinematic viscosity nu."""


@dataclass
class KSConfig(SystemConfig):
    """u_t + u u_x + u_xx + u_xxxx = 0 (Kuramoto-Sivashinsky)."""

    name: str = "ks"
    domain_length: Range = field(default_factory=lambda: Range(100.0, 100.0))
    resolution: int = 200
    dt: float = 0.1
    steps: int = 500


# ---- 2D systems ----------------------------------------------------------------------------------


@dataclass
class NavierStokesConfig(SystemConfig):
    """Incompressible Navier-Stokes in vorticity form on [0, L)^2:

    w_t + u . grad(w) = nu laplacian(w) - drag w + f,  u = (psi_y, -psi_x),  laplacian(psi) = -w,
    with Kolmogorov forcing f = -A k_f cos(k_f y), the curl of the body force (A sin(k_f y), 0),
    k_f = 2 pi forcing_wavenumber / L.
    """

    name: str = "navier_stokes"
    ndim: int = 2
    resolution: int = 128
    domain_length: Range = field(default_factory=lambda: Range(2 * 3.141592653589793, 2 * 3.141592653589793))
    dt: float = 0.01
    viscosity: Range = field(default_factory=lambda: Range(1e-3, 1e-3))
    """Kinematic viscosity nu."""
    drag: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """Linear (Rayleigh) drag coefficient; 0 switches it off."""
    forcing_amplitude: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """Amplitude A of the Kolmogorov body force; 0 switches it off."""
    forcing_wavenumber: int = 4
    """Integer wavenumber of the Kolmogorov forcing along y."""


@dataclass
class GrayScottConfig(SystemConfig):
    """Gray-Scott reaction-diffusion, channels (u, v):

    u_t = D_u laplacian(u) - u v^2 + F (1 - u),  v_t = D_v laplacian(v) + u v^2 - (F + k) v.
    Defaults follow Pearson (1993): L = 2.5, D_u = 2e-5, D_v = 1e-5, dt = 1, with (F, k) = (0.03, 0.055),
    where spots and stripes persist (at many (F, k) the pattern dies out to the trivial state u = 1, v = 0).
    """

    name: str = "gray_scott"
    ndim: int = 2
    resolution: int = 128
    domain_length: Range = field(default_factory=lambda: Range(2.5, 2.5))
    dt: float = 1.0
    steps: int = 1000
    save_every: int = 10
    feed: Range = field(default_factory=lambda: Range(0.03, 0.03))
    """Feed rate F."""
    kill: Range = field(default_factory=lambda: Range(0.055, 0.055))
    """Kill rate k."""
    diffusion_u: Range = field(default_factory=lambda: Range(2e-5, 2e-5))
    """Diffusion coefficient of u."""
    diffusion_v: Range = field(default_factory=lambda: Range(1e-5, 1e-5))
    """Diffusion coefficient of v."""
    initial: InitialConfig = field(default_factory=lambda: InitialConfig(families={"blobs": 1.0}))


@dataclass
class KS2DConfig(SystemConfig):
    """Kuramoto-Sivashinsky in its scalar (gradient) form, any dimension:
    h_t + laplacian(h) + laplacian^2(h) + |grad h|^2 / 2 = 0."""

    name: str = "ks2d"
    ndim: int = 2
    resolution: int = 64
    domain_length: Range = field(default_factory=lambda: Range(32.0, 32.0))
    dt: float = 0.05
    steps: int = 400


# ---- random neural operators ------------------------------------------------------------------------


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
    choices: dict[str, float] = field(default_factory=dict)
    """`choice`: option -> weight (non-negative, positive sum)."""
    probability: float = 0.5
    """`bool`: probability of true."""

    def __post_init__(self) -> None:
        if self.kind in ("int", "real") and self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"an int parameter needs integer bounds, got [{self.low}, {self.high}]")
        if self.kind == "real" and self.log and self.low <= 0:
            raise ConfigError(f"a log-scaled parameter needs low > 0, got {self.low}")
        if self.kind == "choice" and (
            not self.choices or any(w < 0 for w in self.choices.values()) or sum(self.choices.values()) <= 0
        ):
            raise ConfigError(
                f"a choice needs options with non-negative weights, positive sum: {self.choices}"
            )
        if self.kind == "bool" and not 0.0 <= self.probability <= 1.0:
            raise ConfigError(f"probability must be in [0, 1], got {self.probability}")


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
    channels: int = 3
    """Channels of the state (the operator maps C channels to C channels)."""
    realizations: int = 3
    """Stochastic realizations (noise streams) per operator."""
    space: OperatorSpace = field(default_factory=OperatorSpace)
    """The sampled parameter space (scrambled Sobol points)."""
    initial: InitialConfig = field(
        default_factory=lambda: InitialConfig(
            families={"grf": 1.0, "multiscale": 1.0, "blobs": 1.0, "stripes": 1.0}, normalize="std"
        )
    )
    precision: Literal["bfloat16", "float32"] = "bfloat16"
    """Precision of the convolutions (the state and the noise stay float32)."""
    channels_last: bool = True
    """Run the grouped engine's convolutions in channels-last layout (the fused engine always does)."""
    engine: Literal["fused", "grouped"] = "fused"
    """`fused`: one operator at a time, its M realizations together, each layer's activations kept in cache
    and its normalisation, activation and padding fused (fastest on CPU). `grouped`: K operators of an
    architecture as one grouped convolution per layer (fewest kernel launches, the GPU layout)."""
    compile: bool = True
    """torch.compile the fused engine's step: one graph per architecture (about 10-20 s on first use,
    cached on disk by torch), reused by all its operators. Off: the same step runs eagerly (slower)."""
    max_group: int = 16
    """Most operators of one architecture batched into one grouped convolution."""
    memory_budget_gb: float = 4.0
    """Memory a group's activations and trajectory buffer may use; bigger groups are split."""
    features: bool = False
    """Also compute per-trajectory summary features (stored as `features` with `feature_names`)."""
    spectrum_bins: int = 8
    """Radial bins of the power-spectrum features."""

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.ndim != 2:
            raise ConfigError(f"random_cnn runs in 2D only (ndim=2), got ndim={self.ndim}")
        if self.channels < 1 or self.realizations < 1 or self.max_group < 1 or self.spectrum_bins < 1:
            raise ConfigError("channels, realizations, max_group and spectrum_bins must be >= 1")
        if self.memory_budget_gb <= 0:
            raise ConfigError(f"memory_budget_gb must be > 0, got {self.memory_budget_gb}")


SYSTEM_CONFIGS: dict[str, type[SystemConfig]] = {
    "heat": HeatConfig,
    "advection": AdvectionConfig,
    "burgers": BurgersConfig,
    "ks": KSConfig,
    "navier_stokes": NavierStokesConfig,
    "gray_scott": GrayScottConfig,
    "ks2d": KS2DConfig,
    "random_cnn": RandomCNNConfig,
}


# --------------------------------------------------------------------------------------------------
# Datasets


@dataclass
class DatasetConfig:
    """How many trajectories to generate, how they are split into shards, and where they run."""

    n_train: int = 64
    """Trajectories in the train split."""
    n_val: int = 16
    """Trajectories in the validation split."""
    n_test: int = 16
    """Trajectories in the test split."""
    shard_size: int = 64
    """Trajectories per HDF5 shard (the unit of resumption and of parallel generation)."""
    batch_size: int = 64
    """Trajectories stepped together by the solver."""
    seed: int = 0
    """Base seed; each sample's seed derives from (seed, split, global index) alone."""
    device: str = "cpu"
    """Where the solver runs: `cpu`, `cuda`, `cuda:1` or `auto`."""

    def __post_init__(self) -> None:
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name} must be >= 0")
        if self.shard_size < 1 or self.batch_size < 1:
            raise ConfigError("shard_size and batch_size must be >= 1")

    def split_sizes(self) -> dict[str, int]:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}


# --------------------------------------------------------------------------------------------------
# The whole configuration


@dataclass
class Config:
    """Everything one run needs; each section belongs to one stage of the pipeline."""

    system: SystemConfig = field(default_factory=BurgersConfig)
    """The ground-truth simulator and its parameter ranges."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Sizes, sharding and seeds of the generated dataset."""


# --------------------------------------------------------------------------------------------------
# Loading, overriding, saving


def load_config(path: str | Path | None = None, overrides: Sequence[str] = ()) -> Config:
    """Load a YAML preset (or the defaults when `path` is None) and apply dotted `key=value` overrides."""
    try:
        base = OmegaConf.load(path) if path is not None else OmegaConf.create({})
    except FileNotFoundError as error:
        raise ConfigError(f"config file not found: {path}") from error
    except (yaml.YAMLError, OmegaConfBaseException) as error:
        raise ConfigError(f"cannot parse {path}: {error}") from error
    for item in overrides:
        if "=" not in item or item.startswith("="):
            raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    try:
        # A Range written as a plain number is expanded first, so that `x.low=...` can override it.
        base = OmegaConf.create(_expand_range_shorthand(Config, OmegaConf.to_container(base)))
        merged = OmegaConf.merge(base, OmegaConf.from_dotlist(list(overrides)))
        data = OmegaConf.to_container(merged, resolve=True)
    except OmegaConfBaseException as error:
        raise ConfigError(f"cannot apply overrides {list(overrides)}: {error}") from error
    if not isinstance(data, dict):
        raise ConfigError(f"{path} must hold a mapping at the top level")
    return config_from_dict(data)


def config_from_dict(data: Mapping[str, Any]) -> Config:
    """Build a validated `Config` from plain data (the inverse of `config_to_dict`)."""
    return _build(Config, data, "")


def config_to_dict(config: Any) -> dict[str, Any]:
    """Plain nested dicts of a dataclass config, ready for YAML or JSON."""
    return dataclasses.asdict(config)


def config_to_yaml(config: Any) -> str:
    return yaml.safe_dump(config_to_dict(config), sort_keys=False)


def save_config(config: Any, path: str | Path) -> None:
    """Write the resolved config beside an artifact, atomically."""
    atomic_write_text(path, config_to_yaml(config))


def config_differences(a: Mapping[str, Any], b: Mapping[str, Any], prefix: str = "") -> list[str]:
    """Dotted keys whose values differ between two plain config dicts."""
    keys = sorted(set(a) | set(b))
    differences = []
    for key in keys:
        dotted = f"{prefix}{key}"
        left, right = a.get(key, "<missing>"), b.get(key, "<missing>")
        if isinstance(left, Mapping) and isinstance(right, Mapping):
            differences.extend(config_differences(left, right, f"{dotted}."))
        elif left != right:
            differences.append(f"{dotted}: {left!r} != {right!r}")
    return differences


def resolve_device(name: str) -> str:
    """`auto` -> `cuda` when available, else `cpu`; anything else is returned as given."""
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return name


# --------------------------------------------------------------------------------------------------
# Dataclass construction with key checking


def _build(cls: type, data: Any, path: str, default: Any = None) -> Any:
    """Instantiate dataclass `cls` from `data`; keys absent from `data` come from `default` (an instance)."""
    if cls is Range and isinstance(data, int | float) and not isinstance(data, bool):
        return Range(float(data), float(data))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path)} must be a mapping of keys to values, got {data!r}")
    if cls is SystemConfig or (isinstance(cls, type) and issubclass(cls, SystemConfig) and "name" in data):
        cls = _system_class(data, path)
    if default is not None and type(default) is not cls:
        default = None
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(_unknown_key_message(str(key), names, path))
        field_default = _field_default(cls, key) if default is None else getattr(default, key)
        kwargs[key] = _convert(hints[key], value, _join(path, key), field_default)
    if default is not None:
        for name in names:
            kwargs.setdefault(name, getattr(default, name))
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.init
        and f.name not in kwargs
        and f.default is dataclasses.MISSING
        and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        raise ConfigError(f"{_where(path)} is missing required key(s): {', '.join(missing)}")
    try:
        return cls(**kwargs)
    except ConfigError as error:
        raise ConfigError(f"{_where(path)}: {error}") from None


def _field_default(cls: type, name: str) -> Any:
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
    return None


def _expand_range_shorthand(cls: type, data: Any) -> Any:
    """Replace numbers standing for a `Range` with {low, high} mappings, following the dataclass schema."""
    if not isinstance(data, dict) or not dataclasses.is_dataclass(cls):
        return data
    if issubclass(cls, SystemConfig):
        cls = SYSTEM_CONFIGS.get(data.get("name", "burgers"), cls)
    hints = typing.get_type_hints(cls)
    result = dict(data)
    for key, value in data.items():
        hint = hints.get(key)
        if hint is Range and isinstance(value, int | float) and not isinstance(value, bool):
            result[key] = {"low": float(value), "high": float(value)}
        elif dataclasses.is_dataclass(hint):
            result[key] = _expand_range_shorthand(hint, value)
    return result


def _system_class(data: Mapping[str, Any], path: str) -> type[SystemConfig]:
    name = data.get("name", "burgers")
    if name not in SYSTEM_CONFIGS:
        valid = ", ".join(sorted(SYSTEM_CONFIGS))
        raise ConfigError(f"unknown system {_join(path, 'name')}={name!r}; valid systems: {valid}")
    return SYSTEM_CONFIGS[name]


def _convert(hint: Any, value: Any, path: str, default: Any = None) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        errors = []
        for option in options:
            try:
                return _convert(option, value, path)
            except ConfigError as error:
                errors.append(str(error))
        raise ConfigError(errors[0] if len(errors) == 1 else f"{path}: no option fits {value!r}: {errors}")
    if origin is Literal:
        if value not in args:
            raise ConfigError(f"{path}={value!r} is not valid; choose one of: {', '.join(map(str, args))}")
        return value
    if origin is dict:
        if not isinstance(value, Mapping):
            raise ConfigError(f"{path} must be a mapping, got {value!r}")
        key_type, value_type = args
        return {
            _convert(key_type, k, f"{path}.{k}"): _convert(value_type, v, f"{path}.{k}")
            for k, v in value.items()
        }
    if origin in (list, tuple, Sequence):
        if not isinstance(value, list | tuple):
            raise ConfigError(f"{path} must be a list, got {value!r}")
        item_type = args[0] if args else Any
        items = [_convert(item_type, v, f"{path}[{i}]") for i, v in enumerate(value)]
        return tuple(items) if origin is tuple else items
    if dataclasses.is_dataclass(hint):
        return _build(hint, value, path, default if dataclasses.is_dataclass(default) else None)
    if hint is Any:
        return value
    if hint is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{path} must be true or false, got {value!r}")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{path} must be an integer, got {value!r}")
        return value
    if hint is float:
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ConfigError(f"{path} must be a number, got {value!r}")
        return float(value)
    if hint is str:
        if not isinstance(value, str):
            raise ConfigError(f"{path} must be a string, got {value!r}")
        return value
    raise ConfigError(f"{path}: unsupported config type {hint!r}")


def _is_range_field(cls: type, name: str) -> bool:
    return typing.get_type_hints(cls)[name] is Range


def _unknown_key_message(key: str, valid: Sequence[str], path: str) -> str:
    dotted = _join(path, key)
    close = difflib.get_close_matches(key, valid, n=1)
    hint = f" Did you mean '{_join(path, close[0])}'?" if close else ""
    return f"unknown config key '{dotted}'.{hint} Valid keys under {_where(path)}: {', '.join(valid)}"


def _join(path: str, key: str) -> str:
    return f"{path}.{key}" if path else key


def _where(path: str) -> str:
    return f"'{path}'" if path else "the top level"
