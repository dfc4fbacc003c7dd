"""Training losses, each returning a scalar: `LOSSES` on normalised predicted frames (B, frames, C, *space),
computed in float32 or wider whatever the dtype of the model's output; and the latent stack's stage losses
(a log energy-spectrum distance, flow matching, consistency distillation).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.metrics.fields import relative_l2_per_frame
from dynaforge.metrics.spectra import energy_spectrum
from dynaforge.models.flow import FlowInput


def mse_loss(
    prediction: Float[Tensor, "batch frames channels *space"],
    target: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, ""]:
    """Mean squared error over every element."""
    wide = torch.promote_types(prediction.dtype, torch.float32)
    return torch.nn.functional.mse_loss(prediction.to(wide), target.to(wide))


def relative_l2_loss(
    prediction: Float[Tensor, "batch frames channels *space"],
    target: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, ""]:
    """Relative L2 error per sample and frame, averaged (the training twin of the nRMSE metric)."""
    return relative_l2_per_frame(prediction, target).mean()


LOSSES: dict[str, Callable[[Tensor, Tensor], Tensor]] = {
    "mse": mse_loss,
    "relative_l2": relative_l2_loss,
}


SPECTRUM_FLOOR = 1e-10
"""Added to energy spectra before their logarithm (normalised units), so that empty shells stay finite."""
SPECTRUM_RELATIVE_FLOOR = 1e-3
"""The spectral loss's floor, relative to the true frame's mean shell energy (see `log_spectrum_loss`)."""


def log_spectrum_loss(predicted: Tensor, truth: Tensor) -> Tensor:
    """Mean |log(E_pred(k) + f) - log(E_true(k) + f)| over samples, frames, channels and shells, in fp32 with
    autocast off (spectra of half-precision fields lose the small scales). The floor f is
    SPECTRUM_RELATIVE_FLOOR times the true frame's mean shell energy: shells far below it (the dissipation
    range) barely count, which keeps the gradient bounded (an absolute floor lets the near-empty shells'
    1 / E dominate the loss and stall training)."""
    with torch.autocast(device_type=predicted.device.type, enabled=False):
        e_pred = energy_spectrum(predicted.float())
        e_true = energy_spectrum(truth.float())
        floor = SPECTRUM_RELATIVE_FLOOR * e_true.mean(dim=-1, keepdim=True) + SPECTRUM_FLOOR
        return (torch.log(e_pred + floor) - torch.log(e_true + floor)).abs().mean()


def flow_matching_loss(model: nn.Module, target: Tensor, condition: Tensor, params: Tensor) -> Tensor:
    """Straight-path flow matching: x_t = (1 - t) x0 + t x1 with x0 ~ N(0, I), regress v = x1 - x0."""
    noise = torch.randn_like(target)
    t = torch.rand(target.shape[0], dtype=target.dtype, device=target.device)
    view = (-1,) + (1,) * (target.ndim - 1)
    state = (1 - t.view(view)) * noise + t.view(view) * target
    velocity = model(FlowInput(state=state, time=t, condition=condition, params=params)).velocity
    return mse_loss(velocity, target - noise)


def distillation_loss(student: Tensor, target: Tensor, spectral_weight: float = 0.0) -> Tensor:
    """MSE between the student's and the teacher's samples of the same noise (B, C, *space), plus
    `spectral_weight` times the log energy-spectrum loss between them (the MSE alone lets a student smooth
    away the small scales it cannot match; the spectrum term charges for the lost energy)."""
    loss = mse_loss(student, target)
    if spectral_weight > 0:
        loss = loss + spectral_weight * log_spectrum_loss(student[:, None], target[:, None])
    return loss
