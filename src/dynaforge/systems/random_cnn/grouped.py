"""Running many operators: the grouped engine (K operators of one architecture as grouped convolutions, the
GPU layout), the rollout of a group, and the generation of a batch of operators (one at a time on the CPU,
grouped to a memory budget on a GPU)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import RandomCNNConfig
from dynaforge.floating import flush_denormals
from dynaforge.machine import has_bf16_matrix_units
from dynaforge.systems.batching import trajectory_buffer
from dynaforge.systems.random_cnn.fused import FusedOperators
from dynaforge.systems.random_cnn.operator import (
    ACTIVATIONS,
    Architecture,
    Layer,
    OperatorEngine,
    OperatorParams,
    adds_input,
    architecture_of,
    normalize,
    periodic_pad,
)
from dynaforge.threads import run_pieces, serialised

log = logging.getLogger(__name__)


class GroupedOperators(OperatorEngine):
    """K operators sharing an architecture, stacked as grouped-convolution weights.

    The state of the group is (M, K C, n, n): realizations on the batch axis, operator k's channels at
    [k C, (k + 1) C). Convolutions run in `dtype` (bfloat16 or float32), channels-last on request.
    """

    def store(self, layers: Sequence[Sequence[Layer]], coefficients: Tensor, config: RandomCNNConfig) -> None:
        """Layer i of every operator concatenated along the output channels (one grouped convolution), in
        `dtype` (channels-last when `config.channels_last`); the coefficients repeated per channel."""
        device = coefficients.device
        self.memory_format = torch.channels_last if config.channels_last else torch.contiguous_format
        self.weights = [
            torch.cat([layer[i].weight for layer in layers])
            .to(device=device, dtype=self.dtype)
            .contiguous(memory_format=self.memory_format)
            for i in range(len(layers[0]))
        ]
        self.biases = [
            torch.cat([layer[i].bias for layer in layers]).to(device=device, dtype=self.dtype)
            for i in range(len(layers[0]))
        ]
        per_channel = coefficients.repeat_interleave(self.arch.channels, dim=0)  # (K C, 3)
        self.p, self.q, self.q_sigma = (column.view(1, -1, 1, 1) for column in per_channel.unbind(1))

    def apply(self, x: Float[Tensor, "m kc x y"]) -> Float[Tensor, "m kc x y"]:
        """O(x) of every operator without the noise, returned in float32."""
        act = ACTIVATIONS[self.arch.activation]
        k = self.arch.kernel_size
        h = x.to(self.dtype).contiguous(memory_format=self.memory_format)
        h = act(F.conv2d(periodic_pad(h, k), self.weights[0], self.biases[0], groups=self.k))
        for weight, bias in zip(self.weights[1:-1], self.biases[1:-1]):
            y = act(
                normalize(F.conv2d(periodic_pad(h, k), weight, bias, groups=self.k), self.arch.norm, self.k)
            )
            h = h + y if adds_input(self.arch, h, y) else y
        return F.conv2d(h, self.weights[-1], self.biases[-1], groups=self.k).float()

    def step(
        self, x: Float[Tensor, "k m channels x y"], noise: Float[Tensor, "k m channels x y"]
    ) -> Float[Tensor, "k m channels x y"]:
        """x <- p x + q (O(x) + sigma xi) for every operator and realization."""
        k, m, c = x.shape[:3]
        x = x.transpose(0, 1).reshape(m, k * c, *x.shape[3:])
        noise = noise.transpose(0, 1).reshape(m, k * c, *noise.shape[3:])
        out = self.p * x + self.q * self.apply(x) + self.q_sigma * noise
        return out.view(m, k, c, *x.shape[2:]).transpose(0, 1)


ENGINES: dict[str, type[OperatorEngine]] = {"fused": FusedOperators, "grouped": GroupedOperators}
"""`system.engine` -> the class that steps a group of operators."""


@runtime_checkable
class OperatorGroup(Protocol):
    """K operators of one architecture that step together (`GroupedOperators`, `FusedOperators`)."""

    k: int

    def step(self, x: Tensor, noise: Tensor) -> Tensor: ...


def conv_precision(config: RandomCNNConfig, device: torch.device | str) -> str:
    """`config.precision`, with `auto` resolved for `device`: bfloat16 with bf16 matrix units, else float32."""
    if config.precision != "auto":
        return config.precision
    return "bfloat16" if has_bf16_matrix_units(device) else "float32"


def conv_dtype(config: RandomCNNConfig, device: torch.device | str) -> torch.dtype:
    return torch.bfloat16 if conv_precision(config, device) == "bfloat16" else torch.float32


def build_group(
    arch: Architecture,
    ops: Sequence[OperatorParams],
    layers: Sequence[Sequence[Layer]],
    config: RandomCNNConfig,
    device: torch.device | str = "cpu",
) -> OperatorGroup:
    """The engine `config.engine` for K operators of one architecture (what generation runs)."""
    return ENGINES[config.engine](arch, ops, layers, config, conv_dtype(config, device), device)


def grouped_rollout(
    group: OperatorGroup,
    initial: Float[Tensor, "k channels x y"],
    generators: Sequence[Sequence[torch.Generator]],
    steps: int,
    save_every: int = 1,
    on_step: Callable[[int], Any] | None = None,
    out: Sequence[Tensor] | None = None,
) -> Float[Tensor, "k m time channels x y"] | Sequence[Float[Tensor, "m time channels x y"]]:
    """Every operator and realization of a group; generators[k][m] is the noise of operator k, realization m.

    Returns a new (K, M, T, C, n, n) float32 buffer of trajectories, or, when `out` holds K (M, T, C, n, n)
    tensors on the state's device, writes each operator's trajectory into its tensor frame by frame (so the
    caller's buffer needs no copy afterwards) and returns `out`.
    """
    k, c = initial.shape[0], initial.shape[1]
    m = len(generators[0])
    space = tuple(initial.shape[2:])
    device = initial.device
    n_frames = steps // save_every + 1
    with torch.inference_mode(), flush_denormals():  # every state an inference tensor, from the first
        # Preallocated buffers, filled in place on purpose: the trajectories and the noise of one step.
        buffer = None
        if out is None:
            buffer = trajectory_buffer((k, m, n_frames, c, *space), torch.float32, device)
        trajectories = buffer.unbind(0) if buffer is not None else out
        if len(trajectories) != k or any(t.shape != (m, n_frames, c, *space) for t in trajectories):
            # The caller's own buffer (generate passes one it sized): a bug if hit.
            raise ValueError(f"out must hold {k} trajectories of shape {(m, n_frames, c, *space)}")
        noise = torch.empty((k, m, c, *space), dtype=torch.float32, device=device)
        draw = NoiseDraws(generators, noise)
        x = initial.to(device=device, dtype=torch.float32)[:, None].expand(k, m, c, *space).contiguous()
        save_frame(trajectories, x, 0)
        for n in range(1, steps + 1):
            draw.next_into_noise()
            x = group.step(x, noise)
            if n % save_every == 0:
                save_frame(trajectories, x, n // save_every)
            if on_step is not None:
                on_step(k * m)
    return buffer if buffer is not None else out


class NoiseDraws:
    """Each step's noise from the CPU generators (the same noise on every device), one generator per
    (operator, realization): drawn in place on the CPU; for a GPU, drawn on all the process's threads (one
    generator per piece: the same values whatever the thread count) into one of two pinned host buffers and
    copied over asynchronously, so the CPU draws step n + 1 while the GPU runs step n (measured on an H200,
    64 operators x 3 realizations x 128^2: drawing on one thread into a pageable buffer bounded generation,
    1.37x the straightforward loop at 0.7 % of the convolution peak)."""

    def __init__(self, generators: Sequence[Sequence[torch.Generator]], noise: Tensor) -> None:
        self.generators, self.noise = generators, noise
        self.pairs = [(op, r) for op in range(len(generators)) for r in range(len(generators[op]))]
        self.cuda = noise.device.type == "cuda"
        count = 1 if noise.device.type == "cpu" else 2
        self.hosts = [
            noise if count == 1 else torch.empty(noise.shape, dtype=noise.dtype, pin_memory=self.cuda)
            for _ in range(count)
        ]
        self.copied: list[Any] = [None] * count  # CUDA events: a host buffer's last copy has finished
        self.step = 0

    def next_into_noise(self) -> None:
        """Draw the next step's noise and put it into `noise` (in stream order on a GPU)."""
        j = self.step % len(self.hosts)
        self.step += 1
        host = self.hosts[j]
        if host is self.noise:  # on the CPU: in place, on the calling thread, in a fixed order
            for op, r in self.pairs:
                torch.randn(host.shape[2:], generator=self.generators[op][r], out=host[op, r])
            return
        if self.copied[j] is not None:
            self.copied[j].synchronize()  # the copy from this buffer two steps ago has been read
        run_pieces(
            lambda pair: torch.randn(
                host.shape[2:], generator=self.generators[pair[0]][pair[1]], out=host[pair]
            ),
            self.pairs,
            workers=os.cpu_count() or 1,
        )
        self.noise.copy_(host, non_blocking=self.cuda)
        if self.cuda:
            self.copied[j] = torch.cuda.Event()
            self.copied[j].record()


def save_frame(trajectories: Sequence[Tensor], x: Tensor, index: int) -> None:
    """Write state x (K, M, C, n, n) as frame `index` of each operator's (M, T, C, n, n) trajectory."""
    for trajectory, state in zip(trajectories, x, strict=True):
        trajectory[:, index] = state  # in place on purpose: the preallocated trajectory buffer


def group_bytes(
    arch: Architecture, k: int, m: int, n_frames: int, resolution: int, dtype: torch.dtype
) -> int:
    """Rough peak memory of one group: a few live activations of the widest layer plus the trajectory."""
    cells = resolution * resolution
    activations = 4 * m * k * max(arch.widths) * cells * torch.empty((), dtype=dtype).element_size()
    trajectory = k * m * n_frames * arch.channels * cells * 4
    return activations + trajectory


def is_out_of_memory(error: BaseException) -> bool:
    if isinstance(error, torch.OutOfMemoryError):
        return True
    text = str(error).lower()
    return isinstance(error, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text)


def split_to_budget(count: int, max_group: int, bytes_per_operator: int, budget_bytes: int) -> int:
    """Operators per grouped call: at most `max_group` and within the budget (at least one)."""
    return max(1, min(max_group, count, budget_bytes // max(bytes_per_operator, 1)))


class OperatorBatch(NamedTuple):
    """Inputs of `generate_operators`: per operator its parameters, weights, initial field and noise generators."""

    ops: list[OperatorParams]
    layers: list[list[Layer]]
    initial: Tensor  # (K, C, n, n) float32
    generators: list[list[torch.Generator]]  # [K][M]


def generate_operators(
    batch: OperatorBatch,
    config: RandomCNNConfig,
    device: torch.device,
    on_step: Callable[[int], Any] | None = None,
    grouped: bool | None = None,
) -> Float[Tensor, "k m time channels x y"]:
    """Trajectories of every operator of a batch, a (K, M, T, C, n, n) float32 buffer on `device`
    (trajectories stay on the device that makes them): operators one at a time on the CPU (the same bytes
    in any batch and on any thread count), grouped by architecture on a GPU (the fewest kernel launches);
    `grouped` chooses against the device. `on_step` is called from one thread at a time."""
    shape = (len(batch.ops), config.realizations, config.n_frames, config.channels, *(config.resolution,) * 2)
    frames = torch.empty(shape, dtype=torch.float32, device=device)
    if grouped is None:
        grouped = device.type != "cpu"
    fill = operators_grouped if grouped else operators_one_at_a_time
    fill(batch, config, frames, serialised(on_step))
    return frames


def operators_one_at_a_time(
    batch: OperatorBatch, config: RandomCNNConfig, frames: Tensor, report: Callable[[int], None] | None
) -> None:
    """Each operator alone (its M realizations together) into its rows of `frames`, on one intra-op thread
    of the CPU, operators side by side on the allowed threads (`dynaforge.threads`): an operator's
    trajectories do not depend on the batch it is generated in or on the thread count."""

    def run_operator(i: int) -> None:
        arch = architecture_of(batch.ops[i], config.channels)
        group = build_group(arch, [batch.ops[i]], [batch.layers[i]], config, frames.device)
        grouped_rollout(
            group, batch.initial[i : i + 1], [batch.generators[i]], config.steps, config.save_every, report,
            [frames[i]],
        )  # fmt: skip

    run_pieces(run_operator, list(range(len(batch.ops))))


def operators_grouped(
    batch: OperatorBatch, config: RandomCNNConfig, frames: Tensor, report: Callable[[int], None] | None
) -> None:
    """Operators grouped by architecture into their rows of `frames`, each group split to the memory budget
    (halved and retried on out-of-memory, the noise replayed)."""
    device = frames.device
    m = config.realizations
    dtype = conv_dtype(config, device)
    by_arch: dict[Architecture, list[int]] = {}
    for i, op in enumerate(batch.ops):
        by_arch.setdefault(architecture_of(op, config.channels), []).append(i)
    budget = int(config.memory_budget_gb * 2**30)
    for arch, members in by_arch.items():
        per_operator = group_bytes(arch, 1, m, config.n_frames, config.resolution, dtype)
        size = split_to_budget(len(members), config.max_group, per_operator, budget)
        start = 0
        while start < len(members):
            chunk = members[start : start + size]
            generators = [batch.generators[i] for i in chunk]
            states = [[g.get_state() for g in row] for row in generators]
            try:
                group = build_group(
                    arch, [batch.ops[i] for i in chunk], [batch.layers[i] for i in chunk], config, device
                )
                # On the CPU the trajectories go straight into `frames` (views of its rows, no copy after).
                direct = [frames[i] for i in chunk] if device.type == "cpu" else None
                result = grouped_rollout(
                    group,
                    batch.initial[chunk].to(device),
                    generators,
                    config.steps,
                    config.save_every,
                    report,
                    direct,
                )
            except (RuntimeError, torch.OutOfMemoryError) as error:
                if not is_out_of_memory(error) or size == 1:
                    raise
                size = max(1, size // 2)
                log.warning("out of memory with %d operators per group; retrying with %d", len(chunk), size)
                for row, row_states in zip(generators, states):  # replay the noise from where it was
                    for g, state in zip(row, row_states):
                        g.set_state(state)
                continue
            if direct is None:
                frames[chunk] = result
            start += len(chunk)
