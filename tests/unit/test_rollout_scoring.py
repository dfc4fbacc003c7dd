"""Through the evaluation's own rollout code: the scores cover the predicted frames and never the inputs.

A persistence model (it repeats the last input frame) makes every predicted frame's error known by hand:
frame k after the inputs is compared with the last input frame, so no predicted frame has zero error,
whereas an input frame scored against itself would.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from dynaforge.data import Normalizer
from dynaforge.evaluate.rollout import one_step_predictions, rollouts
from dynaforge.evaluate.suite import MetricSettings, score_predictions, score_rollouts
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.models import ModelInput, ModelOutput, ModelShape


class Persistence(nn.Module):
    """Predicts that nothing changes: the last input frame, `horizon` times."""

    def __init__(self, horizon: int) -> None:
        super().__init__()
        self.horizon = horizon

    def forward(self, inputs: ModelInput) -> ModelOutput:
        return ModelOutput(frames=inputs.frames[:, -1:].repeat(1, self.horizon, 1, 1))


def trajectories() -> np.ndarray:
    """(N, T, X, C): u_t = (t + 1) * sin(2 pi x + sample), so each frame differs from the last."""
    x = np.arange(16) / 16
    t = np.arange(8)
    phase = np.arange(3)[:, None, None]
    fields = (t[None, :, None] + 1.0) * np.sin(2 * np.pi * x[None, None, :] + phase)
    return fields[..., None].astype(np.float32)


@pytest.mark.parametrize("horizon", [1, 2])
def test_rollout_scores_start_after_the_input_frames(horizon: int) -> None:
    fields = trajectories()
    shape = ModelShape(channels=1, history=2, horizon=horizon, spatial_dims=1)
    rolled = rollouts(
        Persistence(horizon), Normalizer([0.3], [2.0]), fields, shape, 1, 0, 4, 2, torch.device("cpu")
    )
    truth = torch.from_numpy(fields).movedim(-1, 2)
    torch.testing.assert_close(rolled.inputs, truth[:, :2])
    torch.testing.assert_close(rolled.truth, truth[:, 2:6])
    # Persistence of frame 1: |(k + 1) - 2| / (k + 1) at frames k = 2 .. 5.
    expected = torch.tensor([(k + 1 - 2) / (k + 1) for k in range(2, 6)], dtype=torch.float32)
    torch.testing.assert_close(nrmse_per_frame(rolled.predicted, rolled.truth), expected)
    scores = score_rollouts(rolled, MetricSettings(lengths=(1.0,)))
    assert scores["curves"]["nrmse"] == pytest.approx(expected.tolist(), rel=1e-5)
    assert min(scores["curves"]["rmse"]) > 0  # an input frame scored against itself would give 0


def test_one_step_scores_start_after_the_input_frames() -> None:
    fields = trajectories()
    shape = ModelShape(channels=1, history=2, horizon=1, spatial_dims=1)
    one_step = one_step_predictions(
        Persistence(1), Normalizer.identity(1), fields, shape, 1, 4, torch.device("cpu")
    )
    assert one_step.predicted.shape == (3 * 6, 1, 1, 16)  # windows start at frames 0 .. 5
    # Window s predicts frame s + 2 from frame s + 1: nRMSE 1 / (s + 3), averaged over s = 0 .. 5.
    expected = float(np.mean([1 / (s + 3) for s in range(6)]))
    scores = score_predictions(one_step, MetricSettings(lengths=(1.0,)))
    assert scores["nrmse"] == pytest.approx(expected, rel=1e-5)
