"""`dynaforge rollout --onnx` scores an obstacle dataset as `dynaforge evaluate` does: over the fluid cells and
the physical channels (its numpy nRMSE against the torch metric on the same arrays)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynaforge.export.onnx_rollout import nrmse_per_frame as onnx_nrmse
from dynaforge.metrics.fields import fluid_fields
from dynaforge.metrics.fields import nrmse_per_frame as torch_nrmse


def obstacle_arrays(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(3 samples, 4 frames, 3 channels (u, v, obstacle), 12 x 10) truth and a prediction that is badly
    wrong inside the obstacle only where it is, and mildly wrong in the fluid."""
    rng = np.random.default_rng(seed)
    truth = rng.normal(size=(3, 4, 3, 12, 10)).astype(np.float32)
    mask = np.zeros((3, 1, 1, 12, 10), dtype=np.float32)
    mask[:, :, :, 4:8, 3:6] = 1.0
    truth[:, :, 2:3] = np.broadcast_to(mask, truth[:, :, 2:3].shape)
    prediction = truth + 0.1 * rng.normal(size=truth.shape).astype(np.float32)
    prediction[:, :, :2] += 50.0 * np.broadcast_to(mask, prediction[:, :, :2].shape)  # inside: ignored
    prediction[:, :, 2:3] = truth[:, :, 2:3]  # the held mask
    return prediction, truth


def test_fluid_nrmse_matches_the_evaluator() -> None:
    prediction, truth = obstacle_arrays(0)
    ours = onnx_nrmse(prediction, truth, obstacle=2)
    wide = [torch.from_numpy(a.astype(np.float64)) for a in (prediction, truth)]  # ours computes in float64
    scored = fluid_fields(*wide, 2)
    theirs = torch_nrmse(scored.prediction, scored.truth).tolist()
    # the same float64 sums in a different order (numpy's norm against torch's): measured 2e-16 relative
    np.testing.assert_allclose(ours, theirs, rtol=1e-13)
    assert max(ours) < 0.2  # the error of 50 inside the obstacle counts nowhere


def test_without_the_mask_the_obstacle_dominates() -> None:
    prediction, truth = obstacle_arrays(1)
    assert min(onnx_nrmse(prediction, truth)) > 1.0


@pytest.mark.parametrize("obstacle", [None, 2])
def test_a_perfect_rollout_scores_zero(obstacle: int | None) -> None:
    _, truth = obstacle_arrays(2)
    assert onnx_nrmse(truth, truth, obstacle) == [0.0] * truth.shape[1]
