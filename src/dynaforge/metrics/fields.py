"""Error metrics on predicted frames, by the definitions of the benchmarks they come from.

Every function takes a prediction and its truth as (batch, frames, channels, *space) tensors: the frames are
predicted frames only (callers pass predictions and the true frames they stand for, never the input frames;
see `dynaforge.evaluate.rollout`). Functions named `*_per_frame` return one value per frame, reduced over
the batch and the channels the way the source reduces them; the scalar a benchmark reports is the mean of
that curve over the frames (PDEBench: `metric_func(..., if_mean=True)` averages over channels and time; The
Well: the "T=all" value averages the batch-mean over time and over fields). Norms are taken in float32 (or
float64 when given float64) whatever the input dtype.

Sources:
- PDEBench (Takamoto et al., NeurIPS 2022 Datasets and Benchmarks, Sec. 4 "metrics" and App. D), function
  `metric_func` in `pdebench/models/metrics.py`: RMSE, nRMSE, cRMSE, bRMSE, max error, and the Fourier-band
  RMSE (in `dynaforge.metrics.spectra`).
- The Well (Ohana et al., NeurIPS 2024 Datasets and Benchmarks, Sec. 4), classes `VRMSE` / `NRMSE` in
  `the_well/benchmark/metrics/spatial.py`: VRMSE.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from jaxtyping import Bool, Float
from torch import Tensor

from dynaforge.errors import ConfigError

EPS = 1e-12
"""Floor of a truth norm in a denominator, so that an all-zero true frame does not divide by zero
(PDEBench divides without a floor and would return inf or NaN there)."""
WELL_EPS = 1e-7
"""The Well's epsilon, added to the truth's variance in VRMSE (`NMSE.eval(..., eps=1e-7)`)."""


def check_same_shape(prediction: Tensor, truth: Tensor) -> None:
    if prediction.shape != truth.shape:
        raise ConfigError(
            f"prediction {tuple(prediction.shape)} and truth {tuple(truth.shape)} differ in shape; both are "
            "(batch, frames, channels, *space) and hold predicted frames only"
        )
    if prediction.ndim < 4:
        raise ConfigError(
            f"fields must be (batch, frames, channels, *space) with at least one spatial axis, got "
            f"{tuple(prediction.shape)}"
        )


class FluidFields(NamedTuple):
    """A prediction and its truth scored over the fluid cells only (`fluid_fields`)."""

    prediction: Float[Tensor, "batch frames channels *space"]
    truth: Float[Tensor, "batch frames channels *space"]
    fluid: Bool[Tensor, "batch frames 1 *space"] | None
    """True at the cells outside every obstacle; None: every cell is fluid."""


def fluid_fields(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    obstacle_channel: int | None,
) -> FluidFields:
    """The fields to score when channel `obstacle_channel` holds an obstacle mask (1 inside; a cell counts
    as inside where the true frame's mask is >= 1/2, its centre inside the obstacle's edge): the mask
    channel dropped (a surrogate holds it from its input, `ModelShape.held`; it is no physical field), both
    fields set to 0 inside the obstacle, and the fluid cells marked. A metric given `fluid` averages over
    the fluid cells; one that is a ratio of sums (nRMSE) or a maximum is exact over the fluid cells with
    the zeros alone. The fields as given, and no mask, where `obstacle_channel` is None."""
    if obstacle_channel is None:
        return FluidFields(prediction, truth, None)
    check_same_shape(prediction, truth)
    fluid = truth[:, :, obstacle_channel : obstacle_channel + 1] < 0.5
    kept = [c for c in range(truth.shape[2]) if c != obstacle_channel]

    def in_fluid(fields: Tensor) -> Tensor:
        return torch.where(fluid, fields[:, :, kept], 0.0)

    return FluidFields(in_fluid(prediction), in_fluid(truth), fluid)


def space_mean(values: Tensor, fluid: Tensor | None) -> Tensor:
    """The mean of (batch, frames, channels, *space) `values` over space: over the `fluid` cells (a mask
    of shape (batch, frames, 1, *space)) when given, else over every cell."""
    axes = space_axes(values)
    if fluid is None:
        return values.mean(dim=axes)
    weights = fluid.to(values.dtype)
    return (values * weights).sum(dim=axes) / weights.sum(dim=axes).clamp_min(1.0)


def widen(fields: Tensor) -> Tensor:
    """The tensor in float32, or float64 when it already is (metrics never run in half precision)."""
    return fields.to(torch.promote_types(fields.dtype, torch.float32))


def root(values: Tensor) -> Tensor:
    """sqrt(values) for values >= 0, with gradient 0 (not inf times 0 = NaN) where a value is 0, so that an
    exact prediction has a finite gradient."""
    positive = values > 0
    return torch.where(positive, torch.where(positive, values, 1.0).sqrt(), 0.0)


def space_axes(fields: Tensor) -> tuple[int, ...]:
    """The spatial axes of a (batch, frames, channels, *space) tensor."""
    return tuple(range(3, fields.ndim))


# ---- relative L2 (the training loss's counterpart) ------------------------------------------------


def frame_norms(fields: Float[Tensor, "batch frames channels *space"]) -> Float[Tensor, "batch frames"]:
    """L2 norm of each frame over channels and space, in float32 (or float64 if given float64)."""
    return torch.linalg.vector_norm(widen(fields).flatten(2), dim=-1)


def relative_l2_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, "batch frames"]:
    """||prediction - truth|| / ||truth|| for each sample and frame, over all channels and grid points."""
    check_same_shape(prediction, truth)
    return frame_norms(prediction - truth) / frame_norms(truth).clamp_min(EPS)


# ---- PDEBench -------------------------------------------------------------------------------------


def rmse_per_sample(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    fluid: Tensor | None = None,
) -> Float[Tensor, "batch frames channels"]:
    """sqrt(mean over grid points of (prediction - truth)^2), per sample, frame and channel (the mean over
    the `fluid` cells when given, `fluid_fields`)."""
    check_same_shape(prediction, truth)
    error = widen(prediction) - widen(truth)
    return root(space_mean(error.square(), fluid))


def rmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    fluid: Tensor | None = None,
) -> Float[Tensor, " frames"]:
    """PDEBench RMSE (`metric_func`, `err_RMSE`): the per-sample RMSE over the grid (its `fluid` cells when
    given), averaged over samples and channels."""
    return rmse_per_sample(prediction, truth, fluid).mean(dim=(0, 2))


def nrmse_per_sample(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, "batch frames channels"]:
    """RMSE / sqrt(mean truth^2) over the grid, computed as ||e||_2 / ||u||_2 (the same ratio; for one
    channel bit for bit the relative L2 of `relative_l2_per_frame`), per sample, frame and channel."""
    check_same_shape(prediction, truth)
    error = widen(prediction) - widen(truth)
    points = (*error.shape[:3], -1)
    error_norm = torch.linalg.vector_norm(error.reshape(points), dim=-1)
    truth_norm = torch.linalg.vector_norm(widen(truth).reshape(points), dim=-1)
    return error_norm / truth_norm.clamp_min(EPS)


def nrmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """PDEBench nRMSE (`metric_func`, `err_nRMSE`): each sample's RMSE divided by the RMS of its true
    frame, per channel, then averaged over samples and channels. With one channel this is the relative L2
    error ||prediction - truth||_2 / ||truth||_2 of each frame, averaged over samples."""
    return nrmse_per_sample(prediction, truth).mean(dim=(0, 2))


def nrmse(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, ""]:
    """PDEBench nRMSE averaged over frames (`metric_func(..., if_mean=True)`): the mean over samples,
    frames and channels, which is the mean of `nrmse_per_frame` (every frame has the same samples)."""
    return nrmse_per_sample(prediction, truth).mean()


def crmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    fluid: Tensor | None = None,
) -> Float[Tensor, " frames"]:
    """PDEBench conserved-quantity RMSE (`metric_func`, `err_CSV`): the RMS over samples of the difference
    of the sums over the grid, divided by the number of grid points (so: the RMS error of the spatial mean,
    the "mass"), per channel, then averaged over channels; over the `fluid` cells when given."""
    check_same_shape(prediction, truth)
    error = widen(prediction) - widen(truth)
    mean_error = space_mean(error, fluid)  # (B, F, C) = (sum p - sum u) / points
    return root(mean_error.square().mean(dim=0)).mean(dim=-1)


def max_error_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """PDEBench max error (`metric_func`, `err_Max`): max |prediction - truth| over samples and grid points,
    per channel, then averaged over channels. PDEBench takes the max within each batch and averages the
    batches; dynaforge scores the whole test split as one batch."""
    check_same_shape(prediction, truth)
    error = (widen(prediction) - widen(truth)).abs()
    return error.movedim(0, 2).flatten(2).amax(dim=-1).mean(dim=-1)


def boundary_squares(error: Tensor) -> tuple[Tensor, int]:
    """Sum of squared errors on the faces of the grid box, and the number of face points counted.

    For each spatial axis the first and last slices are taken (edges and corners counted once per face
    they lie on, as PDEBench does): 2 points in 1D, 2 X + 2 Y in 2D, 2 (XY + YZ + ZX) in 3D.
    """
    axes = space_axes(error)
    total = torch.zeros(error.shape[:3], dtype=error.dtype, device=error.device)
    count = 0
    for axis in axes:
        for index in (0, error.shape[axis] - 1):
            face = error.select(axis, index)
            total = total + face.square().reshape(*face.shape[:3], -1).sum(dim=-1)
            count += math.prod(face.shape[3:])
    return total, count


def brmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """PDEBench boundary RMSE (`metric_func`, `err_BD`): per sample, the RMS error over the boundary points
    of the grid (both ends of every axis), averaged over samples and channels. (PDEBench's 3D branch pools
    the channels into the boundary sum; here every dimension is per channel, as in its 1D and 2D code.)"""
    check_same_shape(prediction, truth)
    error = widen(prediction) - widen(truth)
    squares, count = boundary_squares(error)
    return root(squares / count).mean(dim=(0, 2))


# ---- The Well ----------------------------------------------------------------------------------------


def vrmse_per_sample(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    eps: float = WELL_EPS,
    fluid: Tensor | None = None,
) -> Float[Tensor, "batch frames channels"]:
    """sqrt(mean (prediction - truth)^2 / (var(truth) + eps)) over the grid, per sample, frame, channel;
    var is the unbiased (n - 1) variance of the true frame over its grid points, as `torch.std` gives.
    Given `fluid`, both the mean and the variance are over the fluid cells."""
    check_same_shape(prediction, truth)
    wide = widen(truth)
    error = widen(prediction) - wide
    mse = space_mean(error.square(), fluid)
    if fluid is None:
        points = wide.flatten(3)
        variance = points.var(dim=-1, correction=1 if points.shape[-1] > 1 else 0)
    else:
        count = fluid.flatten(3).sum(dim=-1).to(wide.dtype)  # (B, F, 1)
        centred = wide - space_mean(wide, fluid).reshape(*wide.shape[:3], *[1] * (wide.ndim - 3))
        squares = space_mean(centred.square(), fluid) * count
        variance = squares / (count - 1).clamp_min(1.0)
    return root(mse / (variance + eps))


def vrmse_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
    *,
    fluid: Tensor | None = None,
    eps: float = WELL_EPS,
) -> Float[Tensor, " frames"]:
    """The Well's VRMSE (class `VRMSE`, `NRMSE.eval(..., norm_mode="std", eps=1e-7)`): the RMSE divided by
    the true frame's standard deviation (with eps added to the variance), averaged over samples and fields
    (over the `fluid` cells when given). A prediction equal to the true frame's mean scores about 1."""
    return vrmse_per_sample(prediction, truth, eps, fluid).mean(dim=(0, 2))
