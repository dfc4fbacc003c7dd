"""The `stages` section: the staged latent stack (operator, residual corrector, distilled student, steady prior)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynaforge.config.base import ConfigError
from dynaforge.config.models import FlowNetConfig


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
