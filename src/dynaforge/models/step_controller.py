"""The learned N-body step controller: permutation-invariant system features in, a positive step out.

The network predicts log(h / T0), h the step and T0 the system's initial time scale, as a correction of
the classical criterion h = eta0 * tau (tau the classical time scale, feature `classical_feature`):

    log(h / T0) = log(tau / T0) + log(eta0) + c * tanh((linear(x) + mlp(x)) / c),

a linear (power-law) path plus an MLP, bounded to a factor exp(+-c) (`correction`) around the classical
step, so a trained controller cannot stray far from a criterion known to be sound on systems unlike its
training set. The step exp(.) is positive by construction; a soft clamp keeps log(h / T0) within
+-`LOG_STEP_LIMIT` so exp never overflows (it is the identity well inside that range). Both paths start
at zero, so an untrained controller behaves like `adaptive` control with eta = eta0.
Features are computed by `dynaforge.systems.nbody.control.controller_features`; `LearnedStep` is the
controller (the `StepController` protocol of `dynaforge.systems.nbody.control`) a trained net makes.
`dynaforge.models.loading` loads trained ones (`load_learned_controller`, `controller_for`).
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.errors import ConfigError
from dynaforge.systems.nbody.control import FEATURE_NAMES, ControlContext, controller_features, system_scales
from dynaforge.systems.nbody.physics import BodyParams, BodyState, Gravity

LOG_STEP_LIMIT = 30.0
INITIAL_ETA = 0.02


class StepControllerInput(NamedTuple):
    features: Float[Tensor, "batch features"]
    history: Float[Tensor, "batch k features"] | None = None
    """Features of the last K states, most recent first, zeros before the start of the run."""


class StepControllerOutput(NamedTuple):
    log_step: Float[Tensor, " batch"]
    """log(h / T0)."""


class StepControllerNet(nn.Module):
    """A bounded correction of the classical step from an MLP with a linear skip path reading features (and
    optionally their history); see the module docstring."""

    def __init__(
        self,
        features: int,
        hidden: int = 64,
        layers: int = 2,
        history: int = 0,
        classical_feature: int = 0,
        correction: float = 2.0,
        inputs: list[int] | None = None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        super().__init__()
        if correction <= 0:
            raise ConfigError(f"correction must be > 0 (a log factor), got {correction}")
        selected = list(range(features)) if inputs is None else [int(i) for i in inputs]
        if (
            not selected
            or min(selected) < 0
            or max(selected) >= features
            or len(set(selected)) < len(selected)
        ):
            raise ConfigError(f"inputs must be distinct feature indices in [0, {features}), got {inputs}")
        self.config = {
            "features": features,
            "hidden": hidden,
            "layers": layers,
            "history": history,
            "classical_feature": classical_feature,
            "correction": correction,
            "inputs": selected,
        }
        # The features the network reads (the classical time scale is added to its output whatever it reads).
        self.register_buffer("reads", torch.tensor(selected, dtype=torch.int64), persistent=False)
        width = len(selected) * (1 + history)
        self.linear = nn.Linear(width, 1, dtype=dtype)
        blocks: list[nn.Module] = []
        for _ in range(layers):
            blocks += [nn.Linear(width, hidden, dtype=dtype), nn.SiLU()]
            width = hidden
        last = nn.Linear(width, 1, dtype=dtype)
        blocks.append(last)
        self.mlp = nn.Sequential(*blocks)
        # A tensor of the network's dtype, not a Python float: the ONNX exporter stores Python scalars as
        # float32 constants, which would shift every exported float64 step by ~1e-8.
        self.register_buffer("log_eta", torch.tensor(math.log(INITIAL_ETA), dtype=dtype), persistent=False)
        with torch.no_grad():
            # Start from the classical criterion (see the module docstring); deliberate in-place init.
            self.linear.weight.zero_()
            self.linear.bias.zero_()
            last.weight.zero_()
            last.bias.zero_()

    @property
    def history(self) -> int:
        return int(self.config["history"])

    def forward(self, inputs: StepControllerInput) -> StepControllerOutput:
        x = inputs.features.index_select(1, self.reads)
        if self.history:
            if inputs.history is None:
                raise ConfigError(
                    f"this controller reads a history of {self.history} states; pass history (batch, {self.history}, features)"
                )
            x = torch.cat([x, inputs.history.index_select(2, self.reads).flatten(1)], dim=1)
        limit = float(self.config["correction"])
        correction = limit * torch.tanh((self.linear(x) + self.mlp(x)).squeeze(-1) / limit)
        classical = inputs.features[:, int(self.config["classical_feature"])]
        raw = classical + self.log_eta + correction
        return StepControllerOutput(soft_clamp(raw, LOG_STEP_LIMIT))


def soft_clamp(x: Tensor, limit: float) -> Tensor:
    """x inside (-limit, limit) (identity to ~exp(-limit / 2) for |x| < limit / 2), smooth, with gradient."""
    return x - softplus(x - limit) + softplus(-limit - x)


def softplus(y: Tensor) -> Tensor:
    """log(1 + exp(y)) as relu(y) + log(1 + exp(-|y|)): overflow-free, and built from operators that
    onnxruntime runs in float64 (its Softplus kernel has no float64 version), so the exported controller
    is this very function."""
    return torch.relu(y) + torch.log(1.0 + torch.exp(-torch.abs(y)))


def build_step_controller_net(
    config: dict[str, Any], dtype: torch.dtype = torch.float64
) -> StepControllerNet:
    """Rebuild a network from the `config` dict stored in its checkpoint."""
    return StepControllerNet(
        features=int(config["features"]),
        hidden=int(config["hidden"]),
        layers=int(config["layers"]),
        history=int(config["history"]),
        classical_feature=int(config["classical_feature"]),
        correction=float(config.get("correction", 2.0)),
        inputs=config.get("inputs"),
        dtype=dtype,
    )


class LearnedStep:
    """h = scale * T0 * exp(net(features, history)); differentiable (training runs through it).

    `scale` is a number or (batch,).
    """

    def __init__(self, net: StepControllerNet, scale: float | Tensor = 1.0) -> None:
        self.net = net
        self.scale = scale

    def init(self, state: BodyState, current: Gravity, params: BodyParams) -> ControlContext:
        scales = system_scales(state, params, current.potential)
        history = None
        if self.net.history:
            shape = (state.positions.shape[0], self.net.history, len(FEATURE_NAMES))
            history = torch.zeros(shape, dtype=state.positions.dtype, device=state.positions.device)
        return ControlContext(scales, history)

    def step_size(
        self, state: BodyState, current: Gravity, params: BodyParams, context: ControlContext
    ) -> tuple[Tensor, ControlContext]:
        features = controller_features(state, current, params, context.scales)
        output = self.net(StepControllerInput(features, context.history))
        h = self.scale * context.scales.time * torch.exp(output.log_step)
        history = context.history
        if history is not None:
            history = torch.cat([features.unsqueeze(1), history[:, :-1]], dim=1)
        return h, ControlContext(context.scales, history, features)
