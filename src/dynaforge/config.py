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

    Families (1D and up; the last four are in `dynaforge.systems.pde.initial`):
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
    """A periodic PDE on [0, L)^d solved pseudo-spectrally (see `dynaforge.systems.pde.spectral`)."""

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


# --------------------------------------------------------------------------------------------------
# Gravitational N-body (its own system config: bodies instead of a grid)


@dataclass
class NBodyInitialConfig:
    """Initial conditions of an N-body system, one family per config (`dynaforge.systems.nbody.initial`).

    - `kepler`: two bodies on a Kepler orbit of semi-major axis a and eccentricity e in the xy plane, centre
      of mass at rest at the origin, pericentre on the +x axis, starting at mean anomaly `mean_anomaly`
      (0 = pericentre, pi = apocentre). Each mass is drawn from `mass`.
    - `figure_eight`: the three-body figure-eight choreography (Chenciner & Montgomery 2000, initial
      conditions of Simó), unit masses, period 6.32591398.
    - `plummer`: a Plummer sphere sampled as in Aarseth, Hénon & Wielen (1974), equal masses.
    - `cluster`: positions uniform in the unit ball, isotropic Gaussian velocities, masses from `mass`.
    `plummer` and `cluster` are put in N-body units: total mass 1, centre of mass at rest at the origin,
    positions scaled to virial radius 1 (W = -1/2 without softening), then velocities scaled so that
    K = `virial_ratio` * |sum_i x_i . F_i| with the softened forces (0.5 = virial equilibrium, E ~ -1/4).
    """

    family: Literal["kepler", "figure_eight", "plummer", "cluster"] = "kepler"
    """Which family (see the class docstring)."""
    semi_major_axis: Range = field(default_factory=lambda: Range(1.0, 1.0))
    """`kepler`: semi-major axis a of the relative orbit."""
    eccentricity: Range = field(default_factory=lambda: Range(0.5, 0.5))
    """`kepler`: eccentricity e, in [0, 1)."""
    mean_anomaly: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """`kepler`: orbital phase at t = 0 in radians (0 = pericentre)."""
    mass: Range = field(default_factory=lambda: Range(0.5, 0.5))
    """`kepler` and `cluster`: mass of each body (`cluster` then rescales the total to 1)."""
    virial_ratio: float = 0.5
    """`plummer` and `cluster`: K / |virial| after scaling (0.5 = equilibrium, < 0.5 collapses)."""

    def __post_init__(self) -> None:
        if self.semi_major_axis.low <= 0 or self.mass.low <= 0:
            raise ConfigError("semi_major_axis and mass must be > 0")
        if self.eccentricity.low < 0 or self.eccentricity.high >= 1:
            raise ConfigError(
                f"eccentricity must lie in [0, 1) (bound orbits), got [{self.eccentricity.low}, {self.eccentricity.high}]"
            )
        if self.virial_ratio < 0:
            raise ConfigError(f"virial_ratio must be >= 0, got {self.virial_ratio}")


@dataclass
class StepControlConfig:
    """How each system's step size is chosen (`dynaforge.systems.nbody.control`).

    - `fixed`: h = `system.dt`.
    - `adaptive` (classical): h = eta * min_i tau_i, tau_i = min(min_j s_ij / |v_j - v_i|, sqrt(min_j s_ij / |a_i|)),
      with s_ij = sqrt(|x_j - x_i|^2 + eps^2): the shortest fly-by time and free-fall time over bodies.
    - `learned`: h from a trained controller (`model`, a run folder of `dynaforge nbody train`) times `scale`.
    With `reversible`, the steps follow the explicit time-symmetric recursion
    1/dt_(n+1/2) + 1/dt_(n-1/2) = 2/h(y_n) (Hairer, Lubich & Wanner, Geometric Numerical Integration,
    VIII.3): the run is time-reversible, so the energy error stays bounded instead of drifting, at no extra
    force evaluation. Without it, dt_n = h(y_n) (cheaper to reason about, drifts).
    """

    kind: Literal["fixed", "adaptive", "learned"] = "fixed"
    """Which controller (see the class docstring)."""
    eta: float = 0.02
    """`adaptive`: accuracy factor of the classical criterion."""
    model: str | None = None
    """`learned`: run folder (or checkpoint file) of a trained controller."""
    scale: float = 1.0
    """`learned`: multiplies the predicted step (the accuracy knob of a trained controller)."""
    reversible: bool = True
    """Choose steps with the time-symmetric recursion (adaptive and learned)."""
    dt_max: float | None = None
    """Largest step allowed (null: no cap)."""
    max_steps: int = 10_000_000
    """Stop a run after this many steps per system (a guard against a collapsing step)."""

    def __post_init__(self) -> None:
        if self.eta <= 0 or self.scale <= 0:
            raise ConfigError(f"eta and scale must be > 0, got {self.eta} and {self.scale}")
        if self.dt_max is not None and self.dt_max <= 0:
            raise ConfigError(f"dt_max must be > 0 or null, got {self.dt_max}")
        if self.max_steps < 1:
            raise ConfigError(f"max_steps must be >= 1, got {self.max_steps}")


@dataclass
class NBodyConfig:
    """Gravitational N-body systems (`dynaforge.systems.nbody`: G = 1, Plummer softening, float64).

    Trajectories last `steps * dt` time units and keep a frame every `save_every * dt`; with `fixed`
    control dt is the step, otherwise only the frame spacing (the controller picks the steps).
    """

    name: str = "nbody"
    """The system name (`nbody`)."""
    bodies: int = 2
    """Bodies per system (`kepler` needs 2, `figure_eight` 3)."""
    integrator: Literal["leapfrog", "yoshida4"] = "leapfrog"
    """Kick-drift-kick leapfrog (2nd order) or Yoshida's 4th-order composition (3 forces per step)."""
    dt: float = 0.01
    """Fixed step, and the unit of the frame spacing and trajectory length."""
    steps: int = 1000
    """Trajectory length in units of dt."""
    save_every: int = 10
    """Keep a frame every `save_every * dt` time units (the initial frame is always kept)."""
    dtype: Literal["float32", "float64"] = "float64"
    """Precision of the state (the store always holds float32)."""
    softening: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """Plummer softening length eps (per system)."""
    external_mass: Range = field(default_factory=lambda: Range(0.0, 0.0))
    """Mass of the external point perturber (0 = none)."""
    external_position: list[float] = field(default_factory=lambda: [20.0, 0.0, 0.0])
    """Fixed position of the external perturber."""
    initial: NBodyInitialConfig = field(default_factory=NBodyInitialConfig)
    """Initial-condition family."""
    control: StepControlConfig = field(default_factory=StepControlConfig)
    """Step-size control."""

    def __post_init__(self) -> None:
        if self.bodies < 2:
            raise ConfigError(f"bodies must be >= 2, got {self.bodies}")
        needed = {"kepler": 2, "figure_eight": 3}.get(self.initial.family)
        if needed is not None and self.bodies != needed:
            raise ConfigError(
                f"initial.family={self.initial.family} has {needed} bodies; set bodies={needed}"
            )
        if self.dt <= 0:
            raise ConfigError(f"dt must be > 0, got {self.dt}")
        if self.steps < 1 or self.save_every < 1 or self.steps % self.save_every:
            raise ConfigError(
                f"steps ({self.steps}) must be a positive multiple of save_every ({self.save_every})"
            )
        if self.softening.low < 0 or self.external_mass.low < 0:
            raise ConfigError("softening and external_mass must be >= 0")
        if len(self.external_position) != 3:
            raise ConfigError(f"external_position needs 3 numbers (x, y, z), got {self.external_position}")

    @property
    def n_frames(self) -> int:
        """Frames stored per trajectory, the initial one included."""
        return self.steps // self.save_every + 1

    def parameter_names(self) -> tuple[str, ...]:
        """Per-system parameter columns in storage order (see `dynaforge.systems.nbody.NBody`)."""
        names = [f"mass_{i}" for i in range(self.bodies)]
        names += ["softening", "external_mass", "external_x", "external_y", "external_z"]
        if self.initial.family == "kepler":
            names += ["semi_major_axis", "eccentricity"]
        return tuple(names)


# The PDE systems share SystemConfig; the N-body system has bodies instead of a grid (NBodyConfig).
SYSTEM_CONFIGS: dict[str, type[SystemConfig] | type[NBodyConfig]] = {
    "heat": HeatConfig,
    "advection": AdvectionConfig,
    "burgers": BurgersConfig,
    "ks": KSConfig,
    "navier_stokes": NavierStokesConfig,
    "gray_scott": GrayScottConfig,
    "ks2d": KS2DConfig,
    "random_cnn": RandomCNNConfig,
    "nbody": NBodyConfig,
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
# Training windows, models, training, evaluation


@dataclass
class DataConfig:
    """Training windows cut from a dataset folder, and how they are batched.

    A window is `history` input frames followed by the frames the model must predict, all `stride` stored
    frames apart. Fields are normalised per channel with the train split's mean and standard deviation.
    """

    history: int = 1
    """Input frames the model sees per call."""
    horizon: int = 1
    """Frames the model predicts per call."""
    stride: int = 1
    """Take every `stride`-th stored frame (the model's time step is stride x the stored frame spacing)."""
    batch_size: int = 32
    """Windows per optimiser step (and per evaluation batch)."""
    num_workers: int = 0
    """DataLoader worker processes; 0 reads in the main process (the splits are held in memory)."""
    pin_memory: bool | None = None
    """Page-locked host batches for fast copies to a GPU; null means yes when training on CUDA."""
    start_method: Literal["forkserver", "spawn", "fork"] = "forkserver"
    """How DataLoader workers start; `fork` is unsafe with threads, CUDA or open HDF5 files."""

    def __post_init__(self) -> None:
        for name in ("history", "horizon", "stride", "batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.num_workers < 0:
            raise ConfigError(f"num_workers must be >= 0, got {self.num_workers}")


@dataclass
class ModelConfig:
    """A neural surrogate: `history` normalised frames in, the next `horizon` frames out.

    The section is chosen by its `name` (one of `dynaforge.models.MODELS`); each model has its own fields.
    """

    name: str = "fno"
    """Which model: one of `dynaforge.models.MODELS`."""
    residual: bool = True
    """Predict the change from the last input frame rather than the frames themselves."""


@dataclass
class FNOConfig(ModelConfig):
    """Fourier neural operator: lift, `layers` spectral blocks, project (Li et al. 2021)."""

    name: str = "fno"
    width: int = 32
    """Channels of the hidden representation."""
    modes: int = 16
    """Fourier modes kept per axis in every spectral convolution (at most n // 2 + 1)."""
    layers: int = 4
    """Spectral blocks."""
    projection: int = 64
    """Hidden channels of the output projection."""
    spectral_transform: Literal["auto", "fft", "dft"] = "auto"
    """How spectral convolutions reach the kept modes: `fft` (rfft, gather, scatter, irfft), `dft` (matrix
    products with truncated DFT matrices: same result to float rounding, faster when few modes are kept), or
    `auto` (`dft` when modes <= a quarter of the grid points on every axis, else `fft`)."""
    spectral_low_precision: bool = False
    """Let bf16/fp16 autocast run the `dft` path's matrix products (and the mode mixing) in low precision;
    false keeps the spectral convolution in fp32 whatever train.precision is (the `fft` path always does)."""

    def __post_init__(self) -> None:
        for name in ("width", "modes", "layers", "projection"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")


@dataclass
class UNetConfig(ModelConfig):
    """A small U-Net with periodic (circular) padding: `levels` resolutions, channels doubling per level."""

    name: str = "unet"
    channels: int = 16
    """Channels at the finest level."""
    levels: int = 3
    """Resolutions (the finest included); each coarser level halves the grid."""
    kernel_size: int = 3
    """Odd width of every convolution kernel."""

    def __post_init__(self) -> None:
        if self.channels < 1 or self.levels < 1:
            raise ConfigError(f"channels and levels must be >= 1, got {self.channels} and {self.levels}")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")


@dataclass
class LatentConfig(ModelConfig):
    """Latent operator: grid -> tokens (conv stem, patches, Fourier position features) -> pre-norm
    transformer blocks conditioned on dt and the system parameters (adaptive layer norm) -> grid.
    See `dynaforge.models.latent`."""

    name: str = "latent"
    width: int = 64
    """Token (embedding) dimension."""
    stem: int = 32
    """Channels of the convolutional stem that precedes patching."""
    patch: int = 4
    """Grid points per token along every axis (the grid size must be a multiple of it)."""
    depth: int = 4
    """Transformer blocks."""
    heads: int = 4
    """Attention heads (must divide `width`)."""
    mlp_ratio: int = 2
    """Hidden width of each block's MLP, in multiples of `width`."""
    attention: Literal["standard", "channel", "alternate"] = "alternate"
    """Token mixing: `standard` attention over tokens, `channel`-separated (cross-covariance) attention
    over feature channels, or `alternate` (standard, channel, standard, ...)."""
    merge_levels: int = 0
    """U-shaped token merging: halve the tokens per axis this many times on the way down (and restore
    them, with skip connections, on the way up); 0 keeps one resolution."""
    position_features: int = 8
    """Fourier frequencies per axis of the position features added to the tokens."""
    parameters: int = 0
    """System parameters the update is conditioned on (the stages fill it in from the dataset)."""
    dt: float = 1.0
    """Model time step assumed when a call gives none (the stages fill it in from the dataset)."""

    def __post_init__(self) -> None:
        for name in ("width", "stem", "patch", "depth", "heads", "mlp_ratio", "position_features"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.width % self.heads:
            raise ConfigError(f"heads={self.heads} must divide width={self.width}")
        if self.merge_levels < 0 or self.parameters < 0:
            raise ConfigError("merge_levels and parameters must be >= 0")
        if self.merge_levels * 2 > self.depth:
            raise ConfigError(
                f"merge_levels={self.merge_levels} needs depth >= {2 * self.merge_levels} (one block per "
                "level on the way down and one on the way up)"
            )
        if self.dt <= 0:
            raise ConfigError(f"dt must be > 0, got {self.dt}")


@dataclass
class FlowNetConfig(ModelConfig):
    """Velocity field of a conditional flow-matching model on the grid: circular convolutions, modulated by
    the flow time and the system parameters. See `dynaforge.models.flow`."""

    name: str = "flow"
    residual: bool = False
    width: int = 32
    """Hidden channels."""
    layers: int = 4
    """Residual convolution blocks."""
    kernel_size: int = 5
    """Odd width of every convolution kernel."""
    condition_frames: int = 2
    """Frames given beside the noisy state (residual corrector: the operator's prediction and the last input
    frame; steady prior: 0)."""
    parameters: int = 0
    """System parameters conditioned on (the stages fill it in from the dataset)."""
    scale: float = 1.0
    """Physical scale of the generated field in normalised units (the stages fill it in: the residual's
    standard deviation), so that the flow runs on unit-variance targets."""

    def __post_init__(self) -> None:
        if self.width < 1 or self.layers < 1 or self.condition_frames < 0 or self.parameters < 0:
            raise ConfigError("width and layers must be >= 1; condition_frames and parameters >= 0")
        if self.kernel_size < 1 or self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")
        if self.scale <= 0:
            raise ConfigError(f"scale must be > 0, got {self.scale}")


MODEL_CONFIGS: dict[str, type[ModelConfig]] = {
    "fno": FNOConfig,
    "unet": UNetConfig,
    "latent": LatentConfig,
    "flow": FlowNetConfig,
}


@dataclass
class OptimizerConfig:
    """The optimiser. Weight decay (`train.weight_decay`) never touches biases and norm scales.

    - `adamw`, `adam`: fused kernels where the device has them (`fused: null`).
    - `sgd`: with `momentum` (and optionally Nesterov momentum).
    - `muon`: one optimiser object holding two: `torch.optim.Muon` for matrix-shaped weights (2D weights, and
      convolution kernels seen as (out, in x kernel) matrices), AdamW for everything else (biases, norms,
      embeddings, the FNO's spectral weights stored as real pairs unless `muon_spectral`, and parameters
      whose names match `muon_exclude`). See `dynaforge.train.optim`.
    """

    name: Literal["adamw", "adam", "sgd", "muon"] = "adamw"
    """Which optimiser."""
    betas: list[float] = field(default_factory=lambda: [0.9, 0.999])
    """Adam(W) moment decay rates, two numbers (also the AdamW half of `muon`)."""
    eps: float = 1e-8
    """Adam(W) denominator guard."""
    momentum: float = 0.9
    """`sgd`: momentum factor (0 disables momentum)."""
    nesterov: bool = False
    """`sgd`: Nesterov momentum."""
    fused: bool | None = None
    """Fused Adam/AdamW/SGD kernels; null means wherever the device supports them."""
    muon_lr: float | None = None
    """`muon`: peak learning rate of the Muon half; null means `train.lr`."""
    muon_momentum: float = 0.95
    """`muon`: Muon's (Nesterov) momentum."""
    muon_adjust_lr: Literal["match_rms_adamw", "original"] = "match_rms_adamw"
    """`muon`: per-matrix lr scaling; `match_rms_adamw` (0.2 sqrt(max(A, B))) lets Muon reuse AdamW's lr."""
    muon_ns_steps: int = 5
    """`muon`: Newton-Schulz iterations of the orthogonalisation."""
    muon_spectral: bool = False
    """`muon`: also give spectral weights (in, out, modes...) to Muon, as (in, out x modes) matrices."""
    muon_exclude: list[str] = field(default_factory=list)
    """`muon`: parameter-name patterns (fnmatch, e.g. `lift.*`) kept on AdamW even when matrix-shaped."""

    def __post_init__(self) -> None:
        if len(self.betas) != 2 or not all(0 <= b < 1 for b in self.betas):
            raise ConfigError(f"betas must lie in [0, 1), got {self.betas}")
        if self.eps <= 0 or self.momentum < 0 or self.muon_momentum < 0:
            raise ConfigError("eps must be > 0, momentum and muon_momentum >= 0")
        if self.muon_lr is not None and self.muon_lr <= 0:
            raise ConfigError(f"muon_lr must be > 0 or null, got {self.muon_lr}")
        if self.muon_ns_steps < 1:
            raise ConfigError(f"muon_ns_steps must be >= 1, got {self.muon_ns_steps}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("nesterov needs momentum > 0")


@dataclass
class ScheduleConfig:
    """The learning-rate schedule: a linear warmup, then one of four shapes, as a multiple of the peak lr.

    Counted in `interval`s (optimiser steps or epochs). Warmup lasts `warmup_fraction` of all intervals.
    - `constant`: 1 after warmup.
    - `step`: multiplied by `gamma` every `step_size` intervals after warmup.
    - `cosine`: from 1 down to `min_lr_ratio` at the end of training.
    - `plateau`: multiplied by `factor` when the validation loss has not improved (by a relative
      `threshold`) for `patience` epochs; never below `min_lr_ratio`.
    """

    name: Literal["cosine", "constant", "step", "plateau"] = "cosine"
    """Shape after the warmup."""
    interval: Literal["step", "epoch"] = "step"
    """Advance the schedule once per optimiser step or once per epoch."""
    warmup_fraction: float = 0.05
    """Share of all intervals spent warming the lr up linearly from (nearly) zero."""
    min_lr_ratio: float = 0.0
    """`cosine`: final lr, `plateau`: floor, as a fraction of the peak lr."""
    step_size: int = 1
    """`step`: intervals between decays."""
    gamma: float = 0.5
    """`step`: decay factor."""
    patience: int = 2
    """`plateau`: epochs without improvement before a decay."""
    factor: float = 0.5
    """`plateau`: decay factor."""
    threshold: float = 1e-4
    """`plateau`: an improvement must beat the best loss by this relative amount."""

    def __post_init__(self) -> None:
        if not 0 <= self.warmup_fraction < 1:
            raise ConfigError(f"warmup_fraction must be in [0, 1), got {self.warmup_fraction}")
        if not 0 <= self.min_lr_ratio <= 1:
            raise ConfigError(f"min_lr_ratio must be in [0, 1], got {self.min_lr_ratio}")
        if self.step_size < 1 or self.patience < 0:
            raise ConfigError("step_size must be >= 1 and patience >= 0")
        if not (0 < self.gamma <= 1 and 0 < self.factor <= 1) or self.threshold < 0:
            raise ConfigError("gamma and factor must be in (0, 1], threshold >= 0")


@dataclass
class CompileConfig:
    """`torch.compile` of the model; if compilation fails the run falls back to eager (logged)."""

    enabled: bool = False
    """Compile the model's forward (and its backward)."""
    mode: Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"] = "default"
    """torch.compile mode."""
    backend: Literal["inductor", "aot_eager", "eager"] = "inductor"
    """torch.compile backend (`aot_eager` and `eager` are for debugging: no code generation)."""
    dynamic: bool | None = None
    """Dynamic shapes: null lets torch decide, false specialises on every new shape."""


@dataclass
class CudaGraphConfig:
    """Capture the whole training step (forward, backward, clip, optimiser, EMA) in a CUDA graph.

    CUDA only: after `warmup` eager steps on a side stream the step is captured once and replayed on
    static input buffers; batches of another shape (the last, partial one) run eagerly. Needs
    `optimizer.name` adam or adamw, `accumulate` 1, one process and fp32 or bf16; otherwise, or when
    capture fails, the run stays eager and says why in the log. Ignored on CPU.
    """

    enabled: bool = False
    """Capture the step on CUDA."""
    warmup: int = 3
    """Eager steps before capture (lets lazy state such as optimiser moments be allocated)."""

    def __post_init__(self) -> None:
        if self.warmup < 1:
            raise ConfigError(f"warmup must be >= 1, got {self.warmup}")


@dataclass
class EMAConfig:
    """An exponential moving average of the weights, updated after every optimiser step."""

    decay: float = 0.0
    """Weight of the old average per step (e.g. 0.999); 0 switches the EMA off."""
    warmup: bool = True
    """Use min(decay, (1 + n) / (10 + n)) at update n, so that early averages forget the initial weights."""
    evaluate: bool = True
    """Validate with the EMA weights and save them as the checkpoint's `model` (evaluation and best.pt)."""

    def __post_init__(self) -> None:
        if not 0 <= self.decay < 1:
            raise ConfigError(f"decay must be in [0, 1), got {self.decay}")


@dataclass
class WandbConfig:
    """Weights & Biases logging (the optional `wandb` extra: pip install 'dynaforge[wandb]')."""

    enabled: bool = False
    """Log to W&B besides metrics.jsonl."""
    project: str = "dynaforge"
    """W&B project."""
    entity: str | None = None
    """W&B entity (team or user); null uses the default of the W&B login."""
    group: str | None = None
    """Group runs together (e.g. the trials of one study)."""
    name: str | None = None
    """Run name; null uses the run folder's name."""
    tags: list[str] = field(default_factory=list)
    """Tags of the run."""
    mode: Literal["auto", "online", "offline"] = "auto"
    """`auto`: online when an API key is configured (WANDB_API_KEY or `wandb login`), else offline."""
    log_checkpoints: bool = False
    """Upload checkpoints/last.pt as a W&B `model` artifact after every epoch (aliases `latest`,
    `epoch-N`, and `best` when the epoch improved); `dynaforge train --resume-from-artifact` continues
    from one."""


@dataclass
class TrainConfig:
    """The training loop: optimiser, schedule, precision, compilation, the step, checkpoints and logging.

    `preset` fills in switches before the file's and command line's own values (which always win):
    - `debug`: deterministic algorithms, fp32, eager, a log line per step, stop at the first non-finite step.
    - `default`: the field defaults below (fp32, eager, portable).
    - `fast`: bf16 autocast, torch.compile, CUDA-graph capture of the step on CUDA, a log line per 100 steps.
    """

    preset: Literal["debug", "default", "fast"] = "default"
    """Switch set applied beneath explicit values (see the class docstring)."""
    epochs: int = 10
    """Passes over the training windows."""
    lr: float = 1e-3
    """Peak learning rate (reached at the end of the warmup)."""
    weight_decay: float = 1e-4
    """Decoupled weight decay (SGD: L2 penalty); never applied to biases and other 1D parameters."""
    optimizer: OptimizerConfig = field(default_factory=OptimizerConfig)
    """The optimiser."""
    schedule: ScheduleConfig = field(default_factory=ScheduleConfig)
    """The learning-rate schedule."""
    grad_clip: float | None = 1.0
    """Clip the global gradient norm to this value; null disables clipping (the norm is logged anyway)."""
    accumulate: int = 1
    """Micro-batches of `data.batch_size` whose gradients are summed per optimiser step."""
    precision: Literal["fp32", "bf16", "fp16"] = "fp32"
    """fp32; bf16 autocast (CPU and GPU); fp16 autocast with a gradient scaler (CUDA only). FFTs and
    losses always run in fp32."""
    compile: CompileConfig = field(default_factory=CompileConfig)
    """torch.compile of the model."""
    cuda_graph: CudaGraphConfig = field(default_factory=CudaGraphConfig)
    """CUDA-graph capture of the whole step (CUDA only)."""
    ema: EMAConfig = field(default_factory=EMAConfig)
    """Exponential moving average of the weights."""
    max_bad_steps: int = 10
    """Steps with a non-finite loss or gradient are skipped and counted; this many in a row stop the run."""
    loss: Literal["mse", "relative_l2"] = "mse"
    """Training loss on normalised frames: mean squared error or relative L2 per sample."""
    rollout_steps: int = 1
    """Model calls unrolled autoregressively per window; the loss covers every predicted frame."""
    log_every: int = 50
    """Optimiser steps per logging window (one line of metrics.jsonl, one read of device metrics)."""
    checkpoint_every: int = 0
    """Also write checkpoints/last.pt every this many optimiser steps (0: at the end of each epoch only)."""
    deterministic: bool = False
    """Deterministic algorithms and cuDNN settings, for bitwise-reproducible runs (slower)."""
    seed: int = 0
    """Seed of the weight initialisation, the data order and every random generator."""
    device: str = "auto"
    """Where to train: `cpu`, `cuda`, `cuda:1` or `auto` (under torchrun: this rank's GPU)."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Optional Weights & Biases logging."""

    def __post_init__(self) -> None:
        for name in ("epochs", "rollout_steps", "log_every", "accumulate", "max_bad_steps"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.lr <= 0:
            raise ConfigError(f"lr must be > 0, got {self.lr}")
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.grad_clip is not None and self.grad_clip <= 0:
            raise ConfigError(f"grad_clip must be > 0 or null, got {self.grad_clip}")
        if self.checkpoint_every < 0:
            raise ConfigError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")


TRAIN_PRESETS: dict[str, dict[str, Any]] = {
    "debug": {
        "deterministic": True,
        "precision": "fp32",
        "compile": {"enabled": False},
        "cuda_graph": {"enabled": False},
        "log_every": 1,
        "max_bad_steps": 1,
    },
    "default": {},
    "fast": {
        "precision": "bf16",
        "compile": {"enabled": True},
        "cuda_graph": {"enabled": True},
        "log_every": 100,
    },
}
"""`train.preset` name -> train-section values applied beneath the config's own (see `TrainConfig`)."""


@dataclass
class EvaluateConfig:
    """Autoregressive rollouts on the test split, scored in physical (denormalised) units."""

    rollout_frames: int = 20
    """Frames predicted autoregressively from the true initial `history` frames of each test trajectory."""
    start_frame: int = 0
    """Stored frame at which the rollout's input frames begin."""
    checkpoint: Literal["best", "last"] = "best"
    """Which checkpoint of the run to evaluate."""
    plot_samples: int = 3
    """Test trajectories drawn as truth / prediction / error space-time images."""
    device: str = "auto"
    """Where to evaluate: `cpu`, `cuda`, `cuda:1` or `auto`."""
    fourier_low: int = 4
    """PDEBench's `iLow`: wavenumber shells [0, fourier_low) make the low band of the Fourier-band RMSE."""
    fourier_high: int = 12
    """PDEBench's `iHigh`: shells [fourier_low, fourier_high) are the mid band, the rest the high band."""
    correlation_threshold: float = 0.95
    """The correlation time is the time until the correlation with the truth drops below this."""
    gmean_horizon: int | None = None
    """Predicted frames the geometric mean of the rollout nRMSE covers (APEBench uses 100); null: all."""
    worst_samples: int = 3
    """Test trajectories with the largest rollout nRMSE listed (and drawn) in the report."""

    def __post_init__(self) -> None:
        if self.rollout_frames < 1:
            raise ConfigError(f"rollout_frames must be >= 1, got {self.rollout_frames}")
        if self.start_frame < 0 or self.plot_samples < 0 or self.worst_samples < 0:
            raise ConfigError("start_frame, plot_samples and worst_samples must be >= 0")
        if not 0 < self.fourier_low < self.fourier_high:
            raise ConfigError(
                f"fourier_low and fourier_high must satisfy 0 < low < high, got {self.fourier_low} and "
                f"{self.fourier_high}"
            )
        if not 0 < self.correlation_threshold <= 1:
            raise ConfigError(f"correlation_threshold must be in (0, 1], got {self.correlation_threshold}")
        if self.gmean_horizon is not None and self.gmean_horizon < 1:
            raise ConfigError(f"gmean_horizon must be >= 1 or null, got {self.gmean_horizon}")


# --------------------------------------------------------------------------------------------------
# The learned N-body step controller


@dataclass
class ControllerNetConfig:
    """The controller network (`dynaforge.models.step_controller`): features in, log step out."""

    hidden: int = 64
    """Width of the hidden layers."""
    layers: int = 2
    """Hidden layers of the MLP (beside its linear skip path)."""
    history: int = 0
    """Also read the features of the last K states (zero-padded at the start); 0 = none. History makes the
    step depend on the past, which breaks the time symmetry of the reversible step recursion."""
    correction: float = 2.0
    """Bound c of the learned log-multiplier on the classical step: h stays within exp(+-c) of eta0 tau."""
    inputs: list[str] | None = None
    """Names of the features the network reads (`dynaforge.systems.nbody.control.FEATURE_NAMES`); null: all.
    The classical time scale is added to the output whatever the network reads."""

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.layers < 0 or self.history < 0 or self.correction <= 0:
            raise ConfigError("hidden must be >= 1, layers and history >= 0, correction > 0")
        if self.inputs is not None and (not self.inputs or len(set(self.inputs)) < len(self.inputs)):
            raise ConfigError(f"inputs must be a non-empty list of distinct feature names, got {self.inputs}")


@dataclass
class ControllerSystemsConfig:
    """The systems a controller trains on; episodes start from states along their orbits.

    Kepler orbits start at eccentric anomalies drawn uniformly; clusters are integrated for
    `reference_time` with the classical criterion (eta = `reference_eta`) and states are drawn from that run.
    """

    kepler: int = 48
    """Two-body Kepler systems (a = 1, total mass 1)."""
    eccentricity: Range = field(default_factory=lambda: Range(0.0, 0.8))
    """Eccentricities of the Kepler systems."""
    eccentricity_draw: Literal["uniform", "log_pericentre"] = "uniform"
    """How e is drawn in `eccentricity`: uniformly, or with log(1 - e) (the log of the pericentre distance
    a (1 - e)) uniform, which gives each decade of pericentre distance the same weight (more orbits near
    e = 1, where step control matters most)."""
    mass_ratio: Range = field(default_factory=lambda: Range(0.2, 1.0))
    """m2 / m1 of the Kepler systems."""
    clusters: int = 8
    """Clusters (`cluster` family, N-body units) per entry of `cluster_bodies`."""
    cluster_bodies: list[int] = field(default_factory=lambda: [4, 8])
    """Body counts of the clusters (one group of episodes per count)."""
    softening: Range = field(default_factory=lambda: Range(0.01, 0.05))
    """Softening of the clusters (the Kepler systems have none)."""
    snapshots: int = 16
    """Episode start states per system."""
    reference_time: float = 6.0
    """Length of the clusters' reference runs (N-body time units; a crossing time is 2.83)."""
    reference_eta: float = 0.005
    """Classical-criterion accuracy of the reference runs."""

    def __post_init__(self) -> None:
        if self.kepler < 0 or self.clusters < 0 or self.snapshots < 1:
            raise ConfigError("kepler and clusters must be >= 0 and snapshots >= 1")
        if self.kepler == 0 and (self.clusters == 0 or not self.cluster_bodies):
            raise ConfigError("no training systems: set kepler > 0 or clusters > 0 with cluster_bodies")
        if any(n < 2 for n in self.cluster_bodies):
            raise ConfigError(f"cluster_bodies must all be >= 2, got {self.cluster_bodies}")
        if self.eccentricity.low < 0 or self.eccentricity.high >= 1 or self.mass_ratio.low <= 0:
            raise ConfigError("eccentricity must lie in [0, 1) and mass_ratio be > 0")


@dataclass
class TimestepperConfig:
    """Training of the learned step controller (`dynaforge nbody train`).

    Training runs `batch` systems of one group (Kepler, or clusters of one size) continuously, with the
    controller choosing the steps (reversible recursion, `system.integrator`). Each optimiser step
    integrates one window of `window` steps and back-propagates through it (truncated back-propagation
    through time: the state entering a window is detached). After `episode` windows the systems restart
    from fresh start states. At every step n the relative energy error e_n = |E_n - E_0| / |E_0| is
    measured from the episode's start, as the benchmark measures it, and the loss of a window is
        penalty * mean_n relu(log(e_n / band_high))^2            (upper edge: too inaccurate at a step)
      + penalty * relu(log(band_low / max_n e_n))^2              (lower edge: too accurate in the window)
      + shape * (log(max_n e_n) / 2 - log(mean_n h_n / T0))      (scale-free cost of the step shape)
      - reward * mean_n log(h_n / T0)                            (extra push to larger steps)
    The lower edge acts on a window's largest error because e_n is near zero at an episode's start,
    whatever the step. The shape cost rewards larger steps at a given error: leapfrog's error scales as
    h^2, so reaching a target error would take steps scaled by sqrt(target / max error), and covering a
    fixed time takes a number of steps proportional to 1 / mean(h) (hence log of the mean); the cost does
    not change when every step is scaled by the same factor, so it judges how h(y) varies between
    states (where to spend steps), while the band edges set its overall level. (max_n is a soft maximum,
    logsumexp with sharpness 8, so the cost stays smooth.)
    """

    model: ControllerNetConfig = field(default_factory=ControllerNetConfig)
    """The network."""
    systems: ControllerSystemsConfig = field(default_factory=ControllerSystemsConfig)
    """The training systems."""
    steps: int = 300
    """Steps of the first-order optimiser (`optimizer`)."""
    lr: float = 3e-3
    """Peak learning rate of `optimizer` (shaped by `schedule`)."""
    optimizer: OptimizerConfig = field(default_factory=lambda: OptimizerConfig(name="adam", fused=False))
    """The first-order optimiser, built by the trainer engine (`dynaforge.train.optim`)."""
    schedule: ScheduleConfig = field(
        default_factory=lambda: ScheduleConfig(name="constant", warmup_fraction=0.0)
    )
    """The learning-rate schedule over the `steps` optimiser steps (`dynaforge.train.schedule`)."""
    weight_decay: float = 0.0
    """Decoupled weight decay of matrices (AdamW, Muon) or L2 penalty (SGD); 0 = none."""
    wandb: WandbConfig = field(default_factory=WandbConfig)
    """Optional Weights & Biases logging beside metrics.jsonl."""
    batch: int = 32
    """Windows per optimiser step."""
    window: int = 32
    """Integrator steps per optimiser step (differentiated through)."""
    episode: int = 16
    """Windows before the systems restart from fresh start states."""
    band_low: float = 1e-6
    """Lower edge of the target band of per-step relative energy error."""
    band_high: float = 1e-5
    """Upper edge of the target band."""
    reward: float = 0.0
    """Weight of the extra larger-step reward."""
    shape: float = 1.0
    """Weight of the scale-free shape cost (which holds the main larger-step reward)."""
    penalty: float = 1.0
    """Weight of the band penalties."""
    grad_clip: float = 1.0
    """Clip the gradient norm (the norm is logged anyway)."""
    lbfgs_steps: int = 0
    """L-BFGS iterations after Adam, on the fixed validation episodes (0 = none)."""
    loss: Literal["window", "run"] = "window"
    """`window`: the per-window loss above (streams of windows). `run`: a whole-run, scale-free loss:
    each optimiser step integrates `batch` systems of one group from fresh start states for `horizon`
    time units (at most `run_steps` steps; back-propagation truncated every `window` steps) and
    minimises log(N / T) + log(M) / 2, N the steps taken over the time T covered and M the run's soft
    maximum error (the power mean (mean_n e_n^8)^(1/8) over its steps, each weighted by sg(h_n)/h_n so
    that sums over steps are integrals dt / h at fixed time), i.e. log(N * sqrt(M)): for
    leapfrog (error ~ h^2) the evaluations needed at a fixed error, the benchmark's figure of merit,
    unchanged when every step is scaled by one factor. The band penalties (on M, weight `penalty`) only
    pin the overall step scale; `shape` and `reward` are unused. Systems stopped by `run_steps` before
    the horizon count a fixed number of steps and the covered time T carries the gradient. Systems that
    reach the horizon (fixed-time runs, e.g. one Kepler period) take N's gradient at fixed states (the
    network's proposals with detached features); with `window` at least the run's length (no truncation)
    that gradient agrees with finite differences along the step scale, and truncated back-propagation
    biases it (docs/nbody.md)."""
    horizon: float = 6.283185307179586
    """`loss: run`: simulated time of a run (N-body units; a training Kepler orbit, a = 1 and M = 1,
    takes 2 pi)."""
    cluster_horizon: float | None = None
    """`loss: run`: simulated time of a cluster run (null: `horizon`); clusters take many more steps per
    time unit than the training Kepler orbits."""
    run_steps: int = 3000
    """`loss: run`: cap on the steps of a run (systems stop early when they reach it)."""
    run_scale: float = 1.0
    """`loss: run`: output scale of the controller during training and validation runs (the benchmark's
    `scale` knob: h = run_scale * eta0 * tau * exp(correction)). The loss is scale-free only where
    leapfrog's error grows as h^2, so runs should use steps near those of the target error (e.g. 0.25,
    eta ~ 0.005, for max |dE/E| ~ 1e-4 on Kepler orbits with e ~ 0.9), not eta0's coarser ones."""
    train_bias: bool = False
    """`loss: run`: also train the two output biases, which set a global step scale the cost does not see
    (its gradient along that direction is ~0 for untruncated fixed-time runs, up to noise, so Adam lets the
    scale wander: measured on whole Kepler orbits, steps per time 78 -> 392 in 100 steps with a wide band).
    Pin it with `centre` > 0: then the biases hold the mean correction at zero while the weights shape it."""
    sharpness: float = 8.0
    """`loss: run`: exponent s of the power mean (mean_n e_n^s)^(1/s) that stands for the run's largest
    error (larger: closer to the maximum, which the benchmark measures, and a less smooth loss)."""
    centre: float = 0.0
    """`loss: run`: weight of centre * (mean learned log-correction over a batch's steps)^2. Even with the
    output biases frozen (`train_bias: false`) the linear path's weights on features with non-zero means can still shift every step
    alike; outside leapfrog's h^2 regime the loss pushes that shift until the bounded correction saturates
    (docs/nbody.md). The pin keeps the mean correction near zero so only the step shape is trained."""
    seed: int = 0
    """Seeds the training systems, episode draws and the network's initial weights."""
    log_every: int = 10
    """Append a line to metrics.jsonl every this many steps."""
    eval_every: int = 50
    """Evaluate on fixed validation episodes (and update best.pt) every this many steps."""
    checkpoint_every: int = 50
    """Write checkpoints/last.pt every this many steps."""
    device: str = "cpu"
    """Where training runs."""

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "window", "episode", "log_every", "eval_every", "checkpoint_every"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.band_low < self.band_high:
            raise ConfigError(f"need 0 < band_low < band_high, got {self.band_low} and {self.band_high}")
        if self.lr <= 0 or min(self.reward, self.penalty, self.shape, self.lbfgs_steps) < 0:
            raise ConfigError("lr must be > 0; reward, penalty, shape and lbfgs_steps >= 0")
        if self.loss == "run" and (
            self.lbfgs_steps or self.horizon <= 0 or self.run_steps < 1 or (self.cluster_horizon or 1.0) <= 0
        ):
            raise ConfigError(
                "loss: run needs horizon and cluster_horizon > 0 and run_steps >= 1 and has no L-BFGS phase "
                "(set lbfgs_steps: 0; on whole Kepler orbits its line search diverged: the step count is an integer)"
            )
        if self.weight_decay < 0:
            raise ConfigError(f"weight_decay must be >= 0, got {self.weight_decay}")
        if self.centre < 0:
            raise ConfigError(f"centre must be >= 0, got {self.centre}")
        if self.sharpness < 1:
            raise ConfigError(f"sharpness must be >= 1, got {self.sharpness}")
        if self.run_scale <= 0:
            raise ConfigError(f"run_scale must be > 0, got {self.run_scale}")
        if self.schedule.interval != "step" or self.schedule.name == "plateau":
            raise ConfigError(
                "timestepper.schedule: controller training has no epochs; use interval=step and a "
                "constant, step or cosine schedule"
            )


# --------------------------------------------------------------------------------------------------
# Staged latent stack: operator, residual corrector, distilled corrector, steady prior


@dataclass
class OperatorStageConfig:
    """Stage `operator`: the model of the `model` section, trained on one-step + unrolled + spectral losses."""

    epochs: int = 10
    """Passes over the training windows."""
    lr: float = 1e-3
    """Peak learning rate."""
    rollout_steps: int = 3
    """Model calls unrolled per window (the first is the one-step loss, the rest the rollout loss)."""
    rollout_weight: float = 0.5
    """Weight of the unrolled frames' loss (after the first call)."""
    spectral_weight: float = 0.1
    """Weight of the log energy-spectrum loss (computed in fp32, autocast off)."""
    val_rollout: int = 10
    """Model calls of the validation rollout whose nRMSE chooses the best checkpoint."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.rollout_steps < 1 or self.val_rollout < 1 or self.lr <= 0:
            raise ConfigError("epochs, rollout_steps and val_rollout must be >= 1 and lr > 0")
        if self.rollout_weight < 0 or self.spectral_weight < 0:
            raise ConfigError("rollout_weight and spectral_weight must be >= 0")


@dataclass
class CorrectorStageConfig:
    """Stage `diffusion_residual`: conditional flow matching of truth - operator prediction."""

    epochs: int = 10
    """Passes over the training windows."""
    lr: float = 1e-3
    """Peak learning rate."""
    model: FlowNetConfig = field(default_factory=FlowNetConfig)
    """The velocity network (condition_frames is set to 2: the prediction and the last input frame)."""
    sampler_steps: int = 8
    """S: integration steps of the sampler from noise (t = 0) to a residual (t = 1)."""
    sampler: Literal["euler", "heun"] = "euler"
    """Integrator of the sampler (first or second order)."""
    val_samples: int = 2
    """Samples per validation window for the energy score that chooses the best checkpoint (>= 2)."""
    interval: int = 1
    """k: the corrector learns truth(t + k) - the operator's k-step rollout from the true frames at t,
    conditioned on that k-step prediction and the frame before it, and predictor-corrector rollouts apply
    it every k steps (the checkpoint records k). 1: the one-step residual."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.sampler_steps < 1 or self.lr <= 0:
            raise ConfigError("epochs and sampler_steps must be >= 1 and lr > 0")
        if self.interval < 1:
            raise ConfigError(
                f"interval must be >= 1 (operator steps between corrections), got {self.interval}"
            )
        if self.val_samples < 2:
            raise ConfigError(
                f"val_samples must be >= 2 (the energy score needs pairs), got {self.val_samples}"
            )


@dataclass
class DistillStageConfig:
    """Stage `consistency_distill`: a student that reproduces the S-step sampler in 1 or 2 steps."""

    epochs: int = 10
    """Passes over the training windows."""
    lr: float = 5e-4
    """Peak learning rate."""
    student_steps: int = 1
    """Sampler steps of the student (1 or 2)."""
    temperature: float = 1.0
    """Scale of the noise draws the student learns on (student and teacher map the same scaled draw); set
    it to the sampling temperature used at inference (`Corrector.temperature`). > 0."""
    spectral_weight: float = 0.0
    """Weight of a log energy-spectrum loss between the student's and the teacher's residuals, beside the
    MSE (0: MSE alone). The MSE alone lets a student smooth away the small scales it cannot match."""

    def __post_init__(self) -> None:
        if self.spectral_weight < 0:
            raise ConfigError(f"spectral_weight must be >= 0, got {self.spectral_weight}")
        if self.student_steps not in (1, 2):
            raise ConfigError(f"student_steps must be 1 or 2, got {self.student_steps}")
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (noise in, a sample out), got {self.temperature}")
        if self.epochs < 1 or self.lr <= 0:
            raise ConfigError("epochs must be >= 1 and lr > 0")


@dataclass
class SteadyStageConfig:
    """Stage `steady_prior`: a conditional flow-matching model of long-time states given the parameters."""

    epochs: int = 10
    """Passes over the long-time states."""
    lr: float = 1e-3
    """Peak learning rate."""
    model: FlowNetConfig = field(default_factory=lambda: FlowNetConfig(condition_frames=0))
    """The velocity network (condition_frames is set to 0)."""
    last_frames: int = 10
    """Frames at the end of each trajectory taken as long-time states."""
    sampler_steps: int = 16
    """Integration steps of the sampler."""

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.last_frames < 1 or self.sampler_steps < 1 or self.lr <= 0:
            raise ConfigError("epochs, last_frames and sampler_steps must be >= 1 and lr > 0")


@dataclass
class StagesConfig:
    """`dynaforge train CONFIG --data DIR --out RUN stage=all`: the stages in order, each reading the
    checkpoint the one before wrote (RUN/<stage>/checkpoints/best.pt); RUN/stages.json records progress."""

    operator: OperatorStageConfig = field(default_factory=OperatorStageConfig)
    """The latent operator."""
    diffusion_residual: CorrectorStageConfig = field(default_factory=CorrectorStageConfig)
    """The generative residual corrector."""
    consistency_distill: DistillStageConfig = field(default_factory=DistillStageConfig)
    """The few-step student of the corrector."""
    steady_prior: SteadyStageConfig = field(default_factory=SteadyStageConfig)
    """The prior of long-time states."""
    val_windows: int = 256
    """At most this many validation windows are scored per epoch (evenly spaced)."""
    seed: int = 0
    """Seed of the noise of validation samples (the same noise every epoch)."""

    def __post_init__(self) -> None:
        if self.val_windows < 1:
            raise ConfigError(f"val_windows must be >= 1, got {self.val_windows}")


# --------------------------------------------------------------------------------------------------
# Hyper-parameter tuning (dynaforge tune)


@dataclass
class SearchDimension:
    """How Optuna draws one config value of a trial (a `tune.space` entry, keyed by the dotted config key).

    `log_uniform`: a float between low and high, uniform in log space. `uniform`: a float between low and
    high (on a grid of `step` when set). `int`: an integer between low and high inclusive (every `step`;
    in log space with `log`). `categorical`: one of `choices`.
    """

    kind: Literal["log_uniform", "uniform", "int", "categorical"] = "uniform"
    """The distribution: log_uniform, uniform, int or categorical."""
    low: float | None = None
    """Smallest value (log_uniform, uniform, int)."""
    high: float | None = None
    """Largest value, included (log_uniform, uniform, int)."""
    step: float | None = None
    """Grid spacing (uniform, int; int defaults to 1); null draws continuously."""
    log: bool = False
    """Draw an int in log space (int only; log_uniform is the float kind)."""
    choices: list[Any] = field(default_factory=list)
    """The values of a categorical dimension: numbers, strings, booleans or null."""

    def __post_init__(self) -> None:
        if self.kind == "categorical":
            if not self.choices:
                raise ConfigError("a categorical dimension needs a non-empty `choices` list")
            bad = [c for c in self.choices if not (c is None or isinstance(c, bool | int | float | str))]
            if bad:
                raise ConfigError(f"choices must be numbers, strings, booleans or null, got {bad!r}")
            return
        if self.choices:
            raise ConfigError(f"`choices` belongs to kind categorical, not {self.kind}")
        if self.low is None or self.high is None:
            raise ConfigError(f"a {self.kind} dimension needs `low` and `high`")
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if (self.kind == "log_uniform" or self.log) and self.low <= 0:
            raise ConfigError(f"a log-scale dimension needs low > 0, got low={self.low}")
        if self.log and self.kind != "int":
            raise ConfigError("`log` applies to kind int; use kind log_uniform for floats")
        if self.kind == "log_uniform" and self.step is not None:
            raise ConfigError("a log_uniform dimension takes no `step`")
        if self.kind == "int" and (self.low != int(self.low) or self.high != int(self.high)):
            raise ConfigError(f"an int dimension needs integer low and high, got {self.low} and {self.high}")
        if self.step is not None and self.step <= 0:
            raise ConfigError(f"step must be > 0 or null, got {self.step}")


@dataclass
class TuneObjective:
    """One value a study optimises: a named metric of the trial's validation and its direction.

    PDE surrogates: `best_val_loss` (the loss of the kept best.pt), `val_loss` and `train_loss` (last
    epoch), `parameters`, `seconds` (training time). The N-body controller: `best_val_loss`, `val_loss` and
    the `val_<group>_<quantity>` entries of its evaluation (e.g. `val_kepler_mean_log_step`),
    `parameters`, `seconds`.
    """

    metric: str = "best_val_loss"
    """Name of the metric (see the class docstring)."""
    direction: Literal["minimize", "maximize"] = "minimize"
    """Whether smaller or larger values are better."""


@dataclass
class TunePrunerConfig:
    """Stops trials whose intermediate values (one per epoch, or per controller evaluation) lag behind.

    Pruning needs a single objective; a multi-objective study runs every trial to the end.
    """

    name: Literal["median", "percentile", "successive_halving", "hyperband", "none"] = "median"
    """Optuna pruner: median, percentile, successive_halving, hyperband, or none."""
    startup_trials: int = 2
    """Trials that run to the end before median/percentile pruning starts."""
    warmup_epochs: int = 0
    """Intermediate values of a trial not judged by median/percentile pruning: its first epochs (the
    N-body controller: its first optimiser steps)."""
    percentile: float = 25.0
    """The percentile pruner keeps trials in the best `percentile` per cent."""

    def __post_init__(self) -> None:
        if self.startup_trials < 0 or self.warmup_epochs < 0:
            raise ConfigError("startup_trials and warmup_epochs must be >= 0")
        if not 0 < self.percentile < 100:
            raise ConfigError(f"percentile must be in (0, 100), got {self.percentile}")


@dataclass
class TuneConfig:
    """An Optuna study over this config (`dynaforge tune CONFIG --trials N`); see `dynaforge.tune`.

    Each trial trains this config with the `space` values drawn for it, in STUDY/trials/NNNN/.
    """

    space: dict[str, SearchDimension] = field(default_factory=dict)
    """Dotted config key (e.g. `train.lr`, `model.width`) -> how to draw its value."""
    objectives: list[TuneObjective] = field(default_factory=lambda: [TuneObjective()])
    """What the study optimises; more than one makes a multi-objective study (a Pareto front)."""
    pruner: TunePrunerConfig = field(default_factory=TunePrunerConfig)
    """Which trials are stopped early."""
    sampler: Literal["tpe", "random", "nsga2"] = "tpe"
    """Optuna sampler: tpe (default), random, or nsga2 (multi-objective)."""
    seed: int = 0
    """Sampler seed (the n-th process to join a study, counting from 0, adds 1000 n)."""
    study: str | None = None
    """Study name; null uses the config file's name. `--study` overrides it."""
    storage: str | None = None
    """Optuna storage URL; null is SQLite in the study folder (STUDY/study.db). `--storage` overrides it."""
    heartbeat: int = 10
    """Seconds between a running trial's heartbeats; a trial silent for twice as long (a killed
    process) is marked failed and retried by the next process that joins the study."""
    retries: int = 1
    """Times a failed trial is retried with the same values (resuming its run from its last checkpoint)."""
    plots: bool = True
    """Write optimisation history, parameter importances and parallel coordinates as PNG."""

    def __post_init__(self) -> None:
        if not self.objectives:
            raise ConfigError("objectives needs at least one {metric, direction} entry")
        if self.heartbeat <= 0:
            raise ConfigError(f"heartbeat must be > 0 seconds, got {self.heartbeat}")
        if self.retries < 0:
            raise ConfigError(f"retries must be >= 0, got {self.retries}")
        for key in self.space:
            if key.split(".")[0] == "tune":
                raise ConfigError(f"space key {key!r}: the tune section itself cannot be tuned")


# --------------------------------------------------------------------------------------------------
# Two-phase (equilibrium propagation) training of energy-based models


@dataclass
class EnergyModelConfig:
    """The energy-based model (`dynaforge.models.hopfield`): a continuous Hopfield network whose units s are
    `hidden` then `outputs` units, with the input x clamped:
        E(s) = 1/2 |s|^2 - 1/2 rho(s)^T W rho(s) - b^T rho(s) - rho(s)^T U x,   W symmetric, zero diagonal.
    """

    name: Literal["hopfield"] = "hopfield"
    """Which energy model (one of `dynaforge.models.hopfield.ENERGY_MODELS`)."""
    inputs: int = 4
    """Clamped input units."""
    hidden: int = 32
    """Hidden units."""
    outputs: int = 2
    """Output units (the prediction is their state)."""
    activation: Literal["tanh", "sigmoid"] = "tanh"
    """rho, the units' activation."""
    init_scale: float = 0.5
    """Initial weights are drawn N(0, init_scale^2 / fan_in): small enough for a unique, quickly reached fixed point."""

    def __post_init__(self) -> None:
        if min(self.inputs, self.hidden, self.outputs) < 1:
            raise ConfigError("inputs, hidden and outputs must all be >= 1")
        if self.init_scale <= 0:
            raise ConfigError(f"init_scale must be > 0, got {self.init_scale}")


@dataclass
class TeacherTaskConfig:
    """The task: fit the fixed points of a teacher network (an `EnergyModelConfig` network with its own
    seed and weight scale), inputs x ~ N(0, 1), targets the teacher's output units at its relaxed state."""

    train_samples: int = 256
    """Training inputs (fixed, drawn once from the seed)."""
    val_samples: int = 128
    """Validation inputs."""
    teacher_scale: float = 1.0
    """The teacher's init_scale (larger: a harder, more nonlinear map)."""
    seed: int = 1234
    """Seeds the teacher's weights and the inputs."""

    def __post_init__(self) -> None:
        if self.train_samples < 1 or self.val_samples < 1 or self.teacher_scale <= 0:
            raise ConfigError("train_samples and val_samples must be >= 1, teacher_scale > 0")


@dataclass
class TwoPhaseConfig:
    """Two-phase (equilibrium propagation) training (`dynaforge twophase train`, `dynaforge.train.two_phase`).

    One window (one optimiser step) on a batch: relax the free energy E for `free_steps` steps from s = 0
    (the free phase), snapshot the state, relax E + beta C for `nudged_steps` steps from the free state
    (the nudged phase; C = 1/2 |outputs - target|^2), and for `symmetric` nudging restore the snapshot and
    relax E - beta C too. The gradient estimate of the loss C(free state) is
        one-sided:  (dE/dtheta(s_beta) - dE/dtheta(s_0)) / beta
        symmetric:  (dE/dtheta(s_beta) - dE/dtheta(s_-beta)) / (2 beta)
    and the optimiser steps against it (it descends the loss). Relaxation is gradient descent on the state,
    s <- s + v, v <- momentum v - step_size dF/ds. The optimiser, schedule, clipping, logging,
    checkpoints, seed, device, `compile` and `cuda_graph` come from the `train` section; `train.epochs`
    counts passes over the task's training inputs in batches of `batch`.
    """

    model: EnergyModelConfig = field(default_factory=EnergyModelConfig)
    """The energy-based model."""
    task: TeacherTaskConfig = field(default_factory=TeacherTaskConfig)
    """The task it learns."""
    beta: float = 0.1
    """Nudging strength (> 0)."""
    nudging: Literal["symmetric", "one_sided"] = "symmetric"
    """`symmetric` (+beta and -beta phases; bias O(beta^2)) or `one_sided` (+beta only; bias O(beta))."""
    free_steps: int = 40
    """Relaxation steps of the free phase."""
    nudged_steps: int = 20
    """Relaxation steps of each nudged phase (from the free state)."""
    step_size: float = 0.5
    """Relaxation step size on the state."""
    momentum: float = 0.0
    """Heavy-ball momentum of the relaxation (the state's velocity is part of the snapshot)."""
    batch: int = 32
    """Inputs per window."""
    dtype: Literal["float32", "float64"] = "float32"
    """Precision of the weights and the state."""

    def __post_init__(self) -> None:
        if self.beta <= 0:
            raise ConfigError(
                f"beta must be > 0 (the sign of the nudge is fixed by `nudging`), got {self.beta}"
            )
        if self.free_steps < 1 or self.nudged_steps < 1 or self.batch < 1:
            raise ConfigError("free_steps, nudged_steps and batch must be >= 1")
        if self.step_size <= 0 or not 0 <= self.momentum < 1:
            raise ConfigError("step_size must be > 0 and momentum in [0, 1)")


# --------------------------------------------------------------------------------------------------
# The whole configuration


@dataclass
class Config:
    """Everything one run needs; each section belongs to one stage of the pipeline."""

    system: SystemConfig | NBodyConfig = field(default_factory=BurgersConfig)
    """The ground-truth simulator and its parameter ranges."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Sizes, sharding and seeds of the generated dataset."""
    data: DataConfig = field(default_factory=DataConfig)
    """Training windows, normalisation and batching."""
    model: ModelConfig = field(default_factory=FNOConfig)
    """The neural surrogate (chosen by `model.name`)."""
    train: TrainConfig = field(default_factory=TrainConfig)
    """The training loop."""
    evaluate: EvaluateConfig = field(default_factory=EvaluateConfig)
    """Rollouts, metrics and the report on the test split."""
    timestepper: TimestepperConfig = field(default_factory=TimestepperConfig)
    """The learned N-body step controller and its training."""
    stages: StagesConfig = field(default_factory=StagesConfig)
    """The staged latent stack (`dynaforge train ... stage=all`)."""
    tune: TuneConfig = field(default_factory=TuneConfig)
    """The hyper-parameter search of `dynaforge tune` (ignored by the other verbs)."""
    twophase: TwoPhaseConfig = field(default_factory=TwoPhaseConfig)
    """Two-phase (equilibrium propagation) training of an energy-based model."""


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
    return _build(Config, apply_train_preset(data), "")


def apply_train_preset(data: Mapping[str, Any]) -> dict[str, Any]:
    """`data` with its `train.preset` values filled in beneath the train section's own values."""
    train = data.get("train", {})
    if not isinstance(train, Mapping):
        return dict(data)  # _build reports the bad section
    name = train.get("preset", "default")
    if name not in TRAIN_PRESETS:
        raise ConfigError(f"train.preset={name!r} is not valid; choose one of: {', '.join(TRAIN_PRESETS)}")
    return {**data, "train": _merge_beneath(TRAIN_PRESETS[name], train)}


def _merge_beneath(base: Mapping[str, Any], top: Mapping[str, Any]) -> dict[str, Any]:
    """`top` with `base`'s keys added where `top` lacks them (nested mappings merged the same way)."""
    merged = dict(base)
    for key, value in top.items():
        below = merged.get(key)
        if isinstance(below, Mapping) and isinstance(value, Mapping):
            merged[key] = _merge_beneath(below, value)
        else:
            merged[key] = value
    return merged


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
    elif cls is ModelConfig or (isinstance(cls, type) and issubclass(cls, ModelConfig) and "name" in data):
        cls = _model_class(data, path)
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
        if SystemConfig in typing.get_args(hint):  # `system` (SystemConfig | NBodyConfig): chosen by name
            hint = SystemConfig
        if hint is Range and isinstance(value, int | float) and not isinstance(value, bool):
            result[key] = {"low": float(value), "high": float(value)}
        elif dataclasses.is_dataclass(hint):
            result[key] = _expand_range_shorthand(hint, value)
    return result


def _system_class(data: Mapping[str, Any], path: str) -> type[SystemConfig] | type[NBodyConfig]:
    name = data.get("name", "burgers")
    if name not in SYSTEM_CONFIGS:
        valid = ", ".join(sorted(SYSTEM_CONFIGS))
        raise ConfigError(f"unknown system {_join(path, 'name')}={name!r}; valid systems: {valid}")
    return SYSTEM_CONFIGS[name]


def _model_class(data: Mapping[str, Any], path: str) -> type[ModelConfig]:
    name = data.get("name", "fno")
    if name not in MODEL_CONFIGS:
        valid = ", ".join(sorted(MODEL_CONFIGS))
        raise ConfigError(f"unknown model {_join(path, 'name')}={name!r}; valid models: {valid}")
    return MODEL_CONFIGS[name]


def _convert(hint: Any, value: Any, path: str, default: Any = None) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if SystemConfig in options:  # the system section picks its dataclass by `name` (see _build)
            return _build(SystemConfig, value, path, default if dataclasses.is_dataclass(default) else None)
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
