"""Alternative formulations of the random-CNN convolutions in bf16 on CPU, on the benchmark's own shapes.

The fused engine (random_cnn_fused.py) runs each operator's layers on its M realizations as
F.conv2d(wrapped input, weight) in bf16 channels-last (oneDNN; AMX on this CPU), valid padding on an input
already wrapped periodically. The grouped engine runs K operators of an architecture as one grouped
convolution (groups=K). This script times, in one process, on the conv shapes of
`benchmarks/generate_random_cnn.py`'s default workload (32 operators of the default space, seed 0, M = 3,
64x64, C = 3, each shape weighted by how many of those operators' layers have it):

- `conv2d`: the current call, F.conv2d on channels-last bf16 (reference for timing);
- `conv2d_prepacked`: oneDNN with the weight reordered once (torch.ops.mkldnn._convolution_pointwise with
  torch._C._nn.mkldnn_reorder_conv2d_weight; what inductor's freezing emits; left out on a CPU without
  oneDNN's bf16 path, e.g. AVX2 only);
- `im2col_mm`: "flat" im2col, no unfold: the wrapped NHWC input as one (M (n+2p)^2, C) matrix, the k^2 taps
  are contiguous row-shifted slices of it (outputs computed on the padded width, the extra columns dropped),
  concatenated along channels, then one bf16 matmul with the (k^2 C, Cout) weight;
- `tapsum_mm`: the same k^2 shifted slices each multiplied by its (C, Cout) tap weight (no im2col
  buffer), accumulated in float32;
- `compiled_conv_frozen`, `compiled_im2col_frozen`: the conv and `im2col_mm` as modules under
  torch.compile(mode="max-autotune") with inductor freezing (weights as constants: what the oneDNN weight
  prepacking and the C++ GEMM template with AMX micro-kernels need);
- `winograd_products_bound`: not a convolution, the batched matmul of Winograd F(2x2, kxk) alone (a lower
  bound on the time of a Winograd convolution built on torch.bmm);
- grouped forms (K operators, groups=K): `grouped_conv2d` against `grouped_bmm` (flat im2col per operator,
  one torch.bmm over K), and the grouped convolution against K per-operator calls of the same shape.

Measured here (one thread, torch 2.13.0; two runs, the second with one other job on the second core): the
engine's F.conv2d sustains 74-86% of the measured bf16 conv peak (which itself came out at 1420 and 1750
GFLOP/s in the two runs) over the workload's shape mix; its hidden layers
(16-64 channels in, 3x3 and 5x5) run at 80-105% of that peak, only the C=3 stems (100-400 GFLOP/s) and the
64->3 1x1 head (50 GFLOP/s) are far below it, and they are about 11% of the convolution time. No form
reaches the 1.3x over F.conv2d asked for: prepacked weights 1.10-1.17x on the mix (mostly on the small
shapes), max-autotune + freezing 0.67-0.68x (it keeps oneDNN over its AMX GEMM template and adds layout
copies), the matmul forms 0.07-0.16x (the gathered im2col buffer and bf16 outputs per tap cost more than the
convolution), grouped bmm 0.06-0.19x of the grouped convolution; the grouped convolution itself is slower
per FLOP than K per-operator calls (0.7-0.9x at K=4, 0.5-0.6x at K=16), which is why the fused engine runs
operators one at a time. The bf16 convolutions are therefore already close to this core's AMX throughput;
the 10x goal cannot come from a faster formulation of the same convolutions, only from less work elsewhere
(or fewer convolution FLOPs: but the batched bf16 matmul of a Winograd F(2x2, kxk) alone, before its
transforms, takes 1.6x the direct convolution's time over the mix (0.64x), so Winograd on torch.bmm cannot
win either).

Each form is checked against float32 F.conv2d of the same bf16-rounded inputs (relative max difference,
bf16 precision is about 4e-3). Times are process CPU time (one thread: the time of a quiet core), median
of `--repeats` rounds, forms interleaved within each round. Results: benchmarks/results/grouped_conv_forms.json.

    OMP_NUM_THREADS=1 python benchmarks/grouped_conv_forms.py [--quick] [--no-compile]

`--quick` is the smoke run (`make bench-smoke`): a 3x3 and a 1x1 shape at 16x16, one grouped shape, 2
repeats, no compile; not a figure: it writes to a temporary folder (smoke.quick_path) unless --out is given.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.random_cnn.system import RandomCNNSystem
from machine import load_note
from smoke import quick_path

RESULTS = Path(__file__).parent / "results" / "grouped_conv_forms.json"
BF16_TOLERANCE = 2e-2
"""Relative max difference (against float32 on the same bf16 inputs) within which a form counts as equal."""
WINOGRAD = "winograd_products_bound"
"""Not a convolution: the batched matmul of a Winograd F(2x2, kxk) convolution alone, without its input
and output transforms, i.e. a lower bound on the time of a Winograd convolution built on torch.bmm."""
Shape = tuple[int, int, int]  # (c_in, c_out, kernel)


def workload_shapes(operators: int, seed: int) -> Counter[Shape]:
    """The conv shapes of generate_random_cnn.py's default workload, counted over its operators' layers."""
    overrides = ["system.name=random_cnn", "system.channels=3", "system.resolution=64"]
    system = build_system(load_config(None, overrides).system)
    assert isinstance(system, RandomCNNSystem)
    batch = system.build_operators("train", 0, operators, seed)[0]
    shapes: Counter[Shape] = Counter()
    for layers in batch.layers:
        for layer in layers:
            c_out, c_in, k, _ = layer.weight.shape
            shapes[(c_in, c_out, k)] += 1
    return shapes


def bf16_cl(t: torch.Tensor) -> torch.Tensor:
    return t.to(torch.bfloat16).contiguous(memory_format=torch.channels_last)


def flat_offsets(k: int, padded: int) -> list[int]:
    """Row offsets of the k^2 taps in the flattened (rows of the padded grid) NHWC input."""
    return [i * padded + j for i in range(k) for j in range(k)]


def flat_rows(m: int, padded: int, k: int) -> int:
    """Output rows computed on the flat grid: every position whose taps stay inside the buffer."""
    return m * padded * padded - (k - 1) * padded - (k - 1)


def flat_to_nchw(out: torch.Tensor, m: int, n: int, padded: int) -> torch.Tensor:
    """(rows, Cout) flat outputs -> (M, Cout, n, n) channels-last view (the valid positions)."""
    total = m * padded * padded
    full = F.pad(out, (0, 0, 0, total - out.shape[0]))
    return full.view(m, padded, padded, -1)[:, :n, :n].permute(0, 3, 1, 2)


def im2col_mm(x2d: torch.Tensor, w2d: torch.Tensor, offsets: list[int], rows: int) -> torch.Tensor:
    cols = torch.cat([x2d[s : s + rows] for s in offsets], dim=1)
    return cols @ w2d


def tapsum_mm(x2d: torch.Tensor, taps: torch.Tensor, offsets: list[int], rows: int) -> torch.Tensor:
    out = torch.zeros(rows, taps.shape[2], dtype=torch.float32)
    for s, tap in zip(offsets, taps, strict=True):
        out += (x2d[s : s + rows] @ tap).to(torch.float32)  # in place on purpose: the accumulator
    return out


class FrozenConv(torch.nn.Module):
    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(weight, requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(x, self.weight)


class FrozenIm2col(torch.nn.Module):
    def __init__(self, w2d: torch.Tensor, offsets: list[int], rows: int) -> None:
        super().__init__()
        self.w2d = torch.nn.Parameter(w2d, requires_grad=False)
        self.offsets, self.rows = offsets, rows

    def forward(self, x2d: torch.Tensor) -> torch.Tensor:
        return im2col_mm(x2d, self.w2d, self.offsets, self.rows)


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max() / b.float().abs().max().clamp_min(1e-12))


def cpu_median(fn: Callable[[], object], inner: int) -> float:
    start = time.process_time()
    for _ in range(inner):
        fn()
    return (time.process_time() - start) / inner


def prepacked_weight(w: torch.Tensor, x: torch.Tensor) -> torch.Tensor | None:
    """oneDNN's reordered bf16 weight for inputs shaped like `x`; None where this CPU has no oneDNN bf16
    path (it needs AVX-512 BW/VL/DQ or AVX-NE-CONVERT: on an AVX2 machine the form is left out)."""
    try:
        return torch._C._nn.mkldnn_reorder_conv2d_weight(
            w.to_mkldnn(), [0, 0], [1, 1], [1, 1], 1, list(x.shape)
        )
    except RuntimeError as error:
        print(f"conv2d_prepacked left out: {error}")
        return None


def single_forms(
    c_in: int, c_out: int, k: int, m: int, n: int, compile_forms: bool
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, float], float]:
    """The per-operator forms for one shape, their relative differences to float32, and the FLOPs."""
    g = torch.Generator().manual_seed(c_in * 100 + c_out + k)
    padded = n + k - 1
    x = bf16_cl(torch.randn(m, c_in, padded, padded, generator=g, dtype=torch.float32))
    w = bf16_cl(torch.randn(c_out, c_in, k, k, generator=g, dtype=torch.float32) / (c_in * k * k) ** 0.5)
    exact = F.conv2d(x.float(), w.float())
    x2d = x.permute(0, 2, 3, 1).reshape(-1, c_in)  # free: channels-last memory is NHWC
    offsets, rows = flat_offsets(k, padded), flat_rows(m, padded, k)
    w2d = w.permute(2, 3, 1, 0).reshape(k * k * c_in, c_out).contiguous()  # (tap, c_in) x c_out
    taps = w2d.view(k * k, c_in, c_out)
    forms: dict[str, Callable[[], torch.Tensor]] = {
        "conv2d": lambda: F.conv2d(x, w),
        "im2col_mm": lambda: im2col_mm(x2d, w2d, offsets, rows),
        "tapsum_mm": lambda: tapsum_mm(x2d, taps, offsets, rows),
    }
    packed = prepacked_weight(w, x)
    if packed is not None:
        forms["conv2d_prepacked"] = lambda: torch.ops.mkldnn._convolution_pointwise(
            x, packed, None, [0, 0], [1, 1], [1, 1], 1, "none", [], ""
        )
    if compile_forms:
        # weights as frozen constants (inductor freezing): what max-autotune's C++ GEMM template and the
        # oneDNN weight prepacking of inductor need; compiled on the first call, inside the patch
        with torch._inductor.config.patch(freezing=True):
            conv_frozen = torch.compile(FrozenConv(w).eval(), mode="max-autotune", dynamic=False)
            conv_frozen(x)
            im2col_frozen = torch.compile(
                FrozenIm2col(w2d, offsets, rows).eval(), mode="max-autotune", dynamic=False
            )
            im2col_frozen(x2d)
        forms["compiled_conv_frozen"] = lambda: conv_frozen(x)
        forms["compiled_im2col_frozen"] = lambda: im2col_frozen(x2d)
    diffs = {}
    for name, fn in forms.items():
        out = fn()
        if out.dim() == 2:
            out = flat_to_nchw(out, m, n, padded)
        diffs[name] = relative(out, exact)
    if k > 1:  # Winograd F(2x2, kxk): (k+1)^2 tile positions, M (n/2)^2 tiles; the products only
        tiles = torch.randn((k + 1) ** 2, m * (n // 2) ** 2, c_in, generator=g, dtype=torch.float32)
        tile_weights = torch.randn((k + 1) ** 2, c_in, c_out, generator=g, dtype=torch.float32)
        tiles, tile_weights = tiles.to(torch.bfloat16), tile_weights.to(torch.bfloat16)
        forms[WINOGRAD] = lambda: torch.bmm(tiles, tile_weights)
    return forms, diffs, 2.0 * m * n * n * c_out * c_in * k * k


def grouped_forms(
    c_in: int, c_out: int, k: int, m: int, n: int, groups: int
) -> tuple[dict[str, Callable[[], torch.Tensor]], dict[str, float], float]:
    g = torch.Generator().manual_seed(c_in * 100 + c_out + k + groups)
    padded = n + k - 1
    x = bf16_cl(torch.randn(m, groups * c_in, padded, padded, generator=g, dtype=torch.float32))
    w = bf16_cl(
        torch.randn(groups * c_out, c_in, k, k, generator=g, dtype=torch.float32) / (c_in * k * k) ** 0.5
    )
    exact = F.conv2d(x.float(), w.float(), groups=groups)
    offsets, rows = flat_offsets(k, padded), flat_rows(m, padded, k)
    w3d = (
        w.view(groups, c_out, c_in, k, k)
        .permute(0, 3, 4, 2, 1)
        .reshape(groups, k * k * c_in, c_out)
        .contiguous()
    )

    def bmm_form() -> torch.Tensor:
        # (K, M padded^2, C): one copy to operator-major (the layout the engine would keep between layers)
        x3d = x.permute(0, 2, 3, 1).reshape(-1, groups, c_in).transpose(0, 1)
        cols = torch.cat([x3d[:, s : s + rows] for s in offsets], dim=2)
        return torch.bmm(cols, w3d)

    def bmm_to_nchw(out: torch.Tensor) -> torch.Tensor:
        return torch.cat([flat_to_nchw(o, m, n, padded) for o in out], dim=1)

    forms = {"grouped_conv2d": lambda: F.conv2d(x, w, groups=groups), "grouped_bmm": bmm_form}
    diffs = {
        "grouped_conv2d": relative(forms["grouped_conv2d"](), exact),
        "grouped_bmm": relative(bmm_to_nchw(bmm_form()), exact),
    }
    return forms, diffs, 2.0 * m * n * n * groups * c_out * c_in * k * k


def bf16_conv_peak(repeats: int) -> float:
    """GFLOP/s (CPU time, best of `repeats`) of a large 3x3 bf16 channels-last convolution, as measured by
    generate_random_cnn.py: the machine's bf16 convolution peak."""
    x = bf16_cl(torch.randn(16, 128, 64, 64, dtype=torch.float32))
    w = bf16_cl(torch.randn(128, 128, 3, 3, dtype=torch.float32))
    F.conv2d(x, w, padding=1)
    best = min(cpu_median(lambda: F.conv2d(x, w, padding=1), 1) for _ in range(repeats))
    return 2 * 16 * 128 * 128 * 9 * 64 * 64 / best / 1e9


def time_forms(forms: dict[str, Callable[[], torch.Tensor]], repeats: int, inner: int) -> dict[str, float]:
    for fn in forms.values():
        fn()
        fn()
    times: dict[str, list[float]] = {name: [] for name in forms}
    for _ in range(repeats):
        for name, fn in forms.items():
            times[name].append(cpu_median(fn, inner))
    return {name: statistics.median(t) for name, t in times.items()}


def per_operator_note(per_shape: list[dict], shape: Shape, groups: int, grouped_seconds: float) -> str:
    """How the grouped convolution compares with K per-operator convolutions of the same shape (the fused
    engine's way), when that shape was timed in the mix."""
    for row in per_shape:
        if tuple(row["shape"]) == shape:
            single = row["ms"]["conv2d"] * groups
            return (
                f"; the same work as {groups} per-operator conv2d calls (the fused engine): {single:.2f} ms "
                f"against {grouped_seconds * 1e3:.2f} ms grouped ({single / (grouped_seconds * 1e3):.2f}x)"
            )
    return ""


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 2 shapes at 16x16, one grouped shape, few repeats, no compile",
    )
    parser.add_argument("--operators", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--realizations", type=int, default=3)
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--inner", type=int, default=5)
    parser.add_argument("--groups", type=int, nargs="*", default=[4, 16], help="K of the grouped comparison")
    parser.add_argument("--no-compile", action="store_true", help="skip torch.compile(max-autotune)")
    parser.add_argument(
        "--out", type=Path, default=None, help="records (default results/grouped_conv_forms.json)"
    )
    args = parser.parse_args()
    shapes = workload_shapes(args.operators, args.seed)
    m, n = args.realizations, args.resolution
    if args.quick:
        shapes = Counter({(32, 64, 3): 1, (64, 64, 1): 1})  # a 3x3 and a 1x1 (no Winograd) layer
        args.repeats, args.inner, n, args.groups, args.no_compile = 2, 1, 16, [4], True
    grouped_shapes = [(32, 64, 3)] if args.quick else [(32, 64, 3), (64, 64, 3), (64, 64, 5)]
    records = []
    totals: Counter[str] = Counter()
    flops_total = 0.0
    worst: dict[str, float] = {}
    per_shape = []
    # one compiled graph per shape and form (the modules share their forward code objects)
    torch._dynamo.config.recompile_limit = 4 * len(shapes) + 8
    with torch.inference_mode():
        peak = bf16_conv_peak(args.repeats)
        print(f"bf16 conv peak (large 3x3, channels-last): {peak:.0f} GFLOP/s CPU time")
        for (c_in, c_out, k), count in sorted(shapes.items()):
            forms, diffs, flops = single_forms(c_in, c_out, k, m, n, not args.no_compile)
            times = time_forms(forms, args.repeats, args.inner)
            times.setdefault(WINOGRAD, times["conv2d"])  # 1x1: no Winograd, the convolution itself
            flops_total += flops * count
            for name, t in times.items():
                totals[name] += t * count
                worst[name] = max(worst.get(name, 0.0), diffs.get(name, 0.0))
            line = ", ".join(
                f"{name} {t * 1e3:.3f} ms ({flops / t / 1e9:.0f} GF/s, diff {diffs.get(name, float('nan')):.1e})"
                for name, t in times.items()
            )
            print(f"{c_in}->{c_out} k{k} x{count}: {line}")
            per_shape.append(
                {"shape": [c_in, c_out, k], "count": count, "ms": {a: b * 1e3 for a, b in times.items()}}
            )
        grouped = []
        for groups in args.groups:
            for c_in, c_out, k in grouped_shapes:
                forms, diffs, flops = grouped_forms(c_in, c_out, k, m, n, groups)
                times = time_forms(forms, args.repeats, args.inner)
                line = ", ".join(
                    f"{name} {t * 1e3:.2f} ms ({flops / t / 1e9:.0f} GF/s, diff {diffs[name]:.1e})"
                    for name, t in times.items()
                )
                print(f"K={groups} {c_in}->{c_out} k{k}: {line}")
                grouped.append((groups, c_in, c_out, k, times, diffs, flops))

    environment = (
        f"{platform.machine()}, {os.cpu_count()} cores, torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads"
    )
    notes_common = (
        f"{environment}; {load_note()} when written; process CPU time, median of "
        f"{args.repeats} interleaved rounds of {args.inner} calls"
    )
    case = (
        f"conv shape mix of generate_random_cnn ({args.operators} ops, seed {args.seed}), M={m}, {n}^2, bf16"
    )
    base = totals["conv2d"]
    print(
        "shape mix totals (ms per step of all operators): "
        + ", ".join(f"{a} {b * 1e3:.1f}" for a, b in totals.items())
    )
    records.append(
        {
            "case": case,
            "baseline": "bf16 conv peak (16x128x64x64, 3x3, channels-last, measured in the same process)",
            "metric": "GFLOP/s (CPU time) of F.conv2d over the shape mix",
            "dynaforge": flops_total / base / 1e9,
            "baseline_value": peak,
            "ratio": flops_total / base / 1e9 / peak,
            "notes": (
                f"{notes_common}; ratio = fraction of the measured bf16 conv peak the engine's current "
                "convolution call sustains on the workload's shapes (each shape weighted by its layer count); "
                "per-shape ms: "
                + "; ".join(f"{s['shape']} x{s['count']}: {s['ms']['conv2d']:.3f}" for s in per_shape)
            ),
        }
    )
    for name, total in totals.items():
        if name == "conv2d":
            continue
        records.append(
            {
                "case": case,
                "baseline": "F.conv2d bf16 channels-last (the fused engine's call)",
                "metric": "GFLOP/s (CPU time) over the shape mix",
                "dynaforge": flops_total / total / 1e9,
                "baseline_value": flops_total / base / 1e9,
                "ratio": base / total,
                "notes": (
                    f"{notes_common}; form {name}; "
                    + (
                        "NOT a full convolution: the bf16 batched matmul of Winograd F(2x2, kxk) alone, no "
                        "transforms (a lower bound; 1x1 layers counted at conv2d's time); "
                        if name == WINOGRAD
                        else ""
                    )
                    + (
                        ""
                        if name == WINOGRAD
                        else f"worst relative max diff vs float32 on the same bf16 inputs "
                        f"{worst[name]:.1e} (conv2d itself {worst['conv2d']:.1e}); "
                    )
                    + "per-shape ms: "
                    + "; ".join(
                        f"{s['shape']} x{s['count']}: {s['ms'][name]:.3f} vs {s['ms']['conv2d']:.3f}"
                        for s in per_shape
                    )
                ),
            }
        )
    for groups, c_in, c_out, k, times, diffs, flops in grouped:
        records.append(
            {
                "case": f"grouped conv K={groups} {c_in}->{c_out} k{k}, M={m}, {n}^2, bf16",
                "baseline": "F.conv2d(groups=K) bf16 channels-last (the grouped engine's call)",
                "metric": "GFLOP/s (CPU time)",
                "dynaforge": flops / times["grouped_bmm"] / 1e9,
                "baseline_value": flops / times["grouped_conv2d"] / 1e9,
                "ratio": times["grouped_conv2d"] / times["grouped_bmm"],
                "notes": (
                    f"{notes_common}; form grouped_bmm (flat im2col per operator + one torch.bmm over K, "
                    f"including the copy to operator-major layout); relative max diff {diffs['grouped_bmm']:.1e} "
                    f"(grouped conv2d {diffs['grouped_conv2d']:.1e})"
                    + per_operator_note(per_shape, (c_in, c_out, k), groups, times["grouped_conv2d"])
                ),
            }
        )
    for r in records:
        print(f"{r['case']}: ratio {r['ratio']:.2f}")
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    atomic_write_json(out, records)
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
