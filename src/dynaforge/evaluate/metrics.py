"""Error metrics on predicted frames (never on input frames: callers pass predictions and their truth).

nRMSE here is the relative L2 error per sample and frame, ||prediction - truth||_2 / ||truth||_2 over all
channels and grid points of the frame, then averaged over samples. Norms are taken in float32 or wider.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

EPS = 1e-12
"""Floor of the truth's norm, so that an all-zero true frame does not divide by zero."""


def frame_norms(fields: Float[Tensor, "batch frames channels *space"]) -> Float[Tensor, "batch frames"]:
    """L2 norm of each frame over channels and space, in float32 (or float64 if given float64)."""
    wide = fields.to(torch.promote_types(fields.dtype, torch.float32))
    return torch.linalg.vector_norm(wide.flatten(2), dim=-1)


def relative_l2_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, "batch frames"]:
    """||prediction - truth|| / ||truth|| for each sample and frame."""
    if prediction.shape != truth.shape:
        raise ValueError(
            f"prediction {tuple(prediction.shape)} and truth {tuple(truth.shape)} differ in shape"
        )
    return frame_norms(prediction - truth) / frame_norms(truth).clamp_min(EPS)


def nrmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """nRMSE of each predicted frame, averaged over the batch."""
    return relative_l2_per_frame(prediction, truth).mean(dim=0)


def nrmse(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, ""]:
    """nRMSE averaged over samples and frames."""
    return relative_l2_per_frame(prediction, truth).mean()
