"""Generation throughput of the batched PDE solvers, in sample-steps per second.

Three cases, all at ETDRK order 2 (exponax's default) and float32 (both libraries' default):
- Burgers (issue 2): domain length 1, N = 256, viscosity 0.01, dt 0.01, 256 samples x 200 steps;
- KS (issue 2): N = 200, L = 100, dt 0.1, 256 samples x 500 steps;
- Navier-Stokes 2D (issue 5): vorticity form, 128 x 128, L = 2 pi, nu = 1e-3, no drag or forcing,
  dt 0.01, 32 samples x 50 steps.

Baselines, measured in the same process from the same initial conditions:
- a per-sample Python loop over the same dynaforge solver (one `rollout` per sample);
- exponax (JAX): `jax.jit(jax.vmap(exponax.rollout(stepper, steps, include_init=True)))`, the way its
  documentation batches trajectories.

Both solvers solve the same discrete problem. exponax writes every PDE with all terms on the right-hand side
and the derivative operator i k; its `Burgers` is u_t + b/2 (u^2)_x = nu u_xx with b = 1 (the
`conservative=True` form, so that both codes evaluate the same pseudo-spectral product (u^2)_x; its
default non-conservative form evaluates u u_x with one more transform), and `KuramotoSivashinskyConservative`
is u_t + b/2 (u^2)_x + psi_1 u_xx + psi_2 u_xxxx = 0 with b = psi_1 = psi_2 = 1. Its `NavierStokesVorticity`
is w_t + b ([1, -1] * grad(inverse_laplacian(w))) . grad(w) = lambda w + nu laplacian(w), i.e. a stream
function with laplacian(psi) = +w, where dynaforge (and the usual physics convention, w = v_x - u_y) has
laplacian(psi) = -w with the same velocity (psi_y, -psi_x): the advecting velocities differ in sign, so the
same PDE is exponax's with b = -1 (and lambda = -drag = 0). Both truncate the state before the products and
the product after. exponax keeps modes with |m| <= f (N // 2) - 1 on every axis in nonlinear products; f is
chosen so that it keeps exactly the modes dynaforge's 2/3 rule keeps (3 |m| < N), which the script checks. Timings exclude the first call (JIT compilation for
exponax; lazy initialisation for torch), whose duration is reported separately; dynaforge's timed calls
include its coefficient set-up, exponax's stepper is built once outside the timed region.

Run: `.venv-bench/bin/python benchmarks/generate_pde.py [--quick] [--cases navier_stokes_2d]` (or `make bench`).
Writes benchmarks/results/generate_pde.json (one record per case and baseline; ratio > 1: dynaforge faster).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import SpectralSystem, dealias_mask
from machine import load_note

RESULTS = Path(__file__).resolve().parent / "results" / "generate_pde.json"
QUICK_RESULTS = RESULTS.with_name("generate_pde.quick.json")  # a smoke run never overwrites real figures
ORDER = 2
SEED = 2024


@dataclass(frozen=True)
class Case:
    """One benchmark setting: the system and its constant parameters, the grid, step and batch size."""

    name: str
    system: str
    resolution: int
    domain_length: float
    dt: float
    samples: int
    steps: int
    viscosity: float | None = None  # Burgers and Navier-Stokes
    ndim: int = 1

    def overrides(self, dtype: str) -> list[str]:
        return [
            f"system.name={self.system}",
            f"system.resolution={self.resolution}",
            f"system.domain_length={self.domain_length}",
            f"system.dt={self.dt}",
            f"system.steps={self.steps}",
            "system.save_every=1",
            f"system.order={ORDER}",
            f"system.dtype={dtype}",
            *([f"system.viscosity={self.viscosity}"] if self.viscosity is not None else []),
        ]

    def label(self) -> str:
        grid = "x".join([str(self.resolution)] * self.ndim)
        nu = f", nu={self.viscosity:g}" if self.viscosity is not None and self.ndim > 1 else ""
        return (
            f"{self.name}: N={grid}, L={self.domain_length:g}{nu}, dt={self.dt:g}, "
            f"{self.samples} samples x {self.steps} steps, ETDRK{ORDER}, float32"
        )


CASES = (
    Case("burgers", "burgers", 256, 1.0, 0.01, 256, 200, viscosity=0.01),
    Case("ks", "ks", 200, 100.0, 0.1, 256, 500),
    Case("navier_stokes_2d", "navier_stokes", 128, 2 * math.pi, 0.01, 32, 50, viscosity=1e-3, ndim=2),
)


def quick_case(case: Case) -> Case:
    """A smoke-run version: fewer samples and steps, same grid and step."""
    return dataclasses.replace(case, samples=min(case.samples, 8 if case.ndim > 1 else 32), steps=40)


# --------------------------------------------------------------------------------------------------
# Timing


@dataclass(frozen=True)
class Timing:
    """The first (warm-up) call and the median of the timed calls, in seconds (wall; and process CPU)."""

    warmup: float
    median: float
    runs: tuple[float, ...]
    cpu_median: float


def time_calls(run: Callable[[], object], repeats: int) -> Timing:
    (timing,) = time_interleaved([run], repeats)
    return timing


def time_interleaved(runs: list[Callable[[], object]], repeats: int) -> list[Timing]:
    """First calls (warm-up) of every function, then `repeats` rounds that call each once in turn, so that
    the load of a shared machine, which drifts over seconds, weighs on all of them alike."""
    warmups = []
    for run in runs:
        start = time.perf_counter()
        run()
        warmups.append(time.perf_counter() - start)
    timed: list[list[float]] = [[] for _ in runs]
    cpu: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, times, cpu_times in zip(runs, timed, cpu):
            start, cpu_start = time.perf_counter(), time.process_time()
            run()
            times.append(time.perf_counter() - start)
            cpu_times.append(time.process_time() - cpu_start)
    return [
        Timing(w, statistics.median(t), tuple(t), statistics.median(c))
        for w, t, c in zip(warmups, timed, cpu)
    ]


# --------------------------------------------------------------------------------------------------
# dynaforge


def dynaforge_system(case: Case, dtype: str = "float32") -> SpectralSystem:
    return build_system(load_config(None, case.overrides(dtype)).system)


def initial_batch(system: SpectralSystem, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameters and initial fields drawn by dynaforge's own families (the config's defaults)."""
    rngs = [np.random.default_rng([SEED, i]) for i in range(samples)]
    return system.draw_samples(rngs)


def dynaforge_batched(system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return system.rollout(initial, params).fields


def dynaforge_loop(system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode():
        return torch.cat(
            [system.rollout(initial[i : i + 1], params[i : i + 1]).fields for i in range(len(params))]
        )


# --------------------------------------------------------------------------------------------------
# exponax


def exponax_dealiasing_fraction(resolution: int) -> float:
    """f such that exponax's kept modes |m| <= f (N // 2) - 1 are dynaforge's 3 |m| < N."""
    highest_kept = (resolution - 1) // 3
    return (highest_kept + 1.5) / (resolution // 2)


def exponax_stepper(case: Case) -> object:  # an exponax stepper (exponax is a benchmark-only import)
    import exponax

    fraction = exponax_dealiasing_fraction(case.resolution)
    common = {"order": ORDER, "dealiasing_fraction": fraction}
    if case.system == "navier_stokes":
        return exponax.stepper.NavierStokesVorticity(
            2, case.domain_length, case.resolution, case.dt, diffusivity=case.viscosity,
            vorticity_convection_scale=-1.0, drag=0.0, **common,
        )  # fmt: skip
    if case.system == "burgers":
        return exponax.stepper.Burgers(
            1, case.domain_length, case.resolution, case.dt, diffusivity=case.viscosity, convection_scale=1.0,
            conservative=True, **common,
        )  # fmt: skip
    return exponax.stepper.KuramotoSivashinskyConservative(
        1, case.domain_length, case.resolution, case.dt, convection_scale=1.0, second_order_scale=1.0,
        fourth_order_scale=1.0, **common,
    )  # fmt: skip


def check_same_dealiasing(case: Case) -> None:
    import exponax

    fraction = exponax_dealiasing_fraction(case.resolution)
    highest_resolved = case.resolution // 2
    cutoff = fraction * highest_resolved - 1  # exponax's rule (nonlin_fun/_base.py), cutoff inclusive
    theirs = np.asarray(exponax.spectral.low_pass_filter_mask(case.ndim, case.resolution, cutoff=cutoff))
    shape = (case.resolution,) * case.ndim
    ours = dealias_mask(shape, torch.device("cpu"), torch.float32).numpy().astype(bool)
    theirs = theirs.reshape(ours.shape)
    if not np.array_equal(theirs, ours):
        raise RuntimeError(f"{case.name}: exponax and dynaforge dealias different modes")


def exponax_rollout(case: Case) -> Callable[[np.ndarray], np.ndarray]:
    import exponax
    import jax

    trajectories = jax.jit(jax.vmap(exponax.rollout(exponax_stepper(case), case.steps, include_init=True)))

    def run(initial: np.ndarray) -> np.ndarray:
        return trajectories(initial).block_until_ready()

    return run


def exponax_version() -> str:
    import exponax
    import jax

    return f"exponax {exponax.__version__} (jax {jax.__version__})"


# --------------------------------------------------------------------------------------------------
# One case


def run_case(case: Case, repeats: int) -> list[dict[str, object]]:
    system = dynaforge_system(case)
    params, initial64 = initial_batch(system, case.samples)
    initial = initial64.to(torch.float32)
    sample_steps = case.samples * case.steps

    check_same_dealiasing(case)
    exponax_run = exponax_rollout(case)
    initial_np = initial.numpy()
    batched, exp_timing = time_interleaved(
        [lambda: dynaforge_batched(system, params, initial), lambda: exponax_run(initial_np)], repeats
    )
    fields = dynaforge_batched(system, params, initial).numpy()
    exp_fields = np.asarray(exponax_run(initial_np))
    dyn_rate = sample_steps / batched.median

    # The loop's first call is a full pass too (its warm-up is in any case a single-sample rollout).
    loop = time_calls(lambda: dynaforge_loop(system, params, initial), 1)
    loop_rate = sample_steps / loop.median

    exp_rate = sample_steps / exp_timing.median

    # Accuracy: both float32 runs against each other and against dynaforge's float64 run of the same scheme
    # from the same initial fields (for the chaotic KS, tiny float32 differences grow exponentially with t,
    # so the float32 -> float64 difference of each solver is the floor any comparison can reach).
    reference = dynaforge_batched(dynaforge_system(case, "float64"), params, initial64).numpy()
    early = max(1, case.steps // 10) + 1  # the first 10 % of the horizon, before chaotic growth dominates
    diff_all = float(np.abs(fields - exp_fields).max())
    diff_early = float(np.abs(fields[:, :early] - exp_fields[:, :early]).max())
    dyn_vs_64 = float(np.abs(fields - reference).max())
    exp_vs_64 = float(np.abs(exp_fields - reference).max())
    scale = float(np.abs(reference).max())
    horizon = case.steps * case.dt

    print(f"\n{case.label()}")
    print(
        f"  dynaforge batched : {dyn_rate:12.0f} sample-steps/s  (median {batched.median:.3f} s, first call {batched.warmup:.3f} s)"
    )
    print(
        f"  per-sample loop   : {loop_rate:12.0f} sample-steps/s  ({loop.median:.2f} s)  ratio {dyn_rate / loop_rate:.2f}"
    )
    print(
        f"  exponax           : {exp_rate:12.0f} sample-steps/s  (median {exp_timing.median:.3f} s, first call incl. JIT {exp_timing.warmup:.3f} s)  ratio {dyn_rate / exp_rate:.2f}"
    )
    print(
        f"  max |dynaforge - exponax|: {diff_all:.2e} over t <= {horizon:g}, {diff_early:.2e} over t <= {(early - 1) * case.dt:g} (max |u| = {scale:.2f})"
    )
    print(f"  max |float32 - float64 dynaforge|: dynaforge {dyn_vs_64:.2e}, exponax {exp_vs_64:.2e}")

    environment = (
        f"torch {torch.__version__} with {torch.get_num_threads()} intra-op threads, "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')!r}, Python {platform.python_version()}, "
        f"{platform.machine()} with {os.cpu_count()} cores; {load_note()} when written"
    )
    accuracy = (
        f"max |dynaforge - exponax| = {diff_all:.2e} over all {case.steps + 1} frames (t <= {horizon:g}), "
        f"{diff_early:.2e} for t <= {(early - 1) * case.dt:g}; against dynaforge float64: dynaforge float32 "
        f"{dyn_vs_64:.2e}, exponax {exp_vs_64:.2e}; max |u| = {scale:.2f}"
    )
    label = case.label()
    return [
        {
            "case": label,
            "baseline": "per-sample Python loop over the same dynaforge solver",
            "metric": "sample-steps/s",
            "dynaforge": dyn_rate,
            "baseline_value": loop_rate,
            "ratio": dyn_rate / loop_rate,
            "notes": (
                f"dynaforge batched median of {repeats} runs {batched.median:.4f} s (first call "
                f"{batched.warmup:.4f} s); loop over the samples one at a time, "
                f"{loop.median:.3f} s (first call {loop.warmup:.3f} s); {environment}"
            ),
        },
        {
            "case": label,
            "baseline": f"{exponax_version()}, jit(vmap(rollout))",
            "metric": "sample-steps/s",
            "dynaforge": dyn_rate,
            "baseline_value": exp_rate,
            "ratio": dyn_rate / exp_rate,
            "notes": (
                f"medians of {repeats} interleaved runs: dynaforge {batched.median:.4f} s (first call {batched.warmup:.4f} s), "
                f"exponax {exp_timing.median:.4f} s (first call incl. JIT {exp_timing.warmup:.4f} s); process CPU "
                f"time medians dynaforge {batched.cpu_median:.4f} s, exponax {exp_timing.cpu_median:.4f} s "
                f"(ratio {exp_timing.cpu_median / batched.cpu_median:.2f}); "
                f"{accuracy}; {environment}"
            ),
        },
    ]


def set_threads(threads: int) -> None:
    """Limit torch and XLA (which reads XLA_FLAGS when jax is first imported, later in this process)."""

    if "jax" in sys.modules:
        raise RuntimeError("set_threads must run before jax is imported")
    torch.set_num_threads(threads)
    flags = f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: 32 samples x 40 steps, 1 repeat")
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="intra-op threads for torch and XLA alike (default 0: each library's default, all cores); "
        "1 gives steadier figures on a loaded machine",
    )
    parser.add_argument("--repeats", type=int, default=7, help="timed runs per solver (median reported)")
    parser.add_argument(
        "--cases",
        default="",
        help="comma-separated case names to run (default all: burgers, ks, navier_stokes_2d); the other "
        "cases' records already in the results file are kept",
    )
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON records (default {RESULTS.name}, quick: {QUICK_RESULTS.name})",
    )
    args = parser.parse_args()
    if args.threads > 0:
        set_threads(args.threads)
    chosen = [c for c in CASES if not args.cases or c.name in args.cases.split(",")]
    if not chosen:
        raise SystemExit(f"--cases {args.cases!r} names none of: {', '.join(c.name for c in CASES)}")
    cases = [quick_case(c) for c in chosen] if args.quick else chosen
    repeats = 1 if args.quick else args.repeats
    records = []
    for case in cases:
        records.extend(run_case(case, repeats))
    out = args.out or (QUICK_RESULTS if args.quick else RESULTS)
    if args.cases and out.exists():  # keep the other cases' records from an earlier run
        ran = {record["case"] for record in records}
        records = [r for r in json.loads(out.read_text()) if r["case"] not in ran] + records
    atomic_write_json(out, records)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
