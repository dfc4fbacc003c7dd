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

    Families (1D and up):
    - `fourier`: sum over wavenumbers m = 1..max_wavenumber of a_m sin(2 pi m x / L + phi_m) per axis,
      a_m ~ U(-1, 1), phi_m ~ U(0, 2 pi).
    - `grf`: a Gaussian random field with squared-exponential covariance exp(-r^2 / (2 l^2)),
      l = length_scale * L, synthesised in Fourier space with random complex Gaussian coefficients.

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


# --------------------------------------------------------------------------------------------------
# Systems


@dataclass
class SystemConfig:
    """A periodic PDE on [0, L)^d solved pseudo-spectrally (see `dynaforge.systems.spectral`)."""

    name: str = "burgers"
    """Which system: one of `dynaforge.systems.SYSTEMS`."""
    resolution: int = 256
    """Grid points per axis."""
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


# --------------------------------------------------------------------------------------------------
# Gravitational N-body (its own system config: bodies instead of a grid)


@dataclass
class NBodyInitialConfig:
    """Initial conditions of an N-body system, one family per config (`dynaforge.systems.nbody_initial`).

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
    """How each system's step size is chosen (`dynaforge.systems.nbody_control`).

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
# The learned N-body step controller


@dataclass
class ControllerNetConfig:
    """The controller network (`dynaforge.models.dt_predictor`): features in, log step out."""

    hidden: int = 64
    """Width of the hidden layers."""
    layers: int = 2
    """Hidden layers of the MLP (beside its linear skip path)."""
    history: int = 0
    """Also read the features of the last K states (zero-padded at the start); 0 = none. History makes the
    step depend on the past, which breaks the time symmetry of the reversible step recursion."""

    def __post_init__(self) -> None:
        if self.hidden < 1 or self.layers < 0 or self.history < 0:
            raise ConfigError("hidden must be >= 1, layers and history >= 0")


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
      + shape * (log(max_n e_n) / 2 - mean_n log(h_n / T0))      (scale-free cost of the step shape)
      - reward * mean_n log(h_n / T0)                            (extra push to larger steps)
    The lower edge acts on a window's largest error because e_n is near zero at an episode's start,
    whatever the step. The shape cost rewards larger steps at a given error: leapfrog's error scales as
    h^2, so reaching a target error would take steps scaled by sqrt(target / max error); the cost does
    not change when every step is scaled by the same factor, so it judges how h(y) varies between
    states (where to spend steps), while the band edges set its overall level. (max_n is a soft maximum,
    logsumexp with sharpness 8, so the cost stays smooth.)
    """

    model: ControllerNetConfig = field(default_factory=ControllerNetConfig)
    """The network."""
    systems: ControllerSystemsConfig = field(default_factory=ControllerSystemsConfig)
    """The training systems."""
    steps: int = 300
    """Adam steps."""
    lr: float = 3e-3
    """Adam learning rate (constant)."""
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


# --------------------------------------------------------------------------------------------------
# The whole configuration


@dataclass
class Config:
    """Everything one run needs; each section belongs to one stage of the pipeline."""

    system: SystemConfig | NBodyConfig = field(default_factory=BurgersConfig)
    """The ground-truth simulator and its parameter ranges."""
    dataset: DatasetConfig = field(default_factory=DatasetConfig)
    """Sizes, sharding and seeds of the generated dataset."""
    timestepper: TimestepperConfig = field(default_factory=TimestepperConfig)
    """The learned N-body step controller and its training."""


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


def _build(cls: type, data: Any, path: str) -> Any:
    if cls is Range and isinstance(data, int | float) and not isinstance(data, bool):
        return Range(float(data), float(data))
    if not isinstance(data, Mapping):
        raise ConfigError(f"{_where(path)} must be a mapping of keys to values, got {data!r}")
    if cls is SystemConfig or (isinstance(cls, type) and issubclass(cls, SystemConfig) and "name" in data):
        cls = _system_class(data, path)
    hints = typing.get_type_hints(cls)
    names = [f.name for f in dataclasses.fields(cls) if f.init]
    kwargs = {}
    for key, value in data.items():
        if key not in names:
            raise ConfigError(_unknown_key_message(str(key), names, path))
        kwargs[key] = _convert(hints[key], value, _join(path, key))
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


def _system_class(data: Mapping[str, Any], path: str) -> type[SystemConfig] | type[NBodyConfig]:
    name = data.get("name", "burgers")
    if name not in SYSTEM_CONFIGS:
        valid = ", ".join(sorted(SYSTEM_CONFIGS))
        raise ConfigError(f"unknown system {_join(path, 'name')}={name!r}; valid systems: {valid}")
    return SYSTEM_CONFIGS[name]


def _convert(hint: Any, value: Any, path: str) -> Any:
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if origin is typing.Union or origin is types.UnionType:
        if value is None and type(None) in args:
            return None
        options = [a for a in args if a is not type(None)]
        if SystemConfig in options:  # the system section picks its dataclass by `name` (see _build)
            return _build(SystemConfig, value, path)
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
        return _build(hint, value, path)
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
