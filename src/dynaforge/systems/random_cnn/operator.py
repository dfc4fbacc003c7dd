"""One random operator: its parameters (decoded from the `OperatorSpace`), architecture, weights and update
policy, and the layer pieces every engine shares (activations, periodic padding, normalisation).
The definition of the operators is in the package docstring (`dynaforge.systems.random_cnn`)."""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, no_type_check

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import OperatorSpace, RandomCNNConfig
from dynaforge.errors import ConfigError
from dynaforge.systems.random_cnn.sampling import decode_value, space_dimensions

ACTIVATIONS: dict[str, Callable[[Tensor], Tensor]] = {
    "gelu": F.gelu,
    "silu": F.silu,
    "relu": F.relu,
    "tanh": torch.tanh,
}
GROUP_CHANNELS = 8
"""Channels per group of the `group` normalisation."""
BIAS_STD = 0.1
OPERATOR_STREAM = 2
"""Spawn-key tag of operator seeds, apart from the per-row seeds and the Sobol scrambling seed."""
INTEGER_CHOICES = ("stem_width", "width_cap", "kernel_size")
"""Choice dimensions whose option names are integers."""


class OperatorParams(NamedTuple):
    """One operator's decoded parameters (see `OperatorSpace`)."""

    depth: int
    stem_width: int
    width_cap: int
    kernel_size: int
    block: str
    norm: str
    activation: str
    weight_gain: float
    noise_scale: float
    policy: str
    residual_dt: float
    convex_alpha: float

    @classmethod
    def from_values(cls, space: OperatorSpace, values: Sequence[float] | np.ndarray) -> OperatorParams:
        decoded: dict[str, Any] = {}
        for (name, spec), value in zip(space_dimensions(space), values, strict=True):
            item = decode_value(spec, float(value))
            decoded[name] = int(item) if name in INTEGER_CHOICES else item
        return cls(**decoded)


class Architecture(NamedTuple):
    """What operators must share to run as one grouped convolution."""

    channels: int
    widths: tuple[int, ...]
    kernel_size: int
    block: str
    norm: str
    activation: str


class Layer(NamedTuple):
    weight: Tensor  # (out, in, k, k)
    bias: Tensor  # (out,)


def architecture_of(op: OperatorParams, channels: int) -> Architecture:
    stem = min(op.stem_width, op.width_cap)
    widths = (stem, *(min(stem * 2 ** (layer + 1), op.width_cap) for layer in range(op.depth)))
    if op.kernel_size % 2 != 1:
        raise ConfigError(f"kernel_size must be odd, got {op.kernel_size}")
    if op.norm == "group" and any(w % GROUP_CHANNELS for w in widths):
        raise ConfigError(f"group norm needs widths divisible by {GROUP_CHANNELS}, got {widths}")
    if op.activation not in ACTIVATIONS:
        raise ConfigError(f"unknown activation {op.activation!r}; valid: {', '.join(ACTIVATIONS)}")
    return Architecture(channels, widths, op.kernel_size, op.block, op.norm, op.activation)


def operator_weights(arch: Architecture, gain: float, seed: int) -> list[Layer]:
    """Stem, hidden and head weights (float32) drawn from torch.Generator(seed), layer by layer."""
    generator = torch.Generator().manual_seed(seed % 2**63)
    k = arch.kernel_size
    shapes = [(arch.widths[0], arch.channels, k, k)]
    shapes += [(w_out, w_in, k, k) for w_in, w_out in zip(arch.widths[:-1], arch.widths[1:])]
    shapes.append((arch.channels, arch.widths[-1], 1, 1))
    layers = []
    for shape in shapes:
        fan_in = shape[1] * shape[2] * shape[3]
        weight = torch.randn(shape, generator=generator, dtype=torch.float32) * (gain / math.sqrt(fan_in))
        bias = torch.randn(shape[0], generator=generator, dtype=torch.float32) * BIAS_STD
        layers.append(Layer(weight, bias))
    return layers


def policy_coefficients(op: OperatorParams) -> tuple[float, float]:
    """(p, q) of the update x <- p x + q O(x)."""
    if op.policy == "autoregressive":
        return 0.0, 1.0
    if op.policy == "residual":
        return 1.0, op.residual_dt
    if op.policy == "convex":
        return op.convex_alpha, 1.0 - op.convex_alpha
    raise ConfigError(f"unknown policy {op.policy!r}; valid: autoregressive, residual, convex")


def update_coefficients(
    ops: Sequence[OperatorParams], device: torch.device | str = "cpu"
) -> Float[Tensor, "k 3"]:
    """Per operator the numbers of its update x <- p x + q (O(x) + sigma xi): rows (p, q, q sigma), float32."""
    rows = []
    for op in ops:
        p, q = policy_coefficients(op)
        rows.append((p, q, q * op.noise_scale))
    return torch.tensor(rows, dtype=torch.float32, device=device)


class OperatorEngine:
    """K operators sharing an architecture, set up for one way of stepping them (`config.engine` names the
    subclass: `grouped.ENGINES`): `arch`, `k` and the convolutions' `dtype` here; the weights and the
    update coefficients are stored by the subclass in its own layout (`store`)."""

    def __init__(
        self,
        arch: Architecture,
        ops: Sequence[OperatorParams],
        layers: Sequence[Sequence[Layer]],
        config: RandomCNNConfig,
        dtype: torch.dtype = torch.bfloat16,
        device: torch.device | str = "cpu",
    ) -> None:
        self.arch = arch
        self.k = len(ops)
        self.dtype = dtype
        self.store(layers, update_coefficients(ops, device), config)

    def store(self, layers: Sequence[Sequence[Layer]], coefficients: Tensor, config: RandomCNNConfig) -> None:
        """Keep the K operators' `layers` and update `coefficients` (K, 3) on the coefficients' device."""
        raise NotImplementedError


@no_type_check  # traced by torch.compile in the fused engine: no runtime type-checking wrapper
def adds_input(arch: Architecture, h: Tensor, y: Tensor) -> bool:
    """Whether a hidden layer adds its input h to its output y: a residual block whose width is unchanged."""
    return arch.block == "residual" and y.shape == h.shape


def noise_generator(row_seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(row_seed) % 2**63)


def periodic_pad(h: Tensor, kernel_size: int) -> Tensor:
    """Wrap-around padding of the two spatial axes by kernel_size // 2, keeping the memory layout.

    Same values as F.pad(mode="circular"), which returns a contiguous tensor for a channels-last input
    (then reordered again by the convolution) and measured 2-3x slower here.
    """
    p = kernel_size // 2
    if not p:
        return h
    h = torch.cat([h[:, :, -p:], h, h[:, :, :p]], dim=2)
    return torch.cat([h[..., -p:], h, h[..., :p]], dim=3)


def normalize(h: Tensor, norm: str, groups_of_operators: int) -> Tensor:
    """Instance or group norm over (M, K w, n, n); statistics never mix operators or realizations."""
    width = h.shape[1] // groups_of_operators
    per_operator = width if norm == "instance" else width // GROUP_CHANNELS
    return F.group_norm(h, groups_of_operators * per_operator)
