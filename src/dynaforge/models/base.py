"""The contract every surrogate follows: named inputs and outputs, a shape spec, and a rollout helper.

Conventions:
- Frames are normalised (see `dynaforge.data.normalize`) and channels first: (batch, frames, C, *space).
- A model maps the last `history` frames to the next `horizon` frames; with `residual` it predicts the
  change from the last input frame, which starts training from "nothing changes" instead of from noise.
- The spatial domain is periodic; the models are resolution-independent (FNO up to its kept modes).
- `ModelShape.held` channels (a per-sample obstacle mask, boundary values) are inputs only: every output frame holds them as
  the last input frame has them, and the network predicts the other channels (`frames_prediction`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import ModelConfig
from dynaforge.errors import ConfigError


class ModelInput(NamedTuple):
    """What a surrogate is given: the last `history` normalised frames."""

    frames: Float[Tensor, "batch history channels *space"]


class ModelOutput(NamedTuple):
    """What a surrogate returns: the next `horizon` normalised frames."""

    frames: Float[Tensor, "batch horizon channels *space"]


class ModelShape(NamedTuple):
    """The data a model is built for; saved in checkpoints beside the model config."""

    channels: int
    """Physical channels per frame."""
    history: int
    """Input frames per call."""
    horizon: int
    """Output frames per call."""
    spatial_dims: int = 1
    """Spatial axes of a frame."""
    held: tuple[int, ...] = ()
    """Channels the model is given but does not predict: a per-sample input that does not change in time
    (the cylinder's `obstacle` mask, the boundary channels). Each output frame holds them as the last input
    frame has them."""
    boundary: tuple[str, ...] = ()
    """The boundary parameters given as the last `len(boundary)` channels, constant fields of each sample's
    value (`data.boundary_channels`, `dynaforge.data.boundary`); they are among `held`."""
    parameters: tuple[str, ...] = ()
    """The coefficients given as the channels after the boundary ones (`data.parameter_channels`): constant
    fields of each sample's value, 0 where the data has no such parameter; they are among `held`."""

    @property
    def in_channels(self) -> int:
        return self.history * self.channels

    @property
    def predicted_channels(self) -> tuple[int, ...]:
        """The channels the model predicts: every channel but the held ones, in order."""
        return tuple(c for c in range(self.channels) if c not in self.held)

    @property
    def out_channels(self) -> int:
        return self.horizon * len(self.predicted_channels)


def shape_from_dict(record: Mapping[str, Any]) -> ModelShape:
    """The shape a checkpoint records (`ModelShape._asdict()`; `held` may come back as a list)."""
    return ModelShape(
        **{
            **record,
            "held": tuple(int(c) for c in record.get("held", ())),
            "boundary": tuple(str(name) for name in record.get("boundary", ())),
            "parameters": tuple(str(name) for name in record.get("parameters", ())),
        }
    )


def check_input(inputs: ModelInput, shape: ModelShape) -> None:
    """Raise an error that says what was expected when the input frames do not fit the model."""
    frames = inputs.frames
    expected = (
        f"(batch, history={shape.history}, channels={shape.channels}, *space with {shape.spatial_dims} axes)"
    )
    if (
        frames.ndim != 3 + shape.spatial_dims
        or frames.shape[1] != shape.history
        or frames.shape[2] != shape.channels
    ):
        raise ConfigError(
            f"model input frames must be {expected}, got {tuple(frames.shape)}; "
            "a single sample needs a leading batch axis of 1 (frames[None])"
        )


def frames_to_stack(frames: Tensor) -> Tensor:
    """(B, F, C, *space) -> (B, F * C, *space): frames stacked as channels for a convolution."""
    return frames.flatten(1, 2)


def stack_to_frames(stack: Tensor, channels: int) -> Tensor:
    """(B, F * C, *space) -> (B, F, C, *space)."""
    return stack.unflatten(1, (stack.shape[1] // channels, channels))


def update_to_output(inputs: ModelInput, update: Tensor, residual: bool) -> ModelOutput:
    """The predicted frames: the last input frame plus `update` (B, horizon, C, *space), or `update` itself."""
    if residual:
        return ModelOutput(frames=inputs.frames[:, -1:] + update)
    return ModelOutput(frames=update)


def frames_prediction(
    inputs: ModelInput, shape: ModelShape, residual: bool, network: Callable[[Tensor], Tensor]
) -> ModelOutput:
    """The frames-model contract around `network`, which maps stacked input frames (B, history * C, *space)
    to a stacked update (B, horizon * C, *space): the inputs are checked, the update unstacked and, when
    `residual`, added to the last input frame."""
    check_input(inputs, shape)
    update = stack_to_frames(network(frames_to_stack(inputs.frames)), len(shape.predicted_channels))
    if not shape.held:
        return update_to_output(inputs, update, residual)
    return ModelOutput(frames=with_held_channels(inputs, update, shape, residual))


def with_held_channels(
    inputs: ModelInput,
    update: Float[Tensor, "batch horizon predicted *space"],
    shape: ModelShape,
    residual: bool,
) -> Float[Tensor, "batch horizon channels *space"]:
    """The output frames: the predicted channels from `update` (plus the last input frame's, when
    `residual`) and the held channels copied from the last input frame, in the data's channel order."""
    last = inputs.frames[:, -1:]
    horizon = update.shape[1]
    columns = []
    for channel in range(shape.channels):
        known = last[:, :, channel : channel + 1]
        if channel in shape.held:
            columns.append(known.expand(-1, horizon, *known.shape[2:]))
            continue
        position = shape.predicted_channels.index(channel)
        change = update[:, :, position : position + 1]
        columns.append(known + change if residual else change)
    return torch.cat(columns, dim=2)


def autoregressive_rollout(
    model: nn.Module, inputs: ModelInput, steps: int
) -> Float[Tensor, "batch predicted channels *space"]:
    """Call `model` `steps` times, each time on the last `history` frames known or predicted so far.

    Returns only the predicted frames (steps x horizon of them), never the input frames. Gradients flow
    through the whole unroll when called with grad enabled.
    """
    history = inputs.frames.shape[1]
    window = inputs.frames
    predicted = []
    for _ in range(steps):
        output: ModelOutput = model(ModelInput(frames=window))
        predicted.append(output.frames)
        window = torch.cat([window, output.frames], dim=1)[:, -history:]
    return torch.cat(predicted, dim=1)


def check_spatial_dims(shape: ModelShape, supported: Mapping[int, Any], model: str) -> None:
    """`model` (a name for the message) is built for the spatial axis counts `supported` holds."""
    if shape.spatial_dims not in supported:
        counts = ", ".join(str(n) for n in sorted(supported))
        raise ConfigError(f"{model} supports {counts} spatial axes, got {shape.spatial_dims}")


def zero_layer(layer: nn.Module) -> None:
    """Zero every parameter of `layer`: the output layer of a model that starts as "nothing changes" (a
    residual surrogate; the refiner's network, whose first prediction is then no change and no noise)."""
    for parameter in layer.parameters():
        nn.init.zeros_(parameter)


class GridModel(nn.Module):
    """A surrogate on periodic grids, built from its `model` section and the data's shape (kept as `config`
    and `shape`), for the spatial axis counts its layers exist for (`supported`; `name` in the message)."""

    def __init__(
        self, config: ModelConfig, shape: ModelShape, supported: Mapping[int, Any], name: str
    ) -> None:
        super().__init__()
        check_spatial_dims(shape, supported, name)
        self.config, self.shape = config, shape

    def output_layer(self) -> nn.Module | None:
        """The layer that writes the model's update, zeroed at the start of a residual model and of a
        refiner's network (`dynaforge.models.refiner.build_refiner`); None for a model without one such
        layer (it is then left as initialised)."""
        return None
