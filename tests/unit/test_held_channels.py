"""A per-sample mask fixed in time (the cylinder's `obstacle` channel) reaches a surrogate as an input channel
and is not one of its outputs: `ModelShape.held` channels are copied from the last input frame into every
output frame (training, loss and rollout all see the true mask), and the network predicts only the others."""

from __future__ import annotations

import pytest
import torch

from dynaforge.config import FNOConfig, UNetConfig
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.models.base import shape_from_dict
from dynaforge.store.format import held_channels


@pytest.mark.parametrize(
    "config",
    [FNOConfig(width=8, modes=4, layers=2, projection=8), UNetConfig(channels=4, levels=2, padding="zeros")],
    ids=["fno", "unet"],
)
@pytest.mark.parametrize("residual", [True, False])
def test_a_held_channel_is_copied_from_the_last_input_frame_and_not_predicted(config, residual: bool) -> None:
    config = type(config)(**{**config.__dict__, "residual": residual})
    shape = ModelShape(channels=3, history=2, horizon=2, spatial_dims=2, held=(2,))
    model = build_model(config, shape)
    assert shape.predicted_channels == (0, 1) and shape.out_channels == 4  # 2 frames of u and v, no mask
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():  # weights away from the zero-initialised last layer, so that u changes
        for parameter in model.parameters():
            parameter.copy_(0.1 * torch.randn(parameter.shape, generator=generator))
    frames = torch.randn((3, 2, 3, 16, 8), generator=generator)
    frames[:, 0, 2] = 7.0  # an older frame's mask must not be the one held
    output = model(ModelInput(frames=frames)).frames
    assert output.shape == (3, 2, 3, 16, 8)
    assert torch.equal(output[:, :, 2], frames[:, -1:, 2].expand(-1, 2, -1, -1))
    assert not torch.equal(output[:, :, 0], frames[:, -1:, 0].expand(-1, 2, -1, -1))  # u is predicted
    rolled = autoregressive_rollout(model, ModelInput(frames=frames), steps=3)
    assert torch.equal(rolled[:, :, 2], frames[:, -1:, 2].expand(-1, 6, -1, -1))  # held through a rollout
    # The loss has no gradient through the held channel: it is the input's, whatever the weights.
    output[:, :, 2].sum().backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())


def test_the_held_channels_are_the_obstacle_channels_and_survive_a_checkpoint_record() -> None:
    assert held_channels(("u", "v", "obstacle")) == (2,)
    assert held_channels(("u", "v", "pressure")) == ()
    shape = ModelShape(channels=3, history=1, horizon=1, spatial_dims=2, held=(2,))
    recorded = {**shape._asdict(), "held": [2]}  # as JSON gives it back
    assert shape_from_dict(recorded) == shape
    assert shape_from_dict({k: v for k, v in shape._asdict().items() if k != "held"}).held == ()
