"""The staged latent stack in `dynaforge evaluate STACK` (a folder written by `train ... stage=all`).

The usual sections score the operator (STACK/operator's checkpoint), every call conditioned on each test
trajectory's own parameters and the model dt. The stack section adds, on the same test rollouts (from the
true frames at `evaluate.start_frame`):
- the predictor-corrector rollouts: the operator alone, with the S-step corrector (stage
  `diffusion_residual`) and with the few-step student (stage `consistency_distill`), each applied every k
  steps at the student's temperature (the one it was distilled at, so that the two are compared on the
  same noise; the corrector's own, 1, without a student); nRMSE against the rollout step, its mean, the
  long-horizon energy-spectrum error (`long_horizon_spectrum_error`) and the corrector's network calls
  per rollout step (its cost; wall times are left to `benchmarks/latent_stack.py`, so that metrics.json
  stays the same byte for byte from one evaluation to the next);
- (`stack_ensembles`, for metrics.json's `ensembles` section, `dynaforge.evaluate.ensembles`) ensembles
  of `ENSEMBLE_MEMBERS` rollouts of each stochastic corrector: spread against the error of their mean;
- the steady prior (stage `steady_prior`), when trained: the spectrum distance of its samples for the test
  parameters to the test trajectories' long-time states, against the training set's mean long-time
  spectrum as a baseline (`steady_prior_score`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import numpy as np
import torch
from jaxtyping import Float
from matplotlib.figure import Figure
from torch import Tensor

from dynaforge.data import MemoryTrajectories, WindowDataset
from dynaforge.errors import ConfigError, RunError
from dynaforge.evaluate.ensembles import ENSEMBLE_MEMBERS, ensemble_scores
from dynaforge.evaluate.plots import figure_to_png, label_rollout_axes
from dynaforge.evaluate.rollout import Predictions, Rollouts, available_rollout_frames
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.metrics.spectra import SPECTRUM_RANGE, energy_spectrum, spectrum_distance
from dynaforge.models import ModelShape
from dynaforge.models.flow import sample
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import (
    Corrector,
    LatentStack,
    ensemble_rollout,
    operator_step,
    predictor_corrector_rollout,
)
from dynaforge.store.layout import fields_from_disk

STATUS_FILE = "stages.json"


def is_stack(root: str | Path) -> bool:
    """True for the root folder of a staged run (stages.json and the operator stage's folder)."""
    path = Path(root)
    return (path / STATUS_FILE).exists() and (path / "operator").is_dir()


def long_horizon_spectrum_error(
    predicted: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    spectrum_range: float = SPECTRUM_RANGE,
) -> float:
    """Mean |log10 E_pred(k) - log10 E_true(k)| over shells k >= 1 whose true energy exceeds
    `spectrum_range` times the peak, E averaged over trajectories and the second half of the rollout (the
    attractor's statistics, not pointwise agreement); physical fields."""
    half = predicted.shape[1] // 2
    e_pred = energy_spectrum(predicted[:, half:].float()).mean(dim=(0, 1, 2))
    e_true = energy_spectrum(truth[:, half:].float()).mean(dim=(0, 1, 2))
    return spectrum_distance(e_pred, e_true, spectrum_range)


def device_of(stack: LatentStack) -> torch.device:
    return next(stack.operator.parameters()).device


def conditions_for(stack: LatentStack, params: np.ndarray, count: int) -> Conditions:
    device = device_of(stack)
    return Conditions(
        dt=torch.full((count,), stack.dt, dtype=torch.float32, device=device),
        params=stack.parameters.normalize(params).to(device),
    )


def stack_rollout(
    stack: LatentStack,
    corrector: Corrector | None,
    inputs: Tensor,
    params: np.ndarray,
    steps: int,
    seed: int = 0,
) -> Tensor:
    """Physical (N, history, C, *space) inputs -> physical (N, steps, C, *space) predictor-corrector rollout
    (`corrector=None`: the operator alone), every call conditioned on each trajectory's parameters."""
    spatial_dims = inputs.ndim - 3
    conditions = conditions_for(stack, params, inputs.shape[0])
    normalized = stack.normalizer.physical_to_normalized(inputs, spatial_dims).to(device_of(stack))
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        predicted = predictor_corrector_rollout(
            stack.operator, corrector, normalized, conditions, steps, generator=generator
        )
    return stack.normalizer.normalized_to_physical(predicted.float().cpu(), spatial_dims)


def stack_one_step(
    stack: LatentStack,
    fields: np.ndarray,
    params: np.ndarray,
    shape: ModelShape,
    stride: int,
    batch_size: int,
) -> Predictions:
    """One operator call from the true inputs of every test window, with its trajectory's conditions."""
    windows = WindowDataset(
        MemoryTrajectories(fields_from_disk(fields)), history=shape.history, targets=1, stride=stride
    )
    normalized_params = stack.parameters.normalize(params)
    device = device_of(stack)
    predicted, truth = [], []
    with torch.inference_mode():
        for lo in range(0, len(windows), batch_size):
            indices = range(lo, min(lo + batch_size, len(windows)))
            inputs = torch.stack([windows[i].inputs for i in indices])
            rows = normalized_params[[i // windows.windows_per_sample for i in indices]].to(device)
            dt = torch.full((len(rows),), stack.dt, dtype=torch.float32, device=device)
            normalized = stack.normalizer.physical_to_normalized(inputs, shape.spatial_dims).to(device)
            output = operator_step(stack.operator, normalized, Conditions(dt=dt, params=rows)).float().cpu()
            predicted.append(stack.normalizer.normalized_to_physical(output, shape.spatial_dims))
            truth.append(torch.stack([windows[i].targets for i in indices]))
    return Predictions(predicted=torch.cat(predicted), truth=torch.cat(truth))


def stack_rollouts(
    stack: LatentStack,
    fields: np.ndarray,
    params: np.ndarray,
    shape: ModelShape,
    stride: int,
    start_frame: int,
    frames: int,
) -> Rollouts:
    """The operator alone from the true frames at `start_frame` (as `dynaforge.evaluate.rollout.rollouts`)."""
    trajectories = fields_from_disk(fields)[:, start_frame::stride]
    frames = min(frames, available_rollout_frames(fields.shape[1], shape, stride, start_frame))
    if frames < 1:
        raise ConfigError(
            f"trajectories of {fields.shape[1]} frames leave nothing to predict after {shape.history} input "
            f"frames from frame {start_frame} with stride {stride}; lower evaluate.start_frame"
        )
    inputs = trajectories[:, : shape.history]
    return Rollouts(
        inputs=inputs,
        predicted=stack_rollout(stack, None, inputs, params, frames),
        truth=trajectories[:, shape.history : shape.history + frames],
    )


def variant_scores(predicted: Tensor, truth: Tensor) -> dict[str, Any]:
    curve = nrmse_per_frame(predicted, truth)
    return {
        "nrmse_per_step": curve.tolist(),
        "nrmse_mean": float(curve.mean()),
        "spectrum_error": long_horizon_spectrum_error(predicted, truth),
    }


def stack_variants(stack: LatentStack) -> dict[str, Corrector | None]:
    """The rollouts the section compares: the operator alone (None), the S-step corrector (at its student's
    temperature when there is a student, so that the two are compared on the same noise), the student."""
    variants: dict[str, Corrector | None] = {"operator": None}
    if stack.corrector is not None:
        corrector = stack.corrector
        if stack.student is not None:
            corrector = dataclasses.replace(corrector, temperature=stack.student.temperature)
        variants["corrector"] = corrector
    if stack.student is not None:
        variants["student"] = stack.student
    return variants


def stack_section(
    stack: LatentStack, rolled: Rollouts, params: np.ndarray, steady: dict[str, float] | None = None
) -> dict[str, Any]:
    """metrics["latent_stack"]: see the module docstring. `rolled`: the operator-alone rollouts."""
    inputs, truth = rolled.inputs, rolled.truth
    steps = truth.shape[1]
    results: dict[str, Any] = {}
    for name, corrector in stack_variants(stack).items():
        predicted = stack_rollout(stack, corrector, inputs, params, steps)
        results[name] = {
            **variant_scores(predicted, truth),
            **(describe(corrector) if corrector is not None else {"network_calls_per_step": 0.0}),
        }
    return {"rollouts": results, "steps": steps, "steady_prior": steady}


def stack_ensembles(
    stack: LatentStack, rolled: Rollouts, params: np.ndarray, members: int = ENSEMBLE_MEMBERS
) -> dict[str, dict[str, Any]]:
    """Name -> `dynaforge.evaluate.ensembles.ensemble_scores` of `members` rollouts of each stochastic
    corrector from the operator-alone rollouts' inputs (empty without a corrector)."""
    return {
        name: ensemble_of(stack, corrector, rolled.inputs, rolled.truth, params, members, name)
        for name, corrector in stack_variants(stack).items()
        if corrector is not None
    }


def describe(corrector: Corrector) -> dict[str, Any]:
    calls = corrector.steps * (2 if corrector.method == "heun" else 1) * corrector.draws
    return {
        "sampler_steps": corrector.steps,
        "interval": corrector.interval,
        "temperature": corrector.temperature,
        "network_calls_per_step": calls / corrector.interval,
    }


def steady_prior_score(
    stack: LatentStack,
    test_fields: np.ndarray,
    test_params: np.ndarray,
    train_fields: np.ndarray,
    last_frames: int,
    seed: int = 0,
) -> dict[str, float]:
    """The steady prior against the truth: for each test trajectory, `last_frames` prior samples given its
    parameters; `prior`: the mean over trajectories of `spectrum_distance` between the samples' mean
    spectrum and that of the trajectory's last `last_frames` stored frames. `baseline`: the same distance
    for the training split's mean long-time spectrum (one spectrum for every test trajectory, what a prior
    that ignores the parameters at best knows). `energy_ratio`: mean energy of the samples / the truth's."""
    if stack.steady_prior is None:
        raise RunError("this stack has no steady prior; train its steady_prior stage first")
    spatial_dims = test_fields.ndim - 3
    truth = fields_from_disk(test_fields[:, -last_frames:]).float()  # (N, L, C, *space)
    train = fields_from_disk(train_fields[:, -last_frames:]).float()
    count = truth.shape[0] * last_frames
    shape = (count, *truth.shape[2:])
    device = device_of(stack)
    noise = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
    params = stack.parameters.normalize(test_params).repeat_interleave(last_frames, dim=0)
    empty = torch.zeros((count, 0, *shape[1:]), dtype=torch.float32, device=device)
    with torch.inference_mode():
        generated = sample(stack.steady_prior, noise.to(device), empty, params.to(device), stack.prior_steps)
    generated = stack.normalizer.normalized_to_physical(generated.float().cpu(), spatial_dims)
    generated = generated.unflatten(0, (truth.shape[0], last_frames))
    e_gen = energy_spectrum(generated).mean(dim=(1, 2))  # (N, shells)
    e_true = energy_spectrum(truth).mean(dim=(1, 2))
    e_train = energy_spectrum(train).mean(dim=(0, 1, 2))
    rows = range(truth.shape[0])
    return {
        "prior": float(np.mean([spectrum_distance(e_gen[n], e_true[n]) for n in rows])),
        "baseline": float(np.mean([spectrum_distance(e_train, e_true[n]) for n in rows])),
        "energy_ratio": float(generated.square().mean() / truth.square().mean()),
        "samples": count,
        "sampler_steps": stack.prior_steps,
    }


def ensemble_of(
    stack: LatentStack,
    corrector: Corrector,
    inputs: Tensor,
    truth: Tensor,
    params: np.ndarray,
    members: int,
    name: str,
) -> dict[str, Any]:
    """`ensemble_scores` of `members` predictor-corrector rollouts with independent noise (physical units)."""
    spatial_dims = inputs.ndim - 3
    with torch.inference_mode():
        ensemble = ensemble_rollout(
            stack.operator,
            corrector,
            stack.normalizer.physical_to_normalized(inputs, spatial_dims).to(device_of(stack)),
            conditions_for(stack, params, inputs.shape[0]),
            truth.shape[1],
            members=members,
        )
    physical = stack.normalizer.normalized_to_physical(ensemble.members.float().cpu(), spatial_dims)
    return ensemble_scores(physical, truth, variant_label(name, describe(corrector)))


LABELS = {"operator": "operator alone", "corrector": "S-step corrector", "student": "distilled student"}


def variant_label(name: str, row: dict[str, Any]) -> str:
    if "sampler_steps" not in row:
        return LABELS.get(name, name)
    return (
        f"{LABELS.get(name, name)} ({row['sampler_steps']} step(s), every {row['interval']} step(s), "
        f"temperature {row['temperature']:g})"
    )


def rollouts_png(section: dict[str, Any], frame_dt: float | None) -> bytes:
    """nRMSE against the rollout step for the operator alone and with each corrector."""
    figure = Figure(figsize=(6.5, 4), layout="constrained")
    axes = figure.add_subplot()
    for name, row in section["rollouts"].items():
        curve = row["nrmse_per_step"]
        style = "--" if name == "student" else "-"  # the student often lies on its teacher
        axes.semilogy(range(1, len(curve) + 1), curve, style, label=variant_label(name, row))
    label_rollout_axes(axes, frame_dt, "Predictor-corrector rollouts on the test split")
    axes.legend(fontsize="small")
    return figure_to_png(figure)


def stack_figures(section: dict[str, Any], frame_dt: float | None) -> list[tuple[str, str, bytes]]:
    figures = [
        (
            "nRMSE against the rollout step: the operator alone and with each corrector",
            "stack_rollouts.png",
            rollouts_png(section, frame_dt),
        )
    ]
    return figures
