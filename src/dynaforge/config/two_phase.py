"""The `twophase` section: two-phase (equilibrium propagation) training of an energy-based model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynaforge.config.base import AT_LEAST_ONE, POSITIVE, between, check_values, checked


@dataclass
class EnergyModelConfig:
    """The energy-based model (`dynaforge.models.hopfield`): a continuous Hopfield network whose units s are
    `hidden` then `outputs` units, with the input x clamped:
        E(s) = 1/2 |s|^2 - 1/2 rho(s)^T W rho(s) - b^T rho(s) - rho(s)^T U x,   W symmetric, zero diagonal.
    """

    name: Literal["hopfield"] = "hopfield"
    """Which energy model (one of `dynaforge.models.hopfield.ENERGY_MODELS`)."""
    inputs: int = checked(4, check=AT_LEAST_ONE)
    """Clamped input units."""
    hidden: int = checked(32, check=AT_LEAST_ONE)
    """Hidden units."""
    outputs: int = checked(2, check=AT_LEAST_ONE)
    """Output units (the prediction is their state)."""
    activation: Literal["tanh", "sigmoid"] = "tanh"
    """rho, the units' activation."""
    init_scale: float = checked(0.5, check=POSITIVE)
    """Initial weights are drawn N(0, init_scale^2 / fan_in): small enough for a unique, quickly reached fixed point."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class TeacherTaskConfig:
    """The task: fit the fixed points of a teacher network (an `EnergyModelConfig` network with its own
    seed and weight scale), inputs x ~ N(0, 1), targets the teacher's output units at its relaxed state."""

    train_samples: int = checked(256, check=AT_LEAST_ONE)
    """Training inputs (fixed, drawn once from the seed)."""
    val_samples: int = checked(128, check=AT_LEAST_ONE)
    """Validation inputs."""
    teacher_scale: float = checked(1.0, check=POSITIVE)
    """The teacher's init_scale (larger: a harder, more nonlinear map)."""
    seed: int = 1234
    """Seeds the teacher's weights and the inputs."""

    def __post_init__(self) -> None:
        check_values(self)


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
    beta: float = checked(0.1, check=POSITIVE.because("the sign of the nudge is fixed by `nudging`"))
    """Nudging strength (> 0)."""
    nudging: Literal["symmetric", "one_sided"] = "symmetric"
    """`symmetric` (+beta and -beta phases; bias O(beta^2)) or `one_sided` (+beta only; bias O(beta))."""
    free_steps: int = checked(40, check=AT_LEAST_ONE)
    """Relaxation steps of the free phase."""
    nudged_steps: int = checked(20, check=AT_LEAST_ONE)
    """Relaxation steps of each nudged phase (from the free state)."""
    step_size: float = checked(0.5, check=POSITIVE)
    """Relaxation step size on the state."""
    momentum: float = checked(0.0, check=between(0.0, 1.0, open_high=True).because("momentum factor"))
    """Heavy-ball momentum of the relaxation (the state's velocity is part of the snapshot)."""
    batch: int = checked(32, check=AT_LEAST_ONE)
    """Inputs per window."""
    dtype: Literal["float32", "float64"] = "float32"
    """Precision of the weights and the state."""

    def __post_init__(self) -> None:
        check_values(self)
