"""The fused engine of random CNN operators: one operator at a time, each layer two passes (CPU default).

`FusedOperators` steps K operators of one architecture one operator after the other: each operator's
network runs on its M realizations together, so that one layer's activations (M x width x n x n in
bfloat16, about 1.5 MB at M = 3, width 64, n = 64) stay in the core's cache for the next. Per layer:

    y = conv(wrap(h))                       bias-free convolution, bfloat16 channels-last (oneDNN, AMX)
    s1, s2 = mean y, mean y^2 per channel   one read of y, float32 accumulation
    group mean and variance                 (M, width) numbers; instance norm is groups of one channel
    h = act(y * scale + shift) (+ h)        one read of y (and h), one write of the next wrapped input

with the bias folded into the statistics (mean(y + b) = mean(y) + b) and into `shift`. Under
`torch.compile` (one graph per architecture, weights as inputs, reused by all operators of that
architecture) each of the two passes is one fused loop; without compile the same function runs op by op
(slower; same values up to float32 rounding order). The statistics pass through small matrix products
(`group_matrices`), which also keeps inductor from recomputing the reciprocal square root per element.

One operator at a time beats one grouped convolution over several because its activations stay in cache
(docs/random_cnn.md has the timings). Functions traced by torch.compile carry `@no_type_check`: the test
suite's runtime jaxtyping wrappers, which dynamo cannot trace, leave them alone.
"""

from __future__ import annotations

import functools
import itertools
import types
from collections.abc import Callable, Sequence
from typing import no_type_check

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import RandomCNNConfig
from dynaforge.systems.random_cnn.operator import (
    ACTIVATIONS,
    GROUP_CHANNELS,
    Architecture,
    Layer,
    OperatorEngine,
    adds_input,
    periodic_pad,
)

NORM_EPS = 1e-5
"""Epsilon of the normalisation (F.group_norm's default, as in the definition)."""


@no_type_check  # traced by torch.compile: no runtime type-checking wrapper (see module docstring)
def wrap_by_index(h: Tensor, kernel_size: int) -> Tensor:
    """Periodic padding as one gather (what inductor fuses into the producer of h); same values as periodic_pad."""
    p = kernel_size // 2
    if not p:
        return h
    n_x, n_y = h.shape[-2], h.shape[-1]
    rows = torch.remainder(torch.arange(-p, n_x + p, device=h.device), n_x)
    cols = torch.remainder(torch.arange(-p, n_y + p, device=h.device), n_y)
    return h[:, :, rows[:, None], cols[None, :]]


def group_matrices(width: int, group: int, device: torch.device | str) -> tuple[Tensor, Tensor]:
    """(average, expand): channel statistics @ average = group means (width x width/group); group values
    @ expand = per-channel values (width/group x width). Instance norm is group = 1 (identities)."""
    member = torch.arange(width, device=device) // group
    indicator = (member[None, :] == torch.arange(width // group, device=device)[:, None]).to(torch.float32)
    return indicator.T / group, indicator


@no_type_check  # traced by torch.compile: no runtime type-checking wrapper (see module docstring)
def normalize_act(
    y: Tensor, bias: Tensor, average: Tensor, expand: Tensor, act: Callable[[Tensor], Tensor]
) -> Tensor:
    """act(norm(y + bias)) in float32 for y of (M, w, n, n): group statistics from per-channel sums."""
    yf = y.to(torch.float32)
    cells = y.shape[-1] * y.shape[-2]
    s1 = yf.sum(dim=(2, 3)) / cells  # (M, w) mean of y
    s2 = (yf * yf).sum(dim=(2, 3)) / cells  # (M, w) mean of y^2
    mean = s1 + bias
    square = s2 + bias * (2.0 * s1 + bias)  # mean of (y + bias)^2
    group_mean = mean @ average
    group_var = (square @ average - group_mean * group_mean).clamp_min(0.0)
    inv_std = torch.rsqrt(group_var + NORM_EPS)
    scale, mean_scaled = (torch.stack([inv_std, group_mean * inv_std]) @ expand).unbind(0)  # (M, w) each
    shift = bias * scale - mean_scaled
    return act(yf * scale[:, :, None, None] + shift[:, :, None, None])


@no_type_check  # traced by torch.compile: no runtime type-checking wrapper (see module docstring)
def fused_operator_step(
    x: Float[Tensor, "m channels x y"],
    noise: Float[Tensor, "m channels x y"],
    weights: Sequence[Tensor],
    biases: Sequence[Tensor],
    norms: Sequence[tuple[Tensor, Tensor]],
    coefficients: Tensor,
    arch: Architecture,
    dtype: torch.dtype,
) -> Float[Tensor, "m channels x y"]:
    """x <- p x + q (O(x) + sigma xi) for one operator's M realizations; coefficients = (p, q, q sigma)."""
    act = ACTIVATIONS[arch.activation]
    wrap = wrap_by_index if torch.compiler.is_compiling() else periodic_pad
    k = arch.kernel_size
    cl = torch.channels_last
    h = wrap(x, k).to(dtype).contiguous(memory_format=cl)
    h = act(F.conv2d(h, weights[0]).to(torch.float32) + biases[0][:, None, None]).to(dtype)
    p = k // 2
    for weight, bias, (average, expand) in zip(weights[1:-1], biases[1:-1], norms, strict=True):
        wrapped = wrap(h, k)
        y = normalize_act(F.conv2d(wrapped, weight), bias, average, expand, act)
        if adds_input(arch, h, y):
            # h read back from the wrapped buffer the convolution needed anyway: under compile, reading
            # h itself would recompute it (and, layer after layer, the whole chain before it).
            y = y + wrapped[:, :, p : wrapped.shape[2] - p, p : wrapped.shape[3] - p].to(torch.float32)
        h = y.to(dtype)
    out = F.conv2d(h, weights[-1]).to(torch.float32) + biases[-1][:, None, None]
    return coefficients[0] * x + coefficients[1] * out + coefficients[2] * noise


_fresh_codes = itertools.count()


@functools.cache
def step_function(
    arch: Architecture, dtype: torch.dtype, compile: bool, threads: int = 1
) -> Callable[..., Tensor]:
    """`fused_operator_step` for one architecture, compiled (one graph, weights as inputs) on request.

    Cached per (arch, dtype, compile, threads), so every group of an architecture reuses one compiled
    graph. Inductor's CPU kernels are written for the intra-op thread count at compile time (their
    reductions split by it), so a graph is compiled, and reused, for one thread count only.
    """

    @no_type_check
    def step(
        x: Tensor,
        noise: Tensor,
        weights: list[Tensor],
        biases: list[Tensor],
        norms: list[tuple[Tensor, Tensor]],
        coefficients: Tensor,
    ) -> Tensor:
        return fused_operator_step(x, noise, weights, biases, norms, coefficients, arch, dtype)

    if not compile:
        return step
    # torch.compile keeps compiled graphs per code object, guarded on the closure (arch, dtype), and falls
    # back to eager after 8 of them; a code object per architecture keeps each one a single cache entry.
    code = step.__code__.replace(co_name=f"fused_step_{next(_fresh_codes)}")
    fresh = types.FunctionType(code, step.__globals__, code.co_name, step.__defaults__, step.__closure__)
    return torch.compile(fresh, dynamic=False, fullgraph=True)


class FusedOperators(OperatorEngine):
    """K operators sharing an architecture, stepped one operator at a time by one fused step function.

    The state is (K, M, C, n, n) float32. Weights are stored bias-free in `dtype` (channels-last), biases
    and policy coefficients in float32.
    """

    def store(self, layers: Sequence[Sequence[Layer]], coefficients: Tensor, config: RandomCNNConfig) -> None:
        """Per operator its bias-free weights (`dtype`, channels-last), biases and update coefficients
        (float32, each row its own storage); the step function compiled when `config.compile`."""
        device, dtype, cl = coefficients.device, self.dtype, torch.channels_last
        self.weights = [
            [layer.weight.to(device=device, dtype=dtype).contiguous(memory_format=cl) for layer in op_layers]
            for op_layers in layers
        ]
        self.biases = [
            [layer.bias.to(device=device, dtype=torch.float32) for layer in op_layers] for op_layers in layers
        ]
        group = GROUP_CHANNELS if self.arch.norm == "group" else 1  # instance norm: groups of one channel
        self.norms = [group_matrices(width, group, device) for width in self.arch.widths[1:]]
        self.coefficients = [row.clone() for row in coefficients]  # own storage each
        self.step_one = step_function(self.arch, dtype, config.compile, torch.get_num_threads())

    def step(
        self, x: Float[Tensor, "k m channels x y"], noise: Float[Tensor, "k m channels x y"]
    ) -> Float[Tensor, "k m channels x y"]:
        """x <- p x + q (O(x) + sigma xi) for every operator and realization."""
        return torch.stack(
            [
                self.step_one(
                    x[i], noise[i], self.weights[i], self.biases[i], self.norms, self.coefficients[i]
                )
                for i in range(self.k)
            ]
        )
