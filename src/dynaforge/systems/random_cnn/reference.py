"""The straightforward way to run a random operator: one operator at a time in eager float32, realizations
batched. It is the definition the fast engines are checked against."""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.systems.random_cnn.operator import (
    ACTIVATIONS,
    Architecture,
    Layer,
    OperatorParams,
    adds_input,
    normalize,
    periodic_pad,
    policy_coefficients,
)


class RandomCNN(nn.Module):
    """One random operator as a plain module (float32); `forward` is O(x) without the noise."""

    def __init__(self, arch: Architecture, layers: Sequence[Layer]) -> None:
        super().__init__()
        self.arch = arch
        self.weights = nn.ParameterList([nn.Parameter(layer.weight, requires_grad=False) for layer in layers])
        self.biases = nn.ParameterList([nn.Parameter(layer.bias, requires_grad=False) for layer in layers])

    def forward(self, x: Float[Tensor, "batch channels x y"]) -> Float[Tensor, "batch channels x y"]:
        act = ACTIVATIONS[self.arch.activation]
        k = self.arch.kernel_size
        h = act(F.conv2d(periodic_pad(x, k), self.weights[0], self.biases[0]))
        for weight, bias in zip(self.weights[1:-1], self.biases[1:-1]):
            y = act(normalize(F.conv2d(periodic_pad(h, k), weight, bias), self.arch.norm, 1))
            h = h + y if adds_input(self.arch, h, y) else y
        return F.conv2d(h, self.weights[-1], self.biases[-1])


def reference_rollout(
    module: RandomCNN,
    op: OperatorParams,
    initial: Float[Tensor, "channels x y"],
    generators: Sequence[torch.Generator],
    steps: int,
    save_every: int = 1,
    dtype: torch.dtype = torch.float32,
) -> Float[Tensor, "realizations time channels x y"]:
    """All realizations of one operator, eager float32: the definition of a trajectory.

    `dtype=torch.float64` (with a float64 `module`) gives the same trajectory with less rounding, a reference
    for judging float32 engines; the noise is drawn in float32 either way, so both see the same noise.
    """
    p, q = policy_coefficients(op)
    m = len(generators)
    x = initial.to(dtype).expand(m, *initial.shape).contiguous()
    frames = [x]
    module.eval()
    with torch.inference_mode():
        for n in range(1, steps + 1):
            noise = torch.stack(
                [torch.randn(initial.shape, generator=g, dtype=torch.float32) for g in generators]
            ).to(device=x.device, dtype=dtype)
            x = p * x + q * (module(x) + op.noise_scale * noise)
            if n % save_every == 0:
                frames.append(x)
    return torch.stack(frames, dim=1)
