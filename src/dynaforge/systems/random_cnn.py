"""Random neural operators: stochastic CNNs sampled from a parameter space and iterated on 2D fields.

One operator O (parameters in `OperatorSpace`, weights from its own seed) maps a state x of C channels
on the periodic n x n grid to C channels:

    h = act(conv_k(x))                                   stem, C -> w_0
    h = act(norm(conv_k(h)))  (+ h for a residual block when the width is unchanged),  l = 1..depth,
                                                          widths w_l = min(stem_width 2^l, width_cap)
    O(x) = conv_1(h) + noise_scale * xi                  1x1 head back to C; xi ~ N(0, 1) per value and step

Convolutions pad periodically. `norm` is instance norm or group norm over groups of 8 channels, without
affine parameters. Weights are N(0, gain^2 / fan_in), biases N(0, 0.1^2), drawn in float32 from
torch.Generator(operator seed) in layer order (weight then bias). The update policy is one of
x <- O(x) (autoregressive), x <- x + dt O(x) (residual), x <- a x + (1 - a) O(x) (convex), all written
x <- p x + q O(x). Each operator runs M realizations: the same initial field, independent noise streams,
one torch.Generator per (operator, realization) seeded from that row's seed, drawing one (C, n, n)
block per step. The noise and the state are float32 whatever the convolution precision.

Three ways to run the same operators:
- `RandomCNN` + `reference_rollout`: the straightforward way, one operator at a time in eager float32
  (realizations batched). It is the definition.
- `FusedOperators` (random_cnn_fused.py, `engine: fused`, the default): one operator at a time with its
  realizations, bf16 channels-last convolutions, normalisation + activation + residual + padding fused
  by torch.compile; the fastest on CPU.
- `GroupedOperators` (`engine: grouped`): K operators of one architecture as one grouped convolution
  over (M, K C, n, n), eager; the fewest kernel launches (the GPU layout).
`grouped_rollout` runs either kind of group (state (K, M, C, n, n), preallocated trajectory and noise
buffers, subnormals flushed to zero during the rollout); `generate_operators` groups a batch by
architecture and splits groups to fit a memory budget, halving the split and retrying on out-of-memory.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Sequence
from typing import Any, NamedTuple, Protocol, no_type_check, runtime_checkable

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import InitialConfig, OperatorSpace, RandomCNNConfig
from dynaforge.floating import flush_denormals
from dynaforge.systems.sampling import (
    centred_discrepancy,
    choice_names,
    decode_value,
    map_points,
    sobol_points,
    sobol_seed,
    space_dimensions,
)
from dynaforge.systems.spectral import draw_initial_field
from dynaforge.threads import run_pieces, serialised

log = logging.getLogger(__name__)

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
        raise ValueError(f"kernel_size must be odd, got {op.kernel_size}")
    if op.norm == "group" and any(w % GROUP_CHANNELS for w in widths):
        raise ValueError(f"group norm needs widths divisible by {GROUP_CHANNELS}, got {widths}")
    if op.activation not in ACTIVATIONS:
        raise ValueError(f"unknown activation {op.activation!r}; valid: {', '.join(ACTIVATIONS)}")
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
    raise ValueError(f"unknown policy {op.policy!r}; valid: autoregressive, residual, convex")


def update_coefficients(
    ops: Sequence[OperatorParams], device: torch.device | str = "cpu"
) -> Float[Tensor, "k 3"]:
    """Per operator the numbers of its update x <- p x + q (O(x) + sigma xi): rows (p, q, q sigma), float32."""
    rows = []
    for op in ops:
        p, q = policy_coefficients(op)
        rows.append((p, q, q * op.noise_scale))
    return torch.tensor(rows, dtype=torch.float32, device=device)


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


# ---- the straightforward way: one operator at a time, eager float32 --------------------------------


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
            ).to(dtype)
            x = p * x + q * (module(x) + op.noise_scale * noise)
            if n % save_every == 0:
                frames.append(x)
    return torch.stack(frames, dim=1)


# ---- the fast way: K operators of one architecture as grouped convolutions ---------------------------


class GroupedOperators:
    """K operators sharing an architecture, stacked as grouped-convolution weights.

    The state of the group is (M, K C, n, n): realizations on the batch axis, operator k's channels at
    [k C, (k + 1) C). Convolutions run in `dtype` (bfloat16 or float32), channels-last on request.
    """

    def __init__(
        self,
        arch: Architecture,
        ops: Sequence[OperatorParams],
        layers: Sequence[Sequence[Layer]],
        dtype: torch.dtype = torch.bfloat16,
        channels_last: bool = True,
        device: torch.device | str = "cpu",
    ) -> None:
        self.arch = arch
        self.k = len(ops)
        self.dtype = dtype
        self.memory_format = torch.channels_last if channels_last else torch.contiguous_format
        self.weights = [
            torch.cat([layer[i].weight for layer in layers])
            .to(device=device, dtype=dtype)
            .contiguous(memory_format=self.memory_format)
            for i in range(len(layers[0]))
        ]
        self.biases = [
            torch.cat([layer[i].bias for layer in layers]).to(device=device, dtype=dtype)
            for i in range(len(layers[0]))
        ]
        per_channel = update_coefficients(ops, device).repeat_interleave(arch.channels, dim=0)  # (K C, 3)
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


@runtime_checkable
class OperatorGroup(Protocol):
    """K operators of one architecture that step together (`GroupedOperators`, `FusedOperators`)."""

    k: int

    def step(self, x: Tensor, noise: Tensor) -> Tensor: ...


def build_group(
    arch: Architecture,
    ops: Sequence[OperatorParams],
    layers: Sequence[Sequence[Layer]],
    config: RandomCNNConfig,
    device: torch.device | str = "cpu",
) -> OperatorGroup:
    """The engine `config.engine` for K operators of one architecture (what generation runs)."""
    dtype = torch.bfloat16 if config.precision == "bfloat16" else torch.float32
    if config.engine == "grouped":
        return GroupedOperators(arch, ops, layers, dtype, config.channels_last, device)
    from dynaforge.systems.random_cnn_fused import FusedOperators

    return FusedOperators(arch, ops, layers, dtype, config.compile, device)


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
            buffer = torch.empty((k, m, n_frames, c, *space), dtype=torch.float32, device=device)
        trajectories = buffer.unbind(0) if buffer is not None else out
        if len(trajectories) != k or any(t.shape != (m, n_frames, c, *space) for t in trajectories):
            raise ValueError(f"out must hold {k} trajectories of shape {(m, n_frames, c, *space)}")
        noise = torch.empty((k, m, c, *space), dtype=torch.float32, device=device)
        x = initial.to(torch.float32)[:, None].expand(k, m, c, *space).contiguous()
        save_frame(trajectories, x, 0)
        for n in range(1, steps + 1):
            for op in range(k):
                for r in range(m):
                    torch.randn((c, *space), generator=generators[op][r], out=noise[op, r])
            x = group.step(x, noise)
            if n % save_every == 0:
                save_frame(trajectories, x, n // save_every)
            if on_step is not None:
                on_step(k * m)
    return buffer if buffer is not None else out


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
) -> Float[Tensor, "k m time channels x y"]:
    """Trajectories of every operator of a batch: `operators_one_at_a_time` on the CPU (the same bytes in
    any batch and on any thread count), `operators_grouped` on a GPU (the fewest kernel launches)."""
    if device.type == "cpu":
        return operators_one_at_a_time(batch, config, device, on_step)
    return operators_grouped(batch, config, device, on_step)


def empty_frames(count: int, config: RandomCNNConfig) -> Tensor:
    """The (K, M, T, C, n, n) float32 trajectory buffer of `count` operators, on the CPU."""
    shape = (count, config.realizations, config.n_frames, config.channels, *(config.resolution,) * 2)
    return torch.empty(shape, dtype=torch.float32)


def operators_one_at_a_time(
    batch: OperatorBatch,
    config: RandomCNNConfig,
    device: torch.device,
    on_step: Callable[[int], Any] | None = None,
) -> Float[Tensor, "k m time channels x y"]:
    """Each operator alone (its M realizations together) on one intra-op thread of the CPU, operators side
    by side on the allowed threads (`dynaforge.threads`): an operator's trajectories do not depend on the
    batch it is generated in or on the thread count."""
    frames = empty_frames(len(batch.ops), config)
    report = serialised(on_step)

    def run_operator(i: int) -> None:
        arch = architecture_of(batch.ops[i], config.channels)
        group = build_group(arch, [batch.ops[i]], [batch.layers[i]], config, device)
        grouped_rollout(
            group, batch.initial[i : i + 1], [batch.generators[i]], config.steps, config.save_every, report,
            [frames[i]],
        )  # fmt: skip

    run_pieces(run_operator, list(range(len(batch.ops))))
    return frames


def operators_grouped(
    batch: OperatorBatch,
    config: RandomCNNConfig,
    device: torch.device,
    on_step: Callable[[int], Any] | None = None,
) -> Float[Tensor, "k m time channels x y"]:
    """Operators grouped by architecture, each group split to the memory budget (halved and retried on
    out-of-memory, the noise replayed)."""
    count = len(batch.ops)
    m = config.realizations
    frames = empty_frames(count, config)
    dtype = torch.bfloat16 if config.precision == "bfloat16" else torch.float32
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
                    on_step,
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
                frames[chunk] = result.cpu()
            start += len(chunk)
    return frames


# ---- the dataset-facing system: rows of (operator, realization) for the store writer -----------------


class GeneratedRows(NamedTuple):
    """What `RandomCNNSystem.generate_rows` hands the store writer for rows [start, stop) of a split."""

    fields: np.ndarray  # (rows, T, X, Y, C) float32, channels last
    params: np.ndarray  # (rows, P) float64, columns `parameter_names`
    time: np.ndarray  # (T,) float64
    extras: dict[str, np.ndarray]  # per-row datasets: operator, realization, sobol, features, ...


class RandomCNNSystem:
    """Random CNN operators as a dataset system; rows are (operator, realization), operator-major.

    Row r of a split belongs to operator r // M, realization r % M. The operator's Sobol point is row
    r // M of the split's scrambled sequence; its weights and initial field come from the operator seed;
    the row's noise from the row seed. All seeds derive from (base seed, split, index) alone.
    """

    name = "random_cnn"
    config_class = RandomCNNConfig
    ndim = 2

    def __init__(self, config: RandomCNNConfig) -> None:
        if not isinstance(config, RandomCNNConfig):
            raise TypeError(f"RandomCNNSystem needs a RandomCNNConfig, got {type(config).__name__}")
        self.config = config
        self.shape = (config.resolution, config.resolution)
        self.channels = config.channels
        self.dimensions = space_dimensions(config.space)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return (*(name for name, _ in self.dimensions), "domain_length")

    @property
    def feature_names(self) -> tuple[str, ...]:
        from dynaforge.systems.features import feature_names

        return feature_names(self.config.spectrum_bins)

    def operator_seed(self, base_seed: int, split: str, operator: int) -> int:
        from dynaforge.seeds import SPLIT_IDS

        key = (SPLIT_IDS[split], operator, OPERATOR_STREAM)
        return int(np.random.SeedSequence(entropy=base_seed, spawn_key=key).generate_state(1, np.uint64)[0])

    def operator_points(self, base_seed: int, split: str, start: int, stop: int) -> np.ndarray:
        """Unit-cube coordinates of operators [start, stop) of a split."""
        from dynaforge.seeds import SPLIT_IDS

        seed = sobol_seed(base_seed, SPLIT_IDS[split])
        return sobol_points(len(self.dimensions), start, stop, seed)

    def initial_field(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """One family (by weight) for all channels of an operator's initial field; returns (field, family index)."""
        names = list(self.config.initial.families)
        weights = np.asarray([self.config.initial.families[n] for n in names], dtype=np.float64)
        family = int(rng.choice(len(names), p=weights / weights.sum()))
        single = InitialConfig(**{**self.config.initial.__dict__, "families": {names[family]: 1.0}})
        channels = [draw_initial_field(single, self.shape, rng) for _ in range(self.channels)]
        return np.stack(channels), family

    def build_operators(
        self, split: str, start: int, stop: int, base_seed: int
    ) -> tuple[OperatorBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Operators [start, stop): the batch to run, Sobol points, mapped values, operator seeds, IC families."""
        from dynaforge.seeds import sample_seed

        m = self.config.realizations
        points = self.operator_points(base_seed, split, start, stop)
        values = map_points(self.dimensions, points)
        ops, layers, initial, generators, seeds, families = [], [], [], [], [], []
        for j, operator in enumerate(range(start, stop)):
            op = OperatorParams.from_values(self.config.space, values[j])
            seed = self.operator_seed(base_seed, split, operator)
            ops.append(op)
            layers.append(operator_weights(architecture_of(op, self.channels), op.weight_gain, seed))
            field, family = self.initial_field(np.random.default_rng(seed))
            initial.append(field)
            families.append(family)
            seeds.append(seed)
            rows = range(operator * m, (operator + 1) * m)
            generators.append([noise_generator(sample_seed(base_seed, split, r)) for r in rows])
        batch = OperatorBatch(ops, layers, torch.from_numpy(np.stack(initial)).to(torch.float32), generators)
        return batch, points, values, np.asarray(seeds, dtype=np.uint64), np.asarray(families, dtype=np.int64)

    def generate_rows(
        self,
        split: str,
        start: int,
        stop: int,
        base_seed: int,
        device: torch.device,
        on_steps: Callable[[int], Any] | None = None,
    ) -> GeneratedRows:
        """Rows [start, stop) of a split (whole operators: both ends multiples of `realizations`)."""
        m = self.config.realizations
        if start % m or stop % m:
            from dynaforge.config import ConfigError

            raise ConfigError(
                f"random_cnn stores {m} realizations per operator: split sizes, dataset.shard_size and "
                f"dataset.batch_size must be multiples of system.realizations={m} (rows {start}..{stop})"
            )
        batch, points, values, seeds, families = self.build_operators(split, start // m, stop // m, base_seed)
        frames = generate_operators(batch, self.config, device, on_steps)  # (K, M, T, C, X, Y)
        rows = frames.flatten(0, 1)  # operator-major rows
        extras = {
            "operator": np.repeat(np.arange(start // m, stop // m, dtype=np.int64), m),
            "realization": np.tile(np.arange(m, dtype=np.int64), stop // m - start // m),
            "operator_seed": np.repeat(seeds, m),
            "sobol": np.repeat(points, m, axis=0),
            "initial_family": np.repeat(families, m),
        }
        if self.config.features:
            from dynaforge.systems.features import trajectory_features

            # One operator's rows at a time, on one intra-op thread: the same bytes in any batch.
            per_operator = run_pieces(
                lambda trajectories: trajectory_features(trajectories, self.config.spectrum_bins),
                list(frames.unbind(0)),
            )
            extras["features"] = torch.cat(per_operator).numpy().astype(np.float32)
        params = np.concatenate([values, np.ones((len(values), 1))], axis=1)  # domain_length = 1
        time = np.arange(self.config.n_frames, dtype=np.float64) * self.config.dt * self.config.save_every
        fields = torch.movedim(rows, 2, -1).numpy()
        return GeneratedRows(fields, np.repeat(params, m, axis=0), time, extras)

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        """Attributes every shard carries: the space, option names, feature names, the split's discrepancy."""
        import json

        n_operators = split_size // self.config.realizations
        points = self.operator_points(base_seed, split, 0, n_operators)
        choices = {name: choice_names(spec) for name, spec in self.dimensions if spec.kind == "choice"}
        attributes: dict[str, Any] = {
            "realizations": self.config.realizations,
            "sobol_dimensions": [name for name, _ in self.dimensions],
            "choices": json.dumps(choices),
            "initial_families": list(self.config.initial.families),
            "centred_discrepancy": centred_discrepancy(points),
        }
        if self.config.features:
            attributes["feature_names"] = list(self.feature_names)
        return attributes
