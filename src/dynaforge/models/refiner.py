"""PDE-Refiner (Lippe et al., "PDE-Refiner: Achieving Accurate Long Rollouts with Neural PDE Solvers",
NeurIPS 2023): one network, called K + 1 times per time step.

The network is a surrogate of the registry (the operator's architecture) built for two more input frames
than the data's history: the current estimate of the next frame and a constant frame holding the
refinement step as k / K (the step's conditioning input). Per time step:

- everything is in change units: d = (next frame - last input frame) / `change_scale` (the release's
  `predict_difference` with `difference_weight` 0.3), so that the k = 0 loss and the noise levels are
  measured against an O(1) signal rather than against the frame, which the change is a small part of;
- k = 0: the estimate is zeros; the network predicts d, and the first estimate of the next frame is
  last frame + change_scale * d;
- k = 1 .. K: the estimate of d, noised as a_k d + sigma_k noise (Gaussian noise, sigma_k falling roughly
  geometrically from about sqrt(sigma_min ** (1 / K)) to sqrt(sigma_min): `noise_levels`, the public
  release's DDPM schedule, where sigma_min is the smallest noise *variance*), goes in; the network predicts
  that noise, and the new estimate is the noised one minus sigma_k times the predicted noise, over a_k (a
  denoising step whose noise level falls step by step, so that the last steps work on the low-amplitude,
  high-wavenumber content an MSE-trained operator neglects).

Training (`refiner_loss`) draws k uniformly in 0..K per sample: k = 0 is the MSE of the predicted change d
(the one-step MSE of the next frame over change_scale ** 2); k > 0 is the MSE of the predicted noise against
the noise added to the true change. With K = 0 the model is the plain one-step operator trained with MSE
(plus two input frames that are always zero).

Conventions as `dynaforge.models.base`: normalised, channels-first frames (batch, frames, C, *space), one
predicted frame per call. The paper writes the refinement as noise prediction (`prediction="noise"`, the
default); the public code release (pdearena) trains its DDPM scheduler with v-prediction
(`prediction="v"`): at k > 0 the network predicts v = a_k noise - sigma_k d, the new estimate of d is
a_k x - sigma_k v for the noised estimate x = a_k d + sigma_k noise (exact, since a_k ** 2 + sigma_k ** 2 = 1),
and the loss is the MSE of v. An error e in the network's output moves the estimate of d by sigma_k e / a_k
with noise prediction and by sigma_k e with v-prediction: the two differ where a_k is well below 1 (large
noise). At the small noise levels used here (sigma_k <= 0.09, a_k >= 0.996) v is nearly the noise and the two
forms nearly coincide.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import Any, Literal

import torch
from jaxtyping import Float, Int
from torch import Tensor, nn

from dynaforge.config import ConfigError, ModelConfig, config_from_dict
from dynaforge.models.base import ModelInput, ModelOutput, ModelShape, shape_from_dict, zero_layer
from dynaforge.models.registry import build_model

REFINER_KIND = "refiner"
"""Checkpoint kind of a refiner (`dynaforge.models.loading.BUILDERS`)."""
Prediction = Literal["noise", "v"]
"""What the network predicts at k > 0: the added noise (the paper) or v = a_k noise - sigma_k d (the
public release's scheduler); see the module docstring."""


def signal_levels(steps: int, min_noise_std: float) -> list[float]:
    """a_k, the factor of the change in the noised estimate a_k d + sigma_k noise of refinement step k = 1..K
    (empty for K = 0): the public release's DDPM schedule, whose betas (noise *variances* added per
    diffusion step) are sigma_min ** (j / K) for j = K .. 0, so that a_k ** 2 is the product of
    1 - sigma_min ** (j / K) over j = k .. K."""
    return [
        math.sqrt(math.prod(1.0 - min_noise_std ** (j / steps) for j in range(k, steps + 1)))
        for k in range(1, steps + 1)
    ]


def noise_levels(steps: int, min_noise_std: float) -> list[float]:
    """sigma_k = sqrt(1 - a_k ** 2) for k = 1..K (empty for K = 0): the noise standard deviation of
    refinement step k, about sigma_min ** (k / 2K) (the release's `min_noise_std` is the smallest noise
    variance, 4e-7 for KS: standard deviations 0.086, 0.0074, 6.3e-4 at K = 3)."""
    return [math.sqrt(1.0 - a * a) for a in signal_levels(steps, min_noise_std)]


def network_shape(shape: ModelShape) -> ModelShape:
    """The inner network's shape: the data's history plus the estimate and the step frame, one frame out,
    predicting every channel itself (no residual, no held channels)."""
    if shape.held:
        raise ConfigError("the refiner predicts every channel; data with held channels is not supported")
    if shape.horizon != 1:
        raise ConfigError(
            f"the refiner predicts one frame per call; set data.horizon=1 (got {shape.horizon})"
        )
    return shape._replace(history=shape.history + 2)


class Refiner(nn.Module):
    """A surrogate (`forward(ModelInput) -> ModelOutput`) that refines its one-step prediction K times; see
    the module docstring. `network` is built for `network_shape(shape)` with `residual=False`."""

    def __init__(
        self,
        network: nn.Module,
        shape: ModelShape,
        steps: int,
        min_noise_std: float,
        change_scale: float = 1.0,
        prediction: Prediction = "noise",
    ) -> None:
        super().__init__()
        if prediction not in ("noise", "v"):
            raise ConfigError(f"refiner prediction must be 'noise' or 'v', got {prediction!r}")
        self.prediction = prediction
        self.network = network
        self.shape = shape
        self.steps = steps
        self.min_noise_std = min_noise_std
        self.change_scale = change_scale
        self.levels = noise_levels(steps, min_noise_std)
        self.signals = signal_levels(steps, min_noise_std)

    def call(
        self,
        frames: Float[Tensor, "batch history channels *space"],
        estimate: Float[Tensor, "batch 1 channels *space"],
        k: Int[Tensor, " batch"],
    ) -> Float[Tensor, "batch 1 channels *space"]:
        """One network call at refinement step k (per sample) on an `estimate` of the change d: the raw
        output (d at k = 0, the predicted noise or v at k > 0)."""
        fraction = k.to(estimate.dtype) / max(self.steps, 1)
        step = fraction.view(-1, *[1] * (estimate.ndim - 1)).expand_as(estimate)
        stacked = torch.cat([frames, estimate, step], dim=1)
        return self.network(ModelInput(frames=stacked)).frames

    def first_estimate(
        self, frames: Float[Tensor, "batch history channels *space"]
    ) -> Float[Tensor, "batch 1 channels *space"]:
        """The k = 0 prediction of the change d (change units)."""
        zeros = torch.zeros_like(frames[:, -1:])
        k = torch.zeros(frames.shape[0], dtype=torch.long, device=frames.device)
        return self.call(frames, zeros, k)

    def refine(
        self,
        frames: Float[Tensor, "batch history channels *space"],
        estimate: Float[Tensor, "batch 1 channels *space"],
        k: int,
        noise: Float[Tensor, "batch 1 channels *space"],
    ) -> Float[Tensor, "batch 1 channels *space"]:
        """Refinement step k (1..K) of an estimate of d: noise it (x = a_k d + sigma_k noise), then subtract
        the predicted noise and undo a_k, or (v-prediction) take a_k x - sigma_k v."""
        sigma, signal = self.levels[k - 1], self.signals[k - 1]
        noisy = signal * estimate + sigma * noise
        steps = torch.full((frames.shape[0],), k, dtype=torch.long, device=frames.device)
        output = self.call(frames, noisy, steps)
        if self.prediction == "v":
            return signal * noisy - sigma * output
        return (noisy - sigma * output) / signal

    def forward(self, inputs: ModelInput, generator: torch.Generator | None = None) -> ModelOutput:
        """The next frame after K + 1 network calls; `generator` draws the refinement noise (None: torch's
        global generator)."""
        frames = inputs.frames
        estimate = self.first_estimate(frames)
        for k in range(1, self.steps + 1):
            noise = torch.randn(
                estimate.shape, generator=generator, dtype=estimate.dtype, device=estimate.device
            )
            estimate = self.refine(frames, estimate, k, noise)
        return ModelOutput(frames=frames[:, -1:] + self.change_scale * estimate)


def build_refiner(
    config: ModelConfig,
    shape: ModelShape,
    steps: int,
    min_noise_std: float,
    change_scale: float = 1.0,
    prediction: Prediction = "noise",
) -> Refiner:
    """A fresh refiner whose network is `config`'s architecture (its `residual` turned off: the refiner
    adds the last frame itself at k = 0 and predicts noise at k > 0), its output layer zeroed as a residual
    surrogate's is: the first prediction is "no change" (and "no noise"), as the plain operator's. With a
    random output layer instead, the K = 0 refiner trained worse than the same network through the plain
    trainer (U-Net, KS, 400 steps: one-step loss 7.1e-5 against 3.0e-5, docs/long_rollouts.md)."""
    network = build_model(dataclasses.replace(config, residual=False), network_shape(shape))
    layer = network.output_layer()
    if layer is not None:
        zero_layer(layer)
    return Refiner(network, shape, steps, min_noise_std, change_scale, prediction)


def refiner_from_checkpoint(checkpoint: Mapping[str, Any]) -> nn.Module:
    """The untrained refiner a checkpoint of kind `refiner` describes (`refiner_steps`, `min_noise_std`,
    `change_scale`, `refiner_prediction`: noise in checkpoints written before it was recorded)."""
    config = config_from_dict(checkpoint["config"])
    shape = shape_from_dict(checkpoint["model_shape"])
    steps, sigma = int(checkpoint["refiner_steps"]), float(checkpoint["min_noise_std"])
    scale, prediction = (
        float(checkpoint.get("change_scale", 1.0)),
        checkpoint.get("refiner_prediction", "noise"),
    )
    return build_refiner(config.model, shape, steps, sigma, scale, prediction)


def refiner_loss(
    model: Refiner,
    inputs: Float[Tensor, "batch history channels *space"],
    target: Float[Tensor, "batch 1 channels *space"],
    k: Int[Tensor, " batch"],
    noise: Float[Tensor, "batch 1 channels *space"],
    balance: bool = False,
) -> Tensor:
    """PDE-Refiner's training loss for refinement steps `k` (per sample, 0..K) and Gaussian `noise`: the
    mean over samples of the k = 0 samples' MSE of the predicted change d = (target - last frame) /
    change_scale and the k > 0 samples' MSE of the predicted noise, or of v = a_k noise - sigma_k d with
    `model.prediction` "v" (one network call for the whole batch)."""
    change = (target - inputs[:, -1:]) / model.change_scale
    per_k = [0.0, *model.levels], [1.0, *model.signals]
    sigma, signal = (
        torch.tensor(v, dtype=torch.float32, device=inputs.device)[k]
        .view(-1, *[1] * (target.ndim - 1))
        .to(target.dtype)
        for v in per_k
    )
    first = k == 0
    mask = first.view(-1, *[1] * (target.ndim - 1))
    noisy = torch.where(mask, torch.zeros_like(change), signal * change + sigma * noise)
    output = model.call(inputs, noisy, k)
    wanted = torch.where(mask, change, signal * noise - sigma * change if model.prediction == "v" else noise)
    per_sample = (output.float() - wanted.float()).square().flatten(1).mean(dim=1)
    return balanced(per_sample, k) if balance else per_sample.mean()


def balanced(per_sample: Float[Tensor, " batch"], k: Int[Tensor, " batch"]) -> Tensor:
    """The loss with every refinement step k of the batch weighted by the inverse of its own (detached)
    mean loss, times the batch's detached mean loss: the same value, but each k gets the same share of the
    gradient relative to its loss (the gradient of the mean over k of log L_k, times L). Without it the k = 0
    loss (the one-step MSE in change units, about 3e-3 on KS after one epoch) is lost beside the noise
    predictions' (about 0.1-1), and the first estimate trains far slower than the MSE operator."""
    total = per_sample.mean().detach()
    groups = [per_sample[k == value] for value in torch.unique(k)]
    terms = [group.mean() / group.mean().detach().clamp_min(1e-12) for group in groups]
    return total * torch.stack(terms).mean()


def refined_rollout(
    model: nn.Module,
    frames: Float[Tensor, "batch history channels *space"],
    steps: int,
    generator: torch.Generator | None = None,
) -> Float[Tensor, "batch steps channels *space"]:
    """`steps` time steps of a refiner (or any surrogate, `generator` then unused), each from the last
    `history` frames known or predicted; predictions only."""
    history = frames.shape[1]
    window, predicted = frames, []
    for _ in range(steps):
        if isinstance(model, Refiner):
            output = model(ModelInput(frames=window), generator=generator).frames
        else:
            output = model(ModelInput(frames=window)).frames
        predicted.append(output)
        window = torch.cat([window, output], dim=1)[:, -history:]
    return torch.cat(predicted, dim=1)
