"""A continuous Hopfield network: the reference energy-based model of two-phase training.

Conventions. The network's units s (B, N) are `hidden` units followed by `outputs` units (N = hidden +
outputs); the input x (B, inputs) is clamped (it is not a unit, it drives them). Its energy is
    E(s; x) = 1/2 |s|^2 - 1/2 rho(s)^T W rho(s) - b^T rho(s) - rho(s)^T U x
with W symmetric and zero on the diagonal (the stored `weight` is symmetrised and masked, so any update
keeps it so), b the bias and U the input weights; rho is tanh or the logistic sigmoid. Its gradient in the
state is
    dE/ds = s - rho'(s) * (W rho(s) + b + U x),
so a fixed point of gradient descent on the state is s = rho'(s) * (W rho(s) + b + U x). The prediction is
the output units' state. Inputs `b + U x` (the drive) and W do not change during a relaxation, so they are
computed once per relaxation (`drive`, `coupling`) and each relaxation step costs one (B, N) x (N, N)
product.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import EnergyModelConfig


def tanh_and_slope(s: Tensor) -> tuple[Tensor, Tensor]:
    rho = torch.tanh(s)
    return rho, 1.0 - rho * rho


def sigmoid_and_slope(s: Tensor) -> tuple[Tensor, Tensor]:
    rho = torch.sigmoid(s)
    return rho, rho * (1.0 - rho)


ACTIVATIONS: dict[str, Callable[[Tensor], tuple[Tensor, Tensor]]] = {
    "tanh": tanh_and_slope,
    "sigmoid": sigmoid_and_slope,
}
"""Activation name -> (rho(s), rho'(s))."""


def hopfield_state_gradient(
    units: Float[Tensor, "batch units"],
    coupling: Float[Tensor, "units units"],
    drive: Float[Tensor, "batch units"],
    activation: str,
) -> Float[Tensor, "batch units"]:
    """dE/ds of the module docstring's energy, given W (`coupling`) and b + U x (`drive`)."""
    rho, slope = ACTIVATIONS[activation](units)
    return units - slope * (rho @ coupling + drive)


class HopfieldNet(nn.Module):
    """The continuous Hopfield network of the module docstring."""

    state_gradient_function = staticmethod(hopfield_state_gradient)
    """dE/ds from (units, coupling, drive, activation): what the two-phase relaxation calls every step."""

    def __init__(self, config: EnergyModelConfig, dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        self.config = config
        self.activation = config.activation
        self.inputs, self.hidden, self.outputs = config.inputs, config.hidden, config.outputs
        units = config.hidden + config.outputs
        self.units = units
        self.weight = nn.Parameter(torch.empty(units, units, dtype=dtype))
        self.input_weight = nn.Parameter(torch.empty(units, config.inputs, dtype=dtype))
        self.bias = nn.Parameter(torch.empty(units, dtype=dtype))
        self.register_buffer("off_diagonal", 1.0 - torch.eye(units, dtype=dtype))
        self.register_buffer(
            "output_mask", (torch.arange(units, dtype=torch.int64) >= config.hidden).to(dtype)
        )
        self.reset_parameters(config.init_scale)

    def reset_parameters(self, scale: float) -> None:
        """W ~ N(0, (scale / (2 sqrt(N)))^2) before symmetrising (spectral radius about scale / sqrt(2)),
        U ~ N(0, scale^2 / inputs), b ~ N(0, (scale / 10)^2)."""
        with torch.no_grad():
            self.weight.normal_(0.0, scale / (2.0 * math.sqrt(self.units)))
            self.input_weight.normal_(0.0, scale / math.sqrt(self.inputs))
            self.bias.normal_(0.0, scale / 10.0)

    def coupling(self) -> Float[Tensor, "units units"]:
        """W: the stored weight, symmetrised, with a zero diagonal."""
        return 0.5 * (self.weight + self.weight.T) * self.off_diagonal

    def drive(self, inputs: Float[Tensor, "batch inputs"]) -> Float[Tensor, "batch units"]:
        """b + U x, the clamped input's constant push on every unit."""
        return inputs @ self.input_weight.T + self.bias

    def energy(
        self, units: Float[Tensor, "batch units"], inputs: Float[Tensor, "batch inputs"]
    ) -> Float[Tensor, " batch"]:
        """E(s; x) per sample (differentiable in the parameters and in the state)."""
        rho, _ = ACTIVATIONS[self.activation](units)
        quadratic = 0.5 * (units * units).sum(-1)
        interaction = 0.5 * ((rho @ self.coupling()) * rho).sum(-1)
        return quadratic - interaction - (rho * self.drive(inputs)).sum(-1)

    def state_gradient(
        self, units: Float[Tensor, "batch units"], inputs: Float[Tensor, "batch inputs"]
    ) -> Float[Tensor, "batch units"]:
        """dE/ds, in closed form."""
        return self.state_gradient_function(units, self.coupling(), self.drive(inputs), self.activation)

    def initial_units(self, batch: int) -> Float[Tensor, "batch units"]:
        """Where every relaxation starts: all units at rest (s = 0)."""
        return torch.zeros(batch, self.units, dtype=self.weight.dtype, device=self.weight.device)

    def predict(self, units: Float[Tensor, "batch units"]) -> Float[Tensor, "batch outputs"]:
        """The output units' state."""
        return units[:, self.hidden :]

    def targets_to_units(self, targets: Float[Tensor, "batch outputs"]) -> Float[Tensor, "batch units"]:
        """Targets placed on the output units (zeros on the hidden ones), for the nudging force."""
        return torch.nn.functional.pad(targets, (self.hidden, 0))


ENERGY_MODELS: dict[str, type[HopfieldNet]] = {"hopfield": HopfieldNet}


def build_energy_model(config: EnergyModelConfig, dtype: torch.dtype = torch.float32) -> HopfieldNet:
    """A freshly initialised energy model named by `config.name` (seed the global generator first)."""
    return ENERGY_MODELS[config.name](config, dtype)
