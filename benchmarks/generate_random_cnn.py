"""Random-CNN dataset generation: dynaforge's engines against the straightforward loop, same process.

The workload is the 74-hour study (10,000 random CNN operators, 500 steps, 128x128, several stochastic
realizations, RTX 3060 Ti) scaled to this machine: by default 32 operators x 3 realizations x 64 steps on
64x64 grids with 3 channels, operators drawn from the default `OperatorSpace` (depth 2-3, stem width 16 or
32, widths doubling to a cap of 64, kernel 3 or 5, conv or residual blocks, instance or group norm,
gelu/silu/relu, three update policies, noise std 1e-3..1e-1): 96 architectures, so 32 operators fall into
about 29 of them.

Contenders, run in turn in every round (`--repeats` rounds, medians reported) on the same operators,
initial fields and noise streams:
- baseline: one operator at a time, eager float32, contiguous layout, realizations batched
  (`random_cnn.reference_rollout`, the definition of a trajectory); run with subnormals flushed like the
  engines, so that no contender is slowed by them;
- dynaforge `fused` (the default): one operator at a time, its M realizations together, channels-last
  convolutions in the precision `precision: auto` picks for the machine (bf16 with bf16 matrix units, AMX or
  tensor cores; float32 elsewhere) with fp32 state and noise, normalisation + activation + residual + periodic padding fused by
  torch.compile into two passes per layer. How it groups: operators are grouped by architecture only to
  share one compiled graph per architecture (compiled once, outside the timed rounds: the first-call time is
  reported apart); the speed per operator does not depend on how many operators share an architecture;
- dynaforge `grouped` (`--engines fused,grouped`): K operators of an architecture as one grouped
  convolution per layer, eager (the layout that minimises kernel launches on a GPU).

Checks: the float32 fused engine reproduces the baseline (relative max difference over the first steps);
bf16 agrees with the float32 baseline over a short horizon to bf16 precision; the per-trajectory feature
distributions of the bf16 and float32 datasets agree (two-sample Kolmogorov-Smirnov test per feature, all
p >= 0.01). The convolution peak of this machine in the precision the engine uses is measured in the same run, and the convolution FLOPs
the generator sustains are reported as a fraction of it, both in process CPU time (with one thread, the
wall time of a quiet core; wall times on the shared machine mostly measure the other jobs). The same
operators' convolutions alone are timed too: their share of generation's CPU time, and the speed-up
ceiling if everything else (normalisation, activations, noise, copies) were free; and the least elementwise
work anything must add to them (`elementwise_floor_seconds`: one copy pass over every layer output, and the
compiled activation alone), with the tighter ceilings those set: every layer's output has to be normalised
over the whole grid and activated before the next convolution reads it, which oneDNN cannot fuse into the
convolution, so no engine built on these convolutions beats convolutions + one copy pass. The 10,000-operator
projection uses CPU time per operator-step (one quiet core); the wall-time projection is in its notes.

    python benchmarks/generate_random_cnn.py                 # full case (~15 min on 2 busy cores)
    python benchmarks/generate_random_cnn.py --threads 1     # steadier on a loaded machine
    python benchmarks/generate_random_cnn.py --quick         # smoke run (`make bench-smoke`)
    python benchmarks/generate_random_cnn.py --device cuda --out results/generate_random_cnn.h200.json

`--device cuda` times the same operators on a GPU instead (`run_on_device`): the straightforward loop there
(the definition, `reference_rollout`, with the module and state on the GPU, one operator at a time) against
`generate_operators` on the GPU (operators grouped by architecture, `precision: auto`), in wall time with
the device synchronised, and the GPU's own convolution peak in the engine's precision.

`--quick` runs every engine and baseline at 2 operators, 8 steps, 32x32; not a figure: it writes to a
temporary folder (smoke.quick_path) unless --out is given.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from scipy.stats import ks_2samp

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.floating import flush_denormals
from dynaforge.systems import build_system
from dynaforge.systems.random_cnn.features import feature_names, trajectory_features
from dynaforge.systems.random_cnn.grouped import OperatorBatch, conv_dtype, generate_operators
from dynaforge.systems.random_cnn.operator import ACTIVATIONS, Architecture, architecture_of
from dynaforge.systems.random_cnn.reference import RandomCNN, reference_rollout
from dynaforge.systems.random_cnn.system import RandomCNNSystem
from machine import load_note
from smoke import quick_path

RESULTS = Path(__file__).parent / "results" / "generate_random_cnn.json"
FEW_ARCHITECTURES = [
    "system.space.stem_width.choices={'32': 1.0}",
    "system.space.kernel_size.choices={'3': 1.0}",
    "system.space.block.choices={conv: 1.0}",
    "system.space.norm.choices={group: 1.0}",
    "system.space.activation.choices={gelu: 1.0}",
]
"""`--space few-architectures`: only depth varies among the structural choices (2 architectures), so 32
operators fill groups the way 10,000 operators over the default space's 96 architectures would."""
STUDY = {"operators": 10_000, "steps": 500, "resolution": 128, "realizations": 3, "hours": 74.0}
KS_PVALUE = 0.01
"""Feature distributions match when no feature's two-sample KS test rejects at this level."""
HORIZON = 8
"""Steps over which trajectories are compared value by value (chaotic operators diverge later)."""


def conv_flops(arch: Architecture, cells: int, realizations: int) -> int:
    """Multiply-add FLOPs (x2) of one step of one operator over its realizations."""
    k2 = arch.kernel_size**2
    flops = arch.channels * arch.widths[0] * k2
    flops += sum(a * b * k2 for a, b in zip(arch.widths[:-1], arch.widths[1:]))
    flops += arch.widths[-1] * arch.channels
    return 2 * flops * cells * realizations


PRECISION_NAMES = {torch.bfloat16: "bf16", torch.float32: "fp32"}


def measure_conv_peak(repeats: int, dtype: torch.dtype) -> tuple[float, float]:
    """GFLOP/s of a large 3x3 channels-last convolution in `dtype` (the precision generation uses), best of
    `repeats`: (wall, CPU time).

    The CPU-time figure is the one to compare with: on a shared machine the best wall time of a 0.1 s
    convolution still includes time the process spent descheduled (measured here: 560 GFLOP/s wall against
    1460 CPU on a loaded machine, one thread).
    """
    x = torch.randn(16, 128, 64, 64, dtype=torch.float32).to(dtype)
    w = torch.randn(128, 128, 3, 3, dtype=torch.float32).to(dtype)
    x, w = x.contiguous(memory_format=torch.channels_last), w.contiguous(memory_format=torch.channels_last)
    flops = 2 * 16 * 128 * 128 * 9 * 64 * 64
    best_wall = best_cpu = float("inf")
    with torch.inference_mode():
        F.conv2d(x, w, padding=1)
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            F.conv2d(x, w, padding=1)
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
    return flops / best_wall / 1e9, flops / best_cpu / 1e9


def convolutions_only_seconds(
    batch: OperatorBatch, channels: int, resolution: int, m: int, steps: int, dtype: torch.dtype
) -> float:
    """CPU seconds the channels-last convolutions (in `dtype`) of these operators alone take for `steps` steps
    (bias-free, on random inputs of the right shapes, best of 3): what generation would cost if the
    normalisation, activations, noise and copies were free."""
    total = 0.0
    with torch.inference_mode():
        for op, layers in zip(batch.ops, batch.layers):
            arch = architecture_of(op, channels)
            pad = 2 * (arch.kernel_size // 2)
            convs = []
            for i, layer in enumerate(layers):
                weight = layer.weight.to(dtype).contiguous(memory_format=torch.channels_last)
                size = resolution + (pad if i < len(layers) - 1 else 0)
                x = torch.randn(m, weight.shape[1], size, size, dtype=torch.float32).to(dtype)
                convs.append((x.contiguous(memory_format=torch.channels_last), weight))
            for x, weight in convs:
                F.conv2d(x, weight)
            best = float("inf")
            for _ in range(3):
                start = time.process_time()
                for _ in range(4):
                    for x, weight in convs:
                        F.conv2d(x, weight)
                best = min(best, (time.process_time() - start) / 4)
            total += best * steps
    return total


def elementwise_floor_seconds(
    batch: OperatorBatch, channels: int, resolution: int, m: int, steps: int, dtype: torch.dtype
) -> tuple[float, float]:
    """CPU seconds of the least elementwise work generation must do besides its convolutions, for `steps`
    steps of these operators (best of 3 each): (a copy pass, an activation pass).

    Every layer's output (stem and hidden layers, M x width x n x n channels-last in `dtype`) has to be
    normalised and activated before the next convolution reads it; oneDNN cannot fuse a normalisation whose
    statistics span the whole grid into the convolution's epilogue, so each of those values is read and
    written at least once outside it. The copy pass is exactly that: one `copy_` of every value. The
    activation pass is act(y) alone, compiled (one fused read-compute-write), with the operator's own
    activation; the norm statistics, residuals and padding come on top of either.
    """
    copy_total = act_total = 0.0
    timings: dict[tuple[str, int], tuple[float, float]] = {}

    def best_of_3(run: Callable[[], object]) -> float:
        run()
        run()
        best = float("inf")
        for _ in range(3):
            start = time.process_time()
            for _ in range(8):
                run()
            best = min(best, (time.process_time() - start) / 8)
        return best

    with torch.inference_mode(), torch._dynamo.config.patch(recompile_limit=256):
        for op in batch.ops:
            arch = architecture_of(op, channels)
            for width in arch.widths:
                key = (arch.activation, width)
                if key not in timings:
                    y = torch.randn(m, width, resolution, resolution, dtype=torch.float32).to(dtype)
                    y = y.contiguous(memory_format=torch.channels_last)
                    out = torch.empty_like(y)
                    act = ACTIVATIONS[arch.activation]
                    activate = torch.compile(
                        lambda v, act=act: act(v.to(torch.float32)).to(dtype), dynamic=False
                    )
                    timings[key] = (
                        best_of_3(lambda out=out, y=y: out.copy_(y)),
                        best_of_3(lambda f=activate, y=y: f(y)),
                    )
                copy_total += timings[key][0] * steps
                act_total += timings[key][1] * steps
    return copy_total, act_total


def baseline_rollouts(system: RandomCNNSystem, batch: OperatorBatch, steps: int) -> torch.Tensor:
    """The straightforward loop: one operator at a time, eager float32, realizations batched."""
    out = []
    with torch.inference_mode(), flush_denormals():
        for k, op in enumerate(batch.ops):
            module = RandomCNN(architecture_of(op, system.channels), batch.layers[k])
            out.append(reference_rollout(module, op, batch.initial[k], batch.generators[k], steps))
    return torch.stack(out)


def relative_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """max |a - b| / max |b| per trajectory, worst trajectory."""
    diff = (a - b).abs().flatten(2).amax(dim=2)
    scale = b.abs().flatten(2).amax(dim=2).clamp_min(1e-12)
    return float((diff / scale).max())


def timed(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float, float]:
    """(result, wall seconds, CPU seconds of the whole process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    result = run()
    return result, time.perf_counter() - wall, time.process_time() - cpu


def inductor_cache_counts() -> tuple[int, int]:
    from torch._dynamo.utils import counters

    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


def gpu_seconds(run: Callable[[], torch.Tensor]) -> tuple[torch.Tensor, float]:
    """(result, wall seconds with the device synchronised before and after)."""
    sync = torch.cuda.synchronize if torch.cuda.is_available() else lambda: None
    sync()
    start = time.perf_counter()
    result = run()
    sync()
    return result, time.perf_counter() - start


def gpu_conv_peak(dtype: torch.dtype, device: torch.device) -> float:
    """TFLOP/s of a large 3x3 channels-last convolution in `dtype` on the GPU (256x128x64x64, 128->128),
    best of 5 timings of 20 calls."""
    b = 256 if device.type == "cuda" else 2  # (2 on a CPU: the code path only)
    x = torch.randn(b, 128, 64, 64, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    w = torch.randn(128, 128, 3, 3, device=device).to(dtype).contiguous(memory_format=torch.channels_last)
    flops = 2 * b * 128 * 128 * 9 * 64 * 64 * 20
    with torch.inference_mode():
        F.conv2d(x, w, padding=1)
        best = min(
            gpu_seconds(lambda: [F.conv2d(x, w, padding=1) for _ in range(20)][-1])[1] for _ in range(5)
        )
    return flops / best / 1e12


def system_overrides(args: argparse.Namespace) -> list[str]:
    """The random_cnn system of the command line's sizes and operator space."""
    return [
        "system.name=random_cnn",
        f"system.resolution={args.resolution}",
        f"system.steps={args.steps}",
        f"system.realizations={args.realizations}",
        f"system.channels={args.channels}",
        f"system.max_group={args.max_group}",
        *(FEW_ARCHITECTURES if args.space == "few-architectures" else []),
    ]


def run_on_device(args: argparse.Namespace, device: torch.device) -> list[dict]:
    """The same operators on a GPU: the straightforward loop on the GPU against `generate_operators` there."""
    overrides = system_overrides(args)
    system = build_system(load_config(None, overrides).system)
    assert isinstance(system, RandomCNNSystem)
    n, m = args.operators, args.realizations

    def batch() -> OperatorBatch:  # fresh noise generators each time: every run sees the same noise
        return system.build_operators("train", 0, n, args.seed)[0]

    def loop() -> torch.Tensor:
        out = []
        b = batch()
        with torch.inference_mode():
            for k, op in enumerate(b.ops):
                module = RandomCNN(architecture_of(op, system.channels), b.layers[k]).to(device)
                out.append(
                    reference_rollout(module, op, b.initial[k].to(device), b.generators[k], args.steps)
                )
        return torch.stack(out)

    archs = [architecture_of(op, args.channels) for op in batch().ops]
    flops = sum(conv_flops(a, args.resolution**2, m) for a in archs) * args.steps
    dtype = conv_dtype(system.config, device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else platform.machine()
    _, first = gpu_seconds(lambda: generate_operators(batch(), system.config, device))  # compiles, warms up
    gpu_seconds(loop)
    walls: dict[str, list[float]] = {"baseline": [], "dynaforge": []}
    outputs: dict[str, torch.Tensor] = {}
    for round_ in range(args.repeats):
        outputs["baseline"], wall = gpu_seconds(loop)
        walls["baseline"].append(wall)
        outputs["dynaforge"], wall = gpu_seconds(lambda: generate_operators(batch(), system.config, device))
        walls["dynaforge"].append(wall)
        print(
            f"round {round_ + 1}: loop {walls['baseline'][-1]:.2f} s, dynaforge {walls['dynaforge'][-1]:.2f} s"
        )
    wall = {key: statistics.median(t) for key, t in walls.items()}
    horizon = min(args.steps, HORIZON)
    step1 = relative_difference(outputs["dynaforge"][:, :, 1:2].cpu(), outputs["baseline"][:, :, 1:2].cpu())
    at_horizon = relative_difference(
        outputs["dynaforge"][:, :, horizon : horizon + 1].cpu(),
        outputs["baseline"][:, :, horizon : horizon + 1].cpu(),
    )
    peak = gpu_conv_peak(dtype, device)
    sustained = flops / wall["dynaforge"] / 1e12
    ratio = wall["baseline"] / wall["dynaforge"]
    case = (
        f"random_cnn {n} ops x {m} real x {args.steps} steps {args.resolution}^2 C={args.channels} on {name}"
    )
    notes = (
        f"{name}, torch {torch.__version__}, CUDA {torch.version.cuda}, {os.cpu_count()} CPU cores; medians of {args.repeats} interleaved "
        f"rounds, wall time with the device synchronised; engine precision {PRECISION_NAMES[dtype]}; first call "
        f"(compilation, excluded) {first:.1f} s; noise drawn by the CPU generators in both (the same noise as on "
        f"the CPU); engine vs loop rel. max diff {step1:.1e} after 1 step, {at_horizon:.1e} after {horizon}"
    )
    print(
        f"{case}: loop {wall['baseline']:.2f} s, dynaforge {wall['dynaforge']:.2f} s: {ratio:.2f}x; "
        f"{sustained:.1f} TFLOP/s of convolutions = {sustained / peak:.1%} of the {PRECISION_NAMES[dtype]} "
        f"peak {peak:.0f} TFLOP/s"
    )
    return [
        {
            "case": case,
            "baseline": "straightforward loop on the same GPU (one operator at a time, eager fp32, realizations "
            "batched)",
            "metric": "operator-steps/s",
            "dynaforge": n * args.steps / wall["dynaforge"],
            "baseline_value": n * args.steps / wall["baseline"],
            "ratio": ratio,
            "notes": notes,
        },
        {
            "case": case,
            "baseline": f"{PRECISION_NAMES[dtype]} channels-last 3x3 conv peak of the GPU measured in this run",
            "metric": "TFLOP/s of convolutions",
            "dynaforge": sustained,
            "baseline_value": peak,
            "ratio": sustained / peak,
            "notes": f"{notes}; ratio = fraction of the GPU's convolution peak sustained by generation",
        },
    ]


def run(args: argparse.Namespace) -> list[dict]:
    overrides = system_overrides(args)

    def system_for(*extra: str) -> RandomCNNSystem:
        system = build_system(load_config(None, [*overrides, *extra]).system)
        assert isinstance(system, RandomCNNSystem)
        return system

    engines = {name: system_for(f"system.engine={name}") for name in args.engines}
    reference = engines[args.engines[0]]
    n, m, cpu = args.operators, args.realizations, torch.device("cpu")

    def batch() -> OperatorBatch:  # fresh noise generators each time: every run sees the same noise
        return reference.build_operators("train", 0, n, args.seed)[0]

    archs = [architecture_of(op, args.channels) for op in batch().ops]
    census = Counter(archs)
    cells = args.resolution**2
    flops = sum(conv_flops(a, cells, m) for a in archs) * args.steps
    grouping = (
        f"{n} operators in {len(census)} architectures ({args.space} space; largest group "
        f"{max(census.values())}, {sum(1 for c in census.values() if c == 1)} alone)"
    )
    print(
        f"{n} operators x {m} realizations x {args.steps} steps, {args.resolution}^2, C={args.channels}: "
        f"{flops / 1e12:.2f} TFLOP of convolutions; {grouping}; {torch.get_num_threads()} threads"
    )
    # The limits below are measured in the precision the main engine's convolutions use on this machine
    # (`precision: auto` resolves to bf16 only with bf16 matrix units: docs/random_cnn.md).
    dtype = conv_dtype(engines[args.engines[0]].config, "cpu")
    precision = PRECISION_NAMES[dtype]
    peak_wall, peak = measure_conv_peak(args.peak_repeats, dtype)
    print(
        f"{precision} channels-last conv peak: {peak:.0f} GFLOP/s in CPU time ({peak_wall:.0f} in wall time)"
    )

    # First calls, apart: compilation (fused: one graph per architecture) and oneDNN primitive creation.
    first_call = {}
    hits, misses = inductor_cache_counts()
    for name in engines:
        warm = system_for(f"system.engine={name}", "system.steps=1")
        _, first_call[name], _ = timed(
            lambda w=warm: generate_operators(w.build_operators("train", 0, n, args.seed)[0], w.config, cpu)
        )
        print(f"first call ({name}, all {len(census)} architectures, 1 step): {first_call[name]:.1f} s")
    hits, misses = (a - b for a, b in zip(inductor_cache_counts(), (hits, misses)))
    baseline_rollouts(reference, reference.build_operators("train", 0, 1, args.seed)[0], 1)

    contenders: dict[str, Callable[[], torch.Tensor]] = {
        "baseline": lambda: baseline_rollouts(reference, batch(), args.steps)
    }
    for name, system in engines.items():
        contenders[name] = lambda s=system: generate_operators(batch(), s.config, cpu)
    walls: dict[str, list[float]] = {name: [] for name in contenders}
    cpus: dict[str, list[float]] = {name: [] for name in contenders}
    outputs: dict[str, torch.Tensor] = {}
    load_start = load_note()
    for round_ in range(args.repeats):  # interleaved, so that the machine's load weighs on all alike
        for name, contender in contenders.items():
            outputs[name], wall, cpu_s = timed(contender)
            walls[name].append(wall)
            cpus[name].append(cpu_s)
        print(
            f"round {round_ + 1}: "
            + ", ".join(f"{name} {walls[name][-1]:.1f} s (cpu {cpus[name][-1]:.1f} s)" for name in contenders)
        )
    load_end = load_note()
    wall = {name: statistics.median(t) for name, t in walls.items()}
    cpu_time = {name: statistics.median(t) for name, t in cpus.items()}
    slow = outputs["baseline"]

    # Equivalence: float32 engine = definition; bf16 close to it over a short horizon; same statistics.
    horizon = min(args.steps, HORIZON)
    exact = generate_operators(
        system_for(
            f"system.engine={args.engines[0]}", "system.precision=float32", f"system.steps={horizon}"
        ).build_operators("train", 0, n, args.seed)[0],
        system_for(f"system.engine={args.engines[0]}", "system.precision=float32").config,
        cpu,
    )
    fast = outputs[args.engines[0]]
    fp32_vs_baseline = relative_difference(exact[:, :, : horizon + 1], slow[:, :, : horizon + 1])
    bf16_one_step = relative_difference(fast[:, :, 1:2], slow[:, :, 1:2])
    bf16_horizon = relative_difference(fast[:, :, horizon : horizon + 1], slow[:, :, horizon : horizon + 1])
    names = feature_names(8)
    f_fast = trajectory_features(fast.flatten(0, 1), 8).numpy()
    f_slow = trajectory_features(slow.flatten(0, 1), 8).numpy()
    pvalues = {name: float(ks_2samp(f_fast[:, i], f_slow[:, i]).pvalue) for i, name in enumerate(names)}
    worst = min(pvalues, key=pvalues.get)
    print(f"float32 engine vs baseline, {horizon} steps: relative max difference {fp32_vs_baseline:.2e}")
    print(f"bf16 vs float32 baseline: step 1 {bf16_one_step:.2e}, step {horizon} {bf16_horizon:.2e}")
    print(
        f"feature distributions (KS, {len(names)} features): smallest p-value {pvalues[worst]:.3f} ({worst})"
    )

    machine = f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores"
    environment = (
        f"{machine}, torch {torch.__version__} with {torch.get_num_threads()} intra-op threads, "
        f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', '(unset)')}"
    )
    notes_common = (
        f"{environment}; {load_start} at the start of the timed rounds, {load_end} at their end; medians of "
        f"{args.repeats} interleaved rounds"
    )
    case = f"random_cnn {n} ops x {m} real x {args.steps} steps {args.resolution}^2 C={args.channels}"
    equivalence = (
        f"same outputs: float32 fused engine vs baseline rel. max diff {fp32_vs_baseline:.1e} over {horizon} "
        f"steps; bf16 vs fp32 baseline {bf16_one_step:.1e} after 1 step, {bf16_horizon:.1e} after {horizon}; "
        f"feature distributions: all {len(names)} KS p-values >= {KS_PVALUE} required, smallest "
        f"{pvalues[worst]:.3f} ({worst})"
    )
    records = []
    for name in args.engines:
        ratio = wall["baseline"] / wall[name]
        print(
            f"{name}: {wall[name]:.2f} s vs baseline {wall['baseline']:.2f} s: {ratio:.2f}x "
            f"(CPU time {cpu_time['baseline'] / cpu_time[name]:.2f}x)"
        )
        records.append(
            {
                "case": case,
                "baseline": "straightforward loop (one operator at a time, eager fp32, realizations batched)",
                "metric": "operator-steps/s",
                "dynaforge": n * args.steps / wall[name],
                "baseline_value": n * args.steps / wall["baseline"],
                "ratio": ratio,
                "notes": (
                    f"{notes_common}; engine {name}; {grouping}; wall {wall[name]:.2f} s vs {wall['baseline']:.2f} s, "
                    f"process CPU time ratio {cpu_time['baseline'] / cpu_time[name]:.2f}; first call "
                    f"(compilation etc., excluded) {first_call[name]:.1f} s"
                    + (f" (inductor FX graph cache: {hits} hits, {misses} misses)" if name == "fused" else "")
                    + f"; {equivalence}"
                ),
            }
        )
    main = args.engines[0]
    sustained = flops / wall[main] / 1e9
    per_operator_step = wall[main] / (n * args.steps)
    per_operator_step_cpu = cpu_time[main] / (n * args.steps)
    sustained_cpu = flops / cpu_time[main] / 1e9
    conv_only = convolutions_only_seconds(batch(), args.channels, args.resolution, m, args.steps, dtype)
    print(
        f"convolutions alone: {conv_only:.2f} s CPU = {conv_only / cpu_time[main]:.0%} of generation's CPU time; "
        f"ratio ceiling if everything else were free: {cpu_time['baseline'] / conv_only:.1f}x"
    )
    copy_floor, act_floor = elementwise_floor_seconds(
        batch(), args.channels, args.resolution, m, args.steps, dtype
    )
    budget = cpu_time["baseline"] / 10 - conv_only
    print(
        f"one copy pass over every activation value: {copy_floor:.2f} s CPU, the activation alone "
        f"{act_floor:.2f} s; 10x leaves {budget:.2f} s for all non-convolution work; ceilings: convolutions + "
        f"copy {cpu_time['baseline'] / (conv_only + copy_floor):.1f}x, + activation "
        f"{cpu_time['baseline'] / (conv_only + act_floor):.1f}x"
    )
    scale = (STUDY["resolution"] / args.resolution) ** 2 * (STUDY["realizations"] / m)
    projection = f"this run's CPU time per operator-step (one thread: the wall time of a quiet core) scaled by grid cells (x{(STUDY['resolution'] / args.resolution) ** 2:g}) and realizations"
    if args.project_operators and args.resolution != STUDY["resolution"]:
        # The cells scaling checked at the study's grid: the same few operators at both grids, after a first
        # (compiling) call each; the measured ratio replaces the cells factor (cache effects included).
        k = args.project_operators

        def per_step(resolution: int) -> float:
            grid = system_for(
                f"system.engine={main}", f"system.resolution={resolution}",
                f"system.steps={args.project_steps}", f"system.realizations={STUDY['realizations']}",
            )  # fmt: skip

            def go() -> torch.Tensor:
                return generate_operators(grid.build_operators("train", 0, k, args.seed)[0], grid.config, cpu)

            timed(go)
            return min(timed(go)[2] for _ in range(2)) / (k * args.project_steps)  # CPU time

        small, large = per_step(args.resolution), per_step(STUDY["resolution"])
        scale *= (large / small) / (STUDY["resolution"] / args.resolution) ** 2
        projection += (
            f", corrected by the ratio measured on {k} operators x {STUDY['realizations']} realizations x "
            f"{args.project_steps} steps: {large / small:.2f}x the time per operator-step at "
            f"{STUDY['resolution']}^2 as at {args.resolution}^2 (cells: x{(STUDY['resolution'] / args.resolution) ** 2:g})"
        )
    study_hours = per_operator_step_cpu * scale * STUDY["operators"] * STUDY["steps"] / 3600
    study_hours_wall = per_operator_step * scale * STUDY["operators"] * STUDY["steps"] / 3600
    compile_per_arch = first_call[main] / len(census)
    records += [
        {
            "case": case,
            "baseline": f"{precision} channels-last 3x3 conv peak measured in this run (16x128x64x64, 128->128), "
            "CPU time",
            "metric": "GFLOP/s of convolutions (CPU time)",
            "dynaforge": sustained_cpu,
            "baseline_value": peak,
            "ratio": sustained_cpu / peak,
            "notes": f"{notes_common}; engine {main}; fraction of the measured {precision} conv peak (the precision generation uses here) sustained by "
            "generation (ratio), counting convolution FLOPs only, both in process CPU time (one thread); in "
            f"wall time {sustained:.0f} of {peak_wall:.0f} GFLOP/s = {sustained / peak_wall:.0%} (wall figures "
            "on a loaded machine: the peak's best-of-N wall time dodges the load less than a small op does)",
        },
        {
            "case": case,
            "baseline": f"the same operators' {precision} channels-last convolutions alone (random inputs, CPU time)",
            "metric": "CPU seconds",
            "dynaforge": cpu_time[main],
            "baseline_value": conv_only,
            "ratio": conv_only / cpu_time[main],
            "notes": f"{notes_common}; engine {main}; ratio = fraction of generation's CPU time that the "
            "convolutions alone would take; the rest is normalisation statistics, activation (GELU/SiLU erf/exp "
            "in float32), residual, padding, noise draws and copies. Ceiling of the speed-up over the baseline "
            f"if all of that were free: {cpu_time['baseline'] / conv_only:.1f}x (CPU time)",
        },
        {
            "case": case,
            "baseline": "the speed-up ceiling: the same convolutions + one copy pass over every activation value",
            "metric": "CPU seconds",
            "dynaforge": cpu_time[main],
            "baseline_value": conv_only + copy_floor,
            "ratio": (conv_only + copy_floor) / cpu_time[main],
            "notes": f"{notes_common}; engine {main}; the convolutions alone take {conv_only:.2f} s and one "
            f"copy_ of every layer output ({precision} channels-last, read + write once: less than any normalisation "
            f"+ activation can cost, since the statistics span the grid and cannot ride in the convolution's "
            f"epilogue) {copy_floor:.2f} s; the compiled activation alone {act_floor:.2f} s. Speed-up ceilings "
            f"over the baseline ({cpu_time['baseline']:.2f} s CPU): "
            f"{cpu_time['baseline'] / (conv_only + copy_floor):.1f}x (convolutions + copy), "
            f"{cpu_time['baseline'] / (conv_only + act_floor):.1f}x (convolutions + activation); 10x would leave "
            f"{budget:.2f} s for all non-convolution work, i.e. {budget / copy_floor:.2f} of one copy pass",
        },
        {
            "case": "10,000 operators x 500 steps x 128^2 x 3 realizations (projected)",
            "baseline": "reported study: 74 h on an RTX 3060 Ti",
            "metric": "hours",
            "dynaforge": study_hours,
            "baseline_value": STUDY["hours"],
            "ratio": STUDY["hours"] / study_hours,
            "notes": (
                f"{notes_common}; engine {main}; projected from {projection} (from this run's wall time "
                f"instead, on the loaded machine: {study_hours_wall:.1f} h); plus first-call compilation, "
                f"{compile_per_arch:.1f} s per architecture in this run (on-disk cache: {hits} hits, {misses} "
                "misses), for the default space's 96 architectures. Different hardware from the study: the ratio "
                "is not a like-for-like speed-up"
            ),
        },
    ]
    print(
        f"sustained {sustained_cpu:.0f} GFLOP/s = {sustained_cpu / peak:.1%} of the {precision} conv peak (CPU time); "
        f"10,000-operator study projected here: {study_hours:.1f} h"
    )
    ok = all(p >= KS_PVALUE for p in pvalues.values()) and fp32_vs_baseline < 1e-3 and bf16_one_step < 0.03
    print("equivalence checks:", "passed" if ok else "FAILED")
    return records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 2 operators, 8 steps, 32x32")
    parser.add_argument("--operators", type=int, default=32)
    parser.add_argument("--realizations", type=int, default=3)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--channels", type=int, default=3)
    parser.add_argument("--max-group", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--space", choices=["default", "few-architectures"], default="default")
    parser.add_argument(
        "--engines", default="fused", help="comma-separated dynaforge engines to time: fused, grouped"
    )
    parser.add_argument("--repeats", type=int, default=3, help="interleaved timed rounds (medians reported)")
    parser.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default)")
    parser.add_argument("--append", action="store_true", help="add the records to the results file")
    parser.add_argument("--peak-repeats", type=int, default=5)
    parser.add_argument(
        "--device", default="cpu", help="cpu (the full study above) or cuda (`run_on_device`)"
    )
    parser.add_argument(
        "--project-operators",
        type=int,
        default=4,
        help="operators timed at 128^2 for the projection (0: scale)",
    )
    parser.add_argument("--project-steps", type=int, default=16)
    parser.add_argument(
        "--out", type=Path, default=None, help="records (default results/generate_random_cnn.json)"
    )
    args = parser.parse_args()
    args.engines = [e.strip() for e in args.engines.split(",") if e.strip()]
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    if args.quick:
        args.operators, args.steps, args.resolution, args.peak_repeats, args.repeats = 2, 8, 32, 2, 1
        args.project_operators = 0
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    records = run(args) if args.device == "cpu" else run_on_device(args, torch.device(args.device))
    if args.quick:
        print(json.dumps(records, indent=2))
    if args.append and out.exists():
        records = [*json.loads(out.read_text()), *records]
    atomic_write_json(out, records)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
