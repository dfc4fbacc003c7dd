"""Training losses on normalised predicted frames (B, frames, C, *space); each returns a scalar.

Both are computed in float32 or wider, whatever the dtype of the model's output.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.metrics.fields import relative_l2_per_frame


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
