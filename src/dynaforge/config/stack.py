"""The `stages` section: the staged latent stack (operator, residual corrector, distilled student, steady prior)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from dynaforge.config.base import (
    AT_LEAST_ONE,
    NON_NEGATIVE,
    POSITIVE,
    at_least,
    between,
    check_values,
    checked,
    one_of,
)
from dynaforge.config.models import FlowNetConfig


@dataclass
class StageConfig:
    """What every stage of the stack trains with."""

    epochs: int = checked(10, check=AT_LEAST_ONE)
    """Passes over the stage's training data (windows; `steady_prior`: long-time states)."""
    lr: float = checked(1e-3, check=POSITIVE.because("peak learning rate"))
    """Peak learning rate."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class OperatorStageConfig(StageConfig):
    """Stage `operator`: the model of the `model` section, trained on one-step + unrolled + spectral losses."""

    rollout_steps: int = checked(3, check=AT_LEAST_ONE)
    """Model calls unrolled per window (the first is the one-step loss, the rest the rollout loss)."""
    rollout_weight: float = checked(0.5, check=NON_NEGATIVE)
    """Weight of the unrolled frames' loss (after the first call)."""
    spectral_weight: float = checked(0.1, check=NON_NEGATIVE)
    """Weight of the log energy-spectrum loss (computed in fp32, autocast off)."""
    val_rollout: int = checked(10, check=AT_LEAST_ONE)
    """Model calls of the validation rollout whose nRMSE chooses the best checkpoint."""


@dataclass
class CorrectorStageConfig(StageConfig):
    """Stage `diffusion_residual`: conditional flow matching of truth - operator prediction."""

    model: FlowNetConfig = field(default_factory=FlowNetConfig)
    """The velocity network (condition_frames is set to 2: the prediction and the last input frame)."""
    sampler_steps: int = checked(8, check=AT_LEAST_ONE)
    """S: integration steps of the sampler from noise (t = 0) to a residual (t = 1)."""
    sampler: Literal["euler", "heun"] = "euler"
    """Integrator of the sampler (first or second order)."""
    val_samples: int = checked(2, check=at_least(2.0).because("the energy score needs pairs"))
    """Samples per validation window for the energy score that chooses the best checkpoint (>= 2)."""
    interval: int = checked(1, check=AT_LEAST_ONE.because("operator steps between corrections"))
    """k: the corrector learns truth(t + k) - the operator's k-step rollout from the true frames at t,
    conditioned on that k-step prediction and the frame before it, and predictor-corrector rollouts apply
    it every k steps (the checkpoint records k). 1: the one-step residual."""


@dataclass
class DistillStageConfig(StageConfig):
    """Stage `consistency_distill`: a student that reproduces the S-step sampler in 1 or 2 steps."""

    lr: float = 5e-4
    """Peak learning rate."""
    student_steps: int = checked(1, check=one_of(1, 2))
    """Sampler steps of the student (1 or 2)."""
    temperature: float = checked(1.0, check=POSITIVE.because("noise in, a sample out"))
    """Scale of the noise draws the student learns on (student and teacher map the same scaled draw); set
    it to the sampling temperature used at inference (`Corrector.temperature`). > 0."""
    spectral_weight: float = checked(0.0, check=NON_NEGATIVE)
    """Weight of a log energy-spectrum loss between the student's and the teacher's residuals, beside the
    MSE (0: MSE alone). The MSE alone lets a student smooth away the small scales it cannot match."""


@dataclass
class SteadyStageConfig(StageConfig):
    """Stage `steady_prior`: a conditional flow-matching model of long-time states given the parameters."""

    model: FlowNetConfig = field(default_factory=lambda: FlowNetConfig(condition_frames=0))
    """The velocity network (condition_frames is set to 0)."""
    last_frames: int = checked(10, check=AT_LEAST_ONE)
    """Frames at the end of each trajectory taken as long-time states."""
    sampler_steps: int = checked(16, check=AT_LEAST_ONE)
    """Integration steps of the sampler."""


@dataclass
class RefinerStageConfig(StageConfig):
    """Stage `refiner` (named only, not part of `stage=all`): PDE-Refiner (Lippe et al., NeurIPS 2023), the
    `model` section's architecture given the noisy estimate of the next frame and the refinement step k as
    extra input frames; k = 0 predicts the next frame (MSE), k = 1..K denoise it (see `models/refiner.py`)."""

    steps: int = checked(3, check=NON_NEGATIVE.because("refinement steps after the first prediction"))
    """K: refinement calls after the first (k = 0) call; 0 is the plain one-step operator trained with MSE."""
    min_noise_std: float = checked(4e-7, check=between(0.0, 1.0, open_low=True, open_high=True))
    """sigma_min, the smallest noise variance (the public release's DDPM betas sigma_min ** (j / K)): refinement
    step k noises the change as a_k d + sigma_k noise with sigma_k about sigma_min ** (k / 2K) (change units;
    `models/refiner.py` `noise_levels`)."""
    change_scale: float = checked(0.3, check=POSITIVE.because("the change is divided by it"))
    """The network works on d = (next frame - last frame) / change_scale (normalised units), the public
    release's `difference_weight`: the k = 0 loss and the noise levels are measured against d."""
    val_rollout: int = checked(10, check=AT_LEAST_ONE)
    """Refined steps of the validation rollout whose nRMSE chooses the best checkpoint."""
    prediction: Literal["noise", "v"] = "noise"
    """What the network predicts at k > 0: `noise`, the added noise (the paper's form), or `v`, a_k noise -
    sigma_k d (the public release's v-prediction scheduler), from which the estimate is a_k x - sigma_k v
    (`models/refiner.py`)."""
    balance: bool = False
    """Weight each refinement step k's loss by the inverse of its own batch mean (same value, equal share of
    the gradient relative to its size; `models/refiner.py` `balanced`). False is the paper's plain mean,
    in which the small k = 0 loss gets a small share."""


@dataclass
class RefinerDistillStageConfig(StageConfig):
    """Stage `refiner_distill` (named only): a one-call student, started from the refiner's weights, trained
    (MSE) to reproduce the refiner's K + 1-call prediction from the same input frames."""

    lr: float = 5e-4
    """Peak learning rate."""


@dataclass
class StagesConfig:
    """`dynaforge train CONFIG --data DIR --out RUN stage=all`: the default stages in order (operator,
    corrector, student), each reading the checkpoint the one before wrote (RUN/<stage>/checkpoints/best.pt);
    RUN/stages.json records progress. The steady prior is opt-in (`stage=steady_prior`)."""

    operator: OperatorStageConfig = field(default_factory=OperatorStageConfig)
    """The latent operator."""
    diffusion_residual: CorrectorStageConfig = field(default_factory=CorrectorStageConfig)
    """The generative residual corrector."""
    consistency_distill: DistillStageConfig = field(default_factory=DistillStageConfig)
    """The few-step student of the corrector."""
    steady_prior: SteadyStageConfig = field(default_factory=SteadyStageConfig)
    """The prior of long-time states: opt-in, trained by `stage=steady_prior`, not by `stage=all`."""
    refiner: RefinerStageConfig = field(default_factory=RefinerStageConfig)
    """PDE-Refiner's refinement model (stage `refiner`, run only when named)."""
    refiner_distill: RefinerDistillStageConfig = field(default_factory=RefinerDistillStageConfig)
    """The one-call student of the refiner (stage `refiner_distill`, run only when named)."""
    val_windows: int = checked(256, check=AT_LEAST_ONE)
    """At most this many validation windows are scored per epoch (evenly spaced)."""
    seed: int = 0
    """Seed of the noise of validation samples (the same noise every epoch)."""

    def __post_init__(self) -> None:
        check_values(self)
