"""The `system` section of N-body systems and the `timestepper` section (the learned step controller's training)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynaforge.config.base import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    Range,
    at_least,
    check_values,
    checked,
    ranged,
)
from dynaforge.config.train import OptimizerConfig, ScheduleConfig, TrainConfig


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
    semi_major_axis: Range = ranged(1.0, check=POSITIVE.because("orbit size"))
    """`kepler`: semi-major axis a of the relative orbit."""
    eccentricity: Range = ranged(0.5)
    """`kepler`: eccentricity e, in [0, 1)."""
    mean_anomaly: Range = ranged(0.0)
    """`kepler`: orbital phase at t = 0 in radians (0 = pericentre)."""
    mass: Range = ranged(0.5, check=POSITIVE.because("a body's mass"))
    """`kepler` and `cluster`: mass of each body (`cluster` then rescales the total to 1)."""
    virial_ratio: float = checked(0.5, check=NON_NEGATIVE)
    """`plummer` and `cluster`: K / |virial| after scaling (0.5 = equilibrium, < 0.5 collapses)."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.eccentricity.low < 0 or self.eccentricity.high >= 1:
            raise ConfigError(
                f"eccentricity must lie in [0, 1) (bound orbits), got [{self.eccentricity.low}, {self.eccentricity.high}]"
            )


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
    eta: float = checked(0.02, check=POSITIVE.because("accuracy factor"))
    """`adaptive`: accuracy factor of the classical criterion."""
    model: str | None = None
    """`learned`: run folder (or checkpoint file) of a trained controller."""
    scale: float = checked(1.0, check=POSITIVE)
    """`learned`: multiplies the predicted step (the accuracy knob of a trained controller)."""
    reversible: bool = True
    """Choose steps with the time-symmetric recursion (adaptive and learned)."""
    dt_max: float | None = checked(None, check=POSITIVE.because("largest step; null: no cap"))
    """Largest step allowed (null: no cap)."""
    max_steps: int = checked(10_000_000, check=AT_LEAST_ONE)
    """Stop a run after this many steps per system (a guard against a collapsing step)."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class NBodyConfig:
    """Gravitational N-body systems (`dynaforge.systems.nbody`: G = 1, Plummer softening, float64).

    Trajectories last `steps * dt` time units and keep a frame every `save_every * dt`; with `fixed`
    control dt is the step, otherwise only the frame spacing (the controller picks the steps).
    """

    name: str = "nbody"
    """The system name (`nbody`)."""
    bodies: int = checked(2, check=at_least(2.0))
    """Bodies per system (`kepler` needs 2, `figure_eight` 3)."""
    integrator: Literal[
        "leapfrog", "leapfrog_dkd", "yoshida4", "yoshida4_dkd", "yoshida6", "yoshida6_dkd"
    ] = "leapfrog"
    """Leapfrog (2nd order, 1 force evaluation per step), Yoshida's 4th-order (3) or 6th-order (7)
    composition of it; kick-drift-kick, or drift-kick-drift with the `_dkd` suffix (docs/nbody.md)."""
    dt: float = checked(0.01, check=POSITIVE.because("time step"))
    """Fixed step, and the unit of the frame spacing and trajectory length."""
    steps: int = checked(1000, check=AT_LEAST_ONE)
    """Trajectory length in units of dt."""
    save_every: int = checked(10, check=AT_LEAST_ONE)
    """Keep a frame every `save_every * dt` time units (the initial frame is always kept)."""
    dtype: Literal["float32", "float64"] = "float64"
    """Precision of the state (the store always holds float32)."""
    forces: Literal["eager", "compiled"] = "eager"
    """How forces are evaluated: `eager` PyTorch, or one torch.compile'd kernel with the systems as vector
    lanes (about 2x faster for large batches on a CPU; needs a C++ compiler, compiles for a few seconds per
    body count, falls back to eager with a logged warning; its numbers differ from eager's within ~1e-15
    relative, and like eager's do not depend on the batch: docs/nbody.md, "Batched throughput")."""
    softening: Range = ranged(0.0, check=NON_NEGATIVE.because("softening length"))
    """Plummer softening length eps (per system)."""
    external_mass: Range = ranged(0.0, check=NON_NEGATIVE.because("a mass"))
    """Mass of the external point perturber (0 = none)."""
    external_position: list[float] = field(default_factory=lambda: [20.0, 0.0, 0.0])
    """Fixed position of the external perturber."""
    initial: NBodyInitialConfig = field(default_factory=NBodyInitialConfig)
    """Initial-condition family."""
    control: StepControlConfig = field(default_factory=StepControlConfig)
    """Step-size control."""

    def __post_init__(self) -> None:
        check_values(self)
        needed = {"kepler": 2, "figure_eight": 3}.get(self.initial.family)
        if needed is not None and self.bodies != needed:
            raise ConfigError(
                f"initial.family={self.initial.family} has {needed} bodies; set bodies={needed}"
            )
        if self.steps % self.save_every:
            raise ConfigError(f"steps ({self.steps}) must be a multiple of save_every ({self.save_every})")
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


@dataclass
class ControllerNetConfig:
    """The controller network (`dynaforge.models.step_controller`): features in, log step out."""

    hidden: int = checked(64, check=AT_LEAST_ONE)
    """Width of the hidden layers."""
    layers: int = checked(2, check=NON_NEGATIVE)
    """Hidden layers of the MLP (beside its linear skip path)."""
    history: int = checked(0, check=NON_NEGATIVE)
    """Also read the features of the last K states (zero-padded at the start); 0 = none. History makes the
    step depend on the past, which breaks the time symmetry of the reversible step recursion."""
    correction: float = checked(2.0, check=POSITIVE.because("bound of the log-multiplier"))
    """Bound c of the learned log-multiplier on the classical step: h stays within exp(+-c) of eta0 tau."""
    inputs: list[str] | None = None
    """Names of the features the network reads (`dynaforge.systems.nbody.control.FEATURE_NAMES`); null: all.
    The classical time scale is added to the output whatever the network reads."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.inputs is not None and (not self.inputs or len(set(self.inputs)) < len(self.inputs)):
            raise ConfigError(f"inputs must be a non-empty list of distinct feature names, got {self.inputs}")


@dataclass
class ControllerSystemsConfig:
    """The systems a controller trains on; episodes start from states along their orbits.

    Kepler orbits start at eccentric anomalies drawn uniformly; clusters are integrated for
    `reference_time` with the classical criterion (eta = `reference_eta`) and states are drawn from that run.
    """

    kepler: int = checked(48, check=NON_NEGATIVE)
    """Two-body Kepler systems (a = 1, total mass 1)."""
    eccentricity: Range = ranged(0.0, 0.8)
    """Eccentricities of the Kepler systems."""
    eccentricity_draw: Literal["uniform", "log_pericentre"] = "uniform"
    """How e is drawn in `eccentricity`: uniformly, or with log(1 - e) (the log of the pericentre distance
    a (1 - e)) uniform, which gives each decade of pericentre distance the same weight (more orbits near
    e = 1, where step control matters most)."""
    mass_ratio: Range = ranged(0.2, 1.0, check=POSITIVE.because("m2 / m1"))
    """m2 / m1 of the Kepler systems."""
    clusters: int = checked(8, check=NON_NEGATIVE)
    """Clusters (`cluster` family, N-body units) per entry of `cluster_bodies`."""
    cluster_bodies: list[int] = field(
        default_factory=lambda: [4, 8], metadata={"check": at_least(2.0).because("bodies per cluster")}
    )
    """Body counts of the clusters (one group of episodes per count)."""
    softening: Range = ranged(0.01, 0.05, check=NON_NEGATIVE.because("softening length"))
    """Softening of the clusters (the Kepler systems have none)."""
    snapshots: int = checked(16, check=AT_LEAST_ONE)
    """Episode start states per system."""
    reference_time: float = checked(6.0, check=POSITIVE)
    """Length of the clusters' reference runs (N-body time units; a crossing time is 2.83)."""
    reference_eta: float = checked(0.005, check=POSITIVE.because("accuracy factor"))
    """Classical-criterion accuracy of the reference runs."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.kepler == 0 and (self.clusters == 0 or not self.cluster_bodies):
            raise ConfigError("no training systems: set kepler > 0 or clusters > 0 with cluster_bodies")
        if self.eccentricity.low < 0 or self.eccentricity.high >= 1:
            raise ConfigError("eccentricity must lie in [0, 1)")


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

    The training engine runs it (`dynaforge.train.step_controller`): `train` holds the optimiser, schedule,
    clipping, precision, EMA, logging, checkpoints, seed and device (`TrainConfig`, with the defaults of
    `controller_training`). `steps` and `eval_every` take the place of `train.epochs`: an epoch is
    `eval_every` optimiser steps followed by validation, and `train.epochs` is not read.
    """

    model: ControllerNetConfig = field(default_factory=ControllerNetConfig)
    """The network."""
    systems: ControllerSystemsConfig = field(default_factory=ControllerSystemsConfig)
    """The training systems."""
    train: TrainConfig = field(default_factory=lambda: controller_training())
    """The training engine's settings (see the class docstring)."""
    steps: int = checked(300, check=AT_LEAST_ONE)
    """Optimiser steps in all."""
    batch: int = checked(32, check=AT_LEAST_ONE)
    """Windows per optimiser step."""
    window: int = checked(32, check=AT_LEAST_ONE)
    """Integrator steps per optimiser step (differentiated through)."""
    episode: int = checked(16, check=AT_LEAST_ONE)
    """Windows before the systems restart from fresh start states."""
    band_low: float = checked(1e-6, check=POSITIVE.because("a relative energy error"))
    """Lower edge of the target band of per-step relative energy error."""
    band_high: float = checked(1e-5, check=POSITIVE.because("a relative energy error"))
    """Upper edge of the target band."""
    reward: float = checked(0.0, check=NON_NEGATIVE)
    """Weight of the extra larger-step reward."""
    shape: float = checked(1.0, check=NON_NEGATIVE)
    """Weight of the scale-free shape cost (which holds the main larger-step reward)."""
    penalty: float = checked(1.0, check=NON_NEGATIVE)
    """Weight of the band penalties."""
    loss: Literal["window", "run"] = "window"
    """`window`: the per-window loss above (streams of windows). `run`: a whole-run, scale-free loss:
    each optimiser step integrates `batch` systems of one group from fresh start states for `horizon`
    time units (at most `run_steps` steps; back-propagation truncated every `window` steps) and
    minimises log(N / T) + log(M) / p (p the integrator's order: 2 for leapfrog, 4 for yoshida4), N the
    steps taken over the time T covered and M the run's soft
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
    horizon: float = checked(6.283185307179586, check=POSITIVE.because("simulated time"))
    """`loss: run`: simulated time of a run (N-body units; a training Kepler orbit, a = 1 and M = 1,
    takes 2 pi)."""
    cluster_horizon: float | None = checked(None, check=POSITIVE.because("simulated time; null: horizon"))
    """`loss: run`: simulated time of a cluster run (null: `horizon`); clusters take many more steps per
    time unit than the training Kepler orbits."""
    run_steps: int = checked(3000, check=AT_LEAST_ONE)
    """`loss: run`: cap on the steps of a run (systems stop early when they reach it)."""
    run_scale: float = checked(1.0, check=POSITIVE)
    """`loss: run`: output scale of the controller during training and validation runs (the benchmark's
    `scale` knob: h = run_scale * eta0 * tau * exp(correction)). The loss is scale-free only where
    leapfrog's error grows as h^2, so runs should use steps near those of the target error (e.g. 0.25,
    eta ~ 0.005, for max |dE/E| ~ 1e-4 on Kepler orbits with e ~ 0.9), not eta0's coarser ones."""
    train_bias: bool = False
    """`loss: run`: also train the two output biases, which set a global step scale the cost does not see
    (its gradient along that direction is ~0 for untruncated fixed-time runs, up to noise, so Adam lets the
    scale wander; docs/nbody.md). Pin it with `centre` > 0: then the biases hold the mean correction at zero
    while the weights shape it."""
    sharpness: float = checked(8.0, check=at_least(1.0).because("exponent of the power mean"))
    """`loss: run`: exponent s of the power mean (mean_n e_n^s)^(1/s) that stands for the run's largest
    error (larger: closer to the maximum, which the benchmark measures, and a less smooth loss)."""
    centre: float = checked(0.0, check=NON_NEGATIVE)
    """`loss: run`: weight of centre * (mean learned log-correction over a batch's steps)^2. Even with the
    output biases frozen (`train_bias: false`) the linear path's weights on features with non-zero means can still shift every step
    alike; outside leapfrog's h^2 regime the loss pushes that shift until the bounded correction saturates
    (docs/nbody.md). The pin keeps the mean correction near zero so only the step shape is trained."""
    eval_every: int = checked(50, check=AT_LEAST_ONE)
    """Optimiser steps per epoch: validation on fixed start states (and best.pt) after each."""

    def __post_init__(self) -> None:
        check_values(self)
        if not self.band_low < self.band_high:
            raise ConfigError(f"need 0 < band_low < band_high, got {self.band_low} and {self.band_high}")


def controller_training() -> TrainConfig:
    """`timestepper.train`'s defaults: Adam at a constant 3e-3, no weight decay, clipping at 1 (absolute,
    as measured for the controller; not the window engine's relative default), a log line
    every 10 steps and a checkpoint every 50, on the CPU."""
    return TrainConfig(
        lr=3e-3,
        weight_decay=0.0,
        optimizer=OptimizerConfig(name="adam", fused=False),
        schedule=ScheduleConfig(name="constant", warmup_fraction=0.0),
        grad_clip=1.0,
        grad_clip_relative=None,
        log_every=10,
        checkpoint_every=50,
        device="cpu",
    )


LEGACY_TIMESTEPPER_KEYS = (
    "lr",
    "optimizer",
    "schedule",
    "weight_decay",
    "wandb",
    "grad_clip",
    "seed",
    "log_every",
    "checkpoint_every",
    "device",
)
"""Keys that sat directly under `timestepper` before it nested a `train` section (read as `timestepper.train.KEY`)."""
