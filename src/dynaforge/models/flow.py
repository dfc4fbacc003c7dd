"""Conditional flow matching on the grid: the velocity network and its samplers.

Flow matching (Lipman et al. 2023; rectified flow, Liu et al. 2023) with the straight-line path: noise
x0 ~ N(0, I) at t = 0, data x1 at t = 1, x_t = (1 - t) x0 + t x1, and the network regresses the velocity
x1 - x0 at (x_t, t, condition). A sample integrates dx/dt = v(x, t) from fresh noise at t = 0 to t = 1
with S steps (Euler: first order; Heun: second order). The network sees the state divided by
`config.scale`, so that a small residual is generated at unit variance; `sample` scales back.

Used twice in the latent stack: as the residual corrector (the condition is the operator's prediction and
the last input frame; the sample is truth - prediction) and as the steady-state prior (no condition
frames; conditioned on the parameters alone).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Literal, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import FlowNetConfig
from dynaforge.errors import ConfigError
from dynaforge.models.base import GridModel, ModelShape

CONV = {1: nn.Conv1d, 2: nn.Conv2d}
TIME_FREQUENCIES = 8
"""Sinusoidal features of the flow time: frequencies 1, 2, 4, ... times pi."""

Velocity = Callable[[Tensor, Tensor], Tensor]
"""v(x, t): x (B, C, *space), t (B,) -> (B, C, *space)."""


class FlowInput(NamedTuple):
    """A point on the flow and what it is conditioned on (all normalised)."""

    state: Float[Tensor, "batch channels *space"]
    time: Float[Tensor, " batch"]
    condition: Float[Tensor, "batch frames channels *space"]
    params: Float[Tensor, "batch parameters"]


class FlowOutput(NamedTuple):
    velocity: Float[Tensor, "batch channels *space"]


def time_features(time: Tensor) -> Tensor:
    """(B,) -> (B, 2 * TIME_FREQUENCIES + 1): t, sin and cos of 2^j pi t."""
    k = math.pi * 2.0 ** torch.arange(TIME_FREQUENCIES, dtype=time.dtype, device=time.device)
    angle = time[:, None] * k
    return torch.cat([time[:, None], torch.sin(angle), torch.cos(angle)], dim=-1)


class FlowBlock(nn.Module):
    """x + conv(gelu(film(norm(x)))), the norm shifted and scaled by the flow time and parameters."""

    def __init__(self, width: int, kernel_size: int, dims: int) -> None:
        super().__init__()
        self.norm = nn.GroupNorm(1, width, affine=False)
        self.film = nn.Linear(width, 2 * width)
        self.conv = CONV[dims](width, width, kernel_size, padding=kernel_size // 2, padding_mode="circular")
        self.mix = CONV[dims](width, width, 1)

    def forward(self, x: Tensor, embedding: Float[Tensor, "batch width"]) -> Tensor:
        scale, shift = self.film(embedding).chunk(2, dim=-1)
        view = (*scale.shape, *(1,) * (x.ndim - 2))
        h = self.norm(x) * (1 + scale.view(view)) + shift.view(view)
        return x + self.mix(nn.functional.gelu(self.conv(nn.functional.gelu(h))))


class FlowNet(GridModel):
    """The velocity network v(x_t, t | condition frames, parameters) on periodic grids (1 or 2 axes)."""

    config: FlowNetConfig

    def __init__(self, config: FlowNetConfig, shape: ModelShape) -> None:
        super().__init__(config, shape, CONV, "the flow network")
        dims, width, channels = shape.spatial_dims, config.width, shape.channels
        conv = CONV[dims]
        k = config.kernel_size
        self.lift = conv(
            channels * (1 + config.condition_frames), width, k, padding=k // 2, padding_mode="circular"
        )
        self.embed = nn.Sequential(
            nn.Linear(2 * TIME_FREQUENCIES + 1 + config.parameters, width), nn.SiLU(), nn.Linear(width, width)
        )
        self.blocks = nn.ModuleList(FlowBlock(width, k, dims) for _ in range(config.layers))
        self.project = conv(width, channels, 1)

    def forward(self, inputs: FlowInput) -> FlowOutput:
        state, condition = inputs.state, inputs.condition
        expected = (self.config.condition_frames, self.shape.channels)
        if state.ndim != 2 + self.shape.spatial_dims or tuple(condition.shape[1:3]) != expected:
            raise ConfigError(
                f"flow input state must be (batch, {self.shape.channels}, *space) and condition (batch, "
                f"{expected[0]}, {expected[1]}, *space); got {tuple(state.shape)} and {tuple(condition.shape)}"
            )
        stacked = torch.cat([state[:, None], condition], dim=1).flatten(1, 2)
        embedding = self.embed(torch.cat([time_features(inputs.time.to(state.dtype)), inputs.params], dim=-1))
        hidden = self.lift(stacked)
        for block in self.blocks:
            hidden = block(hidden, embedding)
        return FlowOutput(velocity=self.project(hidden))


def flow_velocity(model: nn.Module, condition: Tensor, params: Tensor) -> Velocity:
    """v(x, t) of a FlowNet with its condition frames and parameters bound."""

    def velocity(x: Tensor, t: Tensor) -> Tensor:
        return model(FlowInput(state=x, time=t, condition=condition, params=params)).velocity

    return velocity


def integrate_flow(
    velocity: Velocity, noise: Tensor, steps: int, method: Literal["euler", "heun"] = "euler"
) -> Tensor:
    """x(1) of dx/dt = velocity(x, t), x(0) = noise, with `steps` equal steps of Euler or Heun."""
    if steps < 1:
        raise ConfigError(f"steps must be >= 1, got {steps}")
    x = noise
    h = 1.0 / steps
    for i in range(steps):
        t = torch.full((x.shape[0],), i * h, dtype=x.dtype, device=x.device)
        v = velocity(x, t)
        if method == "heun":
            v_end = velocity(x + h * v, t + h)
            v = 0.5 * (v + v_end)
        x = x + h * v
    return x


def sample(
    model: nn.Module,
    noise: Float[Tensor, "batch channels *space"],
    condition: Float[Tensor, "batch frames channels *space"],
    params: Float[Tensor, "batch parameters"],
    steps: int,
    method: Literal["euler", "heun"] = "euler",
) -> Float[Tensor, "batch channels *space"]:
    """A sample of the flow model from `noise` (normalised units, scaled back by `config.scale`)."""
    x1 = integrate_flow(flow_velocity(model, condition, params), noise, steps, method)
    return x1 * model.config.scale
