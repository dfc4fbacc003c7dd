"""Inference with the staged latent stack: predictor-corrector rollouts, ensembles and their spread.

A rollout advances the operator every step (the predictor); every `every` steps, or when a sample's
energy drifts by more than `drift_threshold` (relative to the last true or corrected frame), the
corrector adds a residual sampled from its flow model, conditioned on the prediction and the previous
frame. The corrector is the S-step sampler of stage `diffusion_residual` or the 1-2 step student of
stage `consistency_distill`: both map the same noise to a residual. An ensemble repeats the rollout with
independent noise; its spread (standard deviation across members) is the stack's own error estimate.

Everything here works in normalised units (the stages' units); callers denormalise for physical metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.data.conditioned import ParameterNormalizer
from dynaforge.data.normalize import Normalizer
from dynaforge.errors import ConfigError
from dynaforge.models.base import ModelInput
from dynaforge.models.flow import sample
from dynaforge.models.latent import Conditions, LatentOperator
from dynaforge.models.loading import load_surrogate
from dynaforge.runs import load_checkpoint


def operator_step(model: nn.Module, frames: Tensor, conditions: Conditions | None) -> Tensor:
    """One operator call on (B, history, C, *space) frames -> (B, horizon, C, *space); the conditions are
    passed to models that take them (the latent operator) and left out for the others."""
    inner = getattr(model, "module", model)  # DistributedDataParallel keeps the model in .module
    if isinstance(inner, LatentOperator) and conditions is not None:
        return model(ModelInput(frames=frames), conditions).frames
    return model(ModelInput(frames=frames)).frames


def conditioned_rollout(
    model: nn.Module, frames: Tensor, conditions: Conditions | None, steps: int
) -> Float[Tensor, "batch predicted channels *space"]:
    """`steps` operator calls, each on the last `history` frames known or predicted (predictions only)."""
    history = frames.shape[1]
    window, predicted = frames, []
    for _ in range(steps):
        output = operator_step(model, window, conditions)
        predicted.append(output)
        window = torch.cat([window, output], dim=1)[:, -history:]
    return torch.cat(predicted, dim=1)


@dataclass
class Corrector:
    """A residual sampler: the flow model, how many steps (and which integrator) it takes, and how many
    draws it averages (1: a sample of the residual; more: an estimate of its conditional mean, which trades
    the sample's spread for a lower expected error). `interval`: the operator steps between corrections it
    was trained for (its checkpoint's k; rollouts default to it). `temperature`: the noise is scaled by it
    before sampling (1: the trained model's samples; below 1: draws pulled toward the flow's image of the
    noise mean, less spread; 0 would make the sampler deterministic and is refused)."""

    model: nn.Module
    steps: int
    method: str = "euler"
    draws: int = 1
    interval: int = 1
    temperature: float = 1.0

    def __post_init__(self) -> None:
        if self.temperature <= 0:
            raise ConfigError(f"temperature must be > 0 (noise in, a sample out), got {self.temperature}")
        if self.interval < 1 or self.draws < 1:
            raise ConfigError(f"interval and draws must be >= 1, got {self.interval} and {self.draws}")

    def residual(
        self,
        prediction: Float[Tensor, "batch channels *space"],
        previous: Float[Tensor, "batch channels *space"],
        params: Float[Tensor, "batch parameters"],
        noise: Tensor,  # (B, C, *space) or (draws, B, C, *space)
    ) -> Float[Tensor, "batch channels *space"]:
        """The residual from `noise` (B, C, *space), or the mean over a leading axis of draws."""
        if noise.ndim == prediction.ndim:
            noise = noise[None]
        draws = noise.shape[0]
        condition = torch.stack([prediction, previous], dim=1)
        if draws > 1:  # one batch of every draw (one draw: no copies, no mean)
            condition, params = condition.repeat(draws, *(1,) * prediction.ndim), params.repeat(draws, 1)
        samples = sample(
            self.model,
            self.temperature * noise.flatten(0, 1),
            condition,
            params,
            self.steps,
            self.method,  # type: ignore[arg-type]
        )
        return samples if draws == 1 else samples.unflatten(0, (draws, -1)).mean(dim=0)


def energy(frame: Tensor) -> Tensor:
    """Mean square of each sample's frame: (B, C, *space) -> (B,)."""
    return frame.float().square().flatten(1).mean(dim=1)


def corrected(
    corrector: Corrector,
    prediction: Tensor,
    previous: Tensor,
    params: Tensor,
    scheduled: bool,
    reference: Tensor | None,
    drift_threshold: float | None,
    generator: torch.Generator | None,
) -> tuple[Tensor, Tensor | None]:
    """One step's correction: every sample when `scheduled`, and (with `drift_threshold` and the energy
    `reference` of each sample's last true or corrected frame) the samples whose energy drifted; returns
    the frame and the updated reference. Without a threshold no energy is tracked (the hot loop's
    bookkeeping stays off)."""
    due = None  # None: the schedule alone decides, for every sample at once
    if reference is not None and drift_threshold is not None:
        drift = (energy(prediction) / reference.clamp_min(1e-12) - 1).abs()
        due = (drift > drift_threshold) | scheduled
    if not scheduled and (due is None or not bool(due.any())):
        return prediction, reference
    noise = torch.randn((corrector.draws, *prediction.shape), generator=generator, dtype=torch.float32)
    residual = corrector.residual(prediction, previous, params, noise.to(prediction))
    if due is None:
        return prediction + residual, reference
    view = (-1,) + (1,) * (prediction.ndim - 1)
    prediction = torch.where(due.view(view), prediction + residual, prediction)
    return prediction, torch.where(due, energy(prediction), reference)


def predictor_corrector_rollout(
    operator: nn.Module,
    corrector: Corrector | None,
    frames: Float[Tensor, "batch history channels *space"],
    conditions: Conditions,
    steps: int,
    every: int | None = None,
    drift_threshold: float | None = None,
    generator: torch.Generator | None = None,
) -> Float[Tensor, "batch steps channels *space"]:
    """Roll out `steps` frames (operator horizon 1); see the module docstring. `corrector=None`: the
    operator alone. `every=None`: the corrector's own interval. Noise comes from `generator` (CPU), so a
    rollout is reproducible."""
    if corrector is not None and every is None:
        every = corrector.interval
    every = every or 1
    history = frames.shape[1]
    window, predicted = frames, []
    tracked = corrector is not None and drift_threshold is not None
    reference = energy(frames[:, -1]) if tracked else None
    for step in range(steps):
        prediction = operator_step(operator, window, conditions)[:, 0]
        if corrector is not None:
            prediction, reference = corrected(
                corrector,
                prediction,
                window[:, -1],
                conditions.params,
                (step + 1) % every == 0,
                reference,
                drift_threshold,
                generator,
            )
        predicted.append(prediction)
        window = torch.cat([window, prediction[:, None]], dim=1)[:, -history:]
    return torch.stack(predicted, dim=1)


class Ensemble(NamedTuple):
    """Members' rollouts (M, B, T, C, *space), their mean and spread (std across members)."""

    members: Tensor
    mean: Tensor
    spread: Tensor


def ensemble_rollout(
    operator: nn.Module,
    corrector: Corrector,
    frames: Tensor,
    conditions: Conditions,
    steps: int,
    members: int,
    every: int | None = None,
    drift_threshold: float | None = None,
    seed: int = 0,
) -> Ensemble:
    """`members` predictor-corrector rollouts of the same inputs with independent noise."""
    if members < 2:
        raise ConfigError(f"an ensemble needs at least 2 members, got {members}")
    generator = torch.Generator().manual_seed(seed)
    runs = [
        predictor_corrector_rollout(
            operator, corrector, frames, conditions, steps, every, drift_threshold, generator
        )
        for _ in range(members)
    ]
    stacked = torch.stack(runs)
    return Ensemble(members=stacked, mean=stacked.mean(dim=0), spread=stacked.std(dim=0))


class LatentStack(NamedTuple):
    """The trained stack of a stages run, ready for inference (models in eval mode)."""

    operator: nn.Module
    corrector: Corrector | None
    student: Corrector | None
    steady_prior: nn.Module | None
    normalizer: Normalizer
    parameters: ParameterNormalizer
    dt: float
    prior_steps: int = 16
    """Sampler steps of the steady prior (its checkpoint's)."""


def load_stack(run: str | Path, map_location: str | torch.device = "cpu") -> LatentStack:
    """Each stage's best checkpoint under `run` (stages not trained yet are None; the operator is needed)."""
    root = Path(run)
    operator_state = load_checkpoint(root / "operator" / "checkpoints" / "best.pt", map_location)
    stack: dict[str, Any] = {}
    for name in ("diffusion_residual", "consistency_distill", "steady_prior"):
        path = root / name / "checkpoints" / "best.pt"
        stack[name] = load_checkpoint(path, map_location) if path.exists() else None

    def corrector(state: dict[str, Any] | None) -> Corrector | None:
        if state is None:
            return None
        model = load_surrogate(state).model
        interval, temperature = int(state.get("interval", 1)), float(state.get("temperature", 1.0))
        steps, method = int(state["sampler_steps"]), str(state["sampler"])
        return Corrector(model, steps, method, interval=interval, temperature=temperature)

    # Each stage's model stays on the CPU (`load_surrogate`'s default), where it was always built; the
    # evaluator puts the operator it scores on its device.
    operator = load_surrogate(operator_state)
    prior = stack["steady_prior"]
    return LatentStack(
        operator=operator.model,
        corrector=corrector(stack["diffusion_residual"]),
        student=corrector(stack["consistency_distill"]),
        steady_prior=load_surrogate(prior).model if prior is not None else None,
        normalizer=operator.normalizer,
        parameters=ParameterNormalizer.from_dict(operator_state["parameter_normalization"]),
        dt=float(operator_state["dt"]),
        prior_steps=int(prior["sampler_steps"]) if prior is not None else 16,
    )
