"""Generation throughput of the batched PDE solvers against exponax, in sample-steps per second, beside the
time of the FFTs a step must do (the solver's floor on this machine).

Ten cases, every PDE exponax also solves, each at a small and a large grid, all at ETDRK order 2
(exponax's default) and float32 (both libraries' default): Burgers N = 256 (nu 0.01) and N = 1024 (nu 0.002,
dt 0.002); KS 1D N = 200 (L = 100) and N = 512 (L = 256); KS 2D 64^2 (L = 32) and 128^2 (L = 64);
Navier-Stokes 2D 128^2 (nu 1e-3) and 256^2 (nu 5e-4, dt 0.005); Gray-Scott 64^2 and 128^2 (Pearson's
defaults, dt 1). Each runs at 1 and 2 threads (`--threads 1,2`: one process per count, since XLA reads its
thread count once), with the machine named in every record (`benchmarks/machine.py`). Below the machine's
core count the process is held to that many cores (`set_threads`): XLA's runtime otherwise spreads a
"1-thread" rollout over two threads.

The limit: `fft_floor` records every torch.fft call one step of one block makes (same shapes, strides and
dtypes) and replays them alone; each record's `limit` holds the sample-steps/s those transforms allow and
each solver's step time as a multiple of them (1.0: nothing but the FFTs).

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
exponax; lazy initialisation for torch), whose duration is reported separately. Each solver's coefficients
are set up once, outside the timed calls: exponax's stepper is built before them, and dynaforge's system keeps
the operators the first call set up (`SpectralSystem.shared_operators`, as the generate stage keeps them from
one batch to the next; records before 2026-11-29 13:30 UTC timed dynaforge's set-up in every call).

Matching the equations: for KS 2D, exponax's `KuramotoSivashinsky` takes the bilaplacian without mixed
terms (sum_i k_i^4) and removes the mean of the nonlinear term; the benchmark gives it dynaforge's isotropic
(k_x^2 + k_y^2)^2 (`isotropic_ks_stepper`) and compares the fields without their spatial mean, which never
feeds back. For Gray-Scott the PDE is the same but the split is not (`GRAY_SCOTT_SPLIT`): the fields differ by
the splitting error. dynaforge runs as its generate stage does, with subnormals flushed (XLA flushes them too).

Run: `.venv-bench/bin/python benchmarks/generate_pde.py [--quick] [--threads 1,2] [--cases ks2d_64]` (or
`make bench`); about 5 minutes for both thread counts.
Writes benchmarks/results/generate_pde.json (one record per case and baseline; ratio > 1: dynaforge faster).
`--quick` is the smoke run (`make bench-smoke`): each PDE's first case (unless --cases) and every baseline
at a few samples and steps (`quick_case`), one thread, one timed call, the fused step included; not a figure,
written to a temporary folder (smoke.quick_path) unless --out is given.

`--fused` also times `system.fused: true` (the elementwise stages of each step compiled by torch.compile; on a
GPU replayed from CUDA graphs like the default step) from the same initial fields: records against exponax
and against the default step, with the largest difference between the two steps' trajectories. Its first
call, which compiles, is reported apart.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.floating import flush_denormals
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import SpectralSystem, dealias_mask
from dynaforge.threads import on_one_thread
from machine import device_name, load_note, machine_name
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "generate_pde.json"
ORDER = 2
SEED = 2024
GRAY_SCOTT_SPLIT = (
    "same PDE, split differently: dynaforge treats -F u and -(F + k) v with the diffusion in the exact "
    "linear part, exponax evaluates them with the reaction in its nonlinear function, so the two "
    "ETDRK2 solutions differ by the splitting error, not round-off"
)


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
    loop: bool = False  # also time the per-sample Python loop (slow: the first three cases only)

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
            f"system.ndim={self.ndim}",
            *([f"system.viscosity={self.viscosity}"] if self.viscosity is not None else []),
        ]

    def label(self) -> str:
        grid = "x".join([str(self.resolution)] * self.ndim)
        nu = f", nu={self.viscosity:g}" if self.viscosity is not None else ""
        return (
            f"{self.name}: N={grid}, L={self.domain_length:g}{nu}, dt={self.dt:g}, "
            f"{self.samples} samples x {self.steps} steps, ETDRK{ORDER}, float32"
        )


CASES = (
    # The three cases of earlier records (with the per-sample loop), then a larger grid of each and the
    # other PDEs exponax also solves, each at a small and a large grid.
    Case("burgers", "burgers", 256, 1.0, 0.01, 256, 200, viscosity=0.01, loop=True),
    Case("burgers_1024", "burgers", 1024, 1.0, 0.002, 64, 250, viscosity=0.002),
    Case("ks", "ks", 200, 100.0, 0.1, 256, 500, loop=True),
    Case("ks_512", "ks", 512, 256.0, 0.1, 64, 400),
    Case("ks2d_64", "ks2d", 64, 32.0, 0.05, 32, 100, ndim=2),
    Case("ks2d_128", "ks2d", 128, 64.0, 0.05, 16, 50, ndim=2),
    Case("navier_stokes_2d", "navier_stokes", 128, 2 * math.pi, 0.01, 32, 50, viscosity=1e-3, ndim=2, loop=True),
    Case("navier_stokes_256", "navier_stokes", 256, 2 * math.pi, 0.005, 8, 25, viscosity=5e-4, ndim=2),
    Case("gray_scott_64", "gray_scott", 64, 2.5, 1.0, 32, 100, ndim=2),
    Case("gray_scott_128", "gray_scott", 128, 2.5, 1.0, 16, 100, ndim=2),
)  # fmt: skip


def selected_cases(names: str, quick: bool) -> list[Case]:
    """The cases `names` lists (comma-separated; all when empty); a smoke run without names takes each PDE
    once, at its smaller grid. Exits with the known names when `names` matches none."""
    chosen = [c for c in CASES if not names or c.name in names.split(",")]
    if not chosen:
        raise SystemExit(f"--cases {names!r} names none of: {', '.join(c.name for c in CASES)}")
    if quick and not names:
        chosen = [c for i, c in enumerate(chosen) if c.system not in {d.system for d in chosen[:i]}]
    return chosen


def add_out_argument(parser: argparse.ArgumentParser, results: Path) -> None:
    """`--out`, where a benchmark writes its records (`results` by default; a smoke run, a temporary folder)."""
    parser.add_argument(
        "--out",
        type=Path,
        default=None,
        help=f"JSON records (default {results.name}; --quick: a temporary folder)",
    )


def quick_case(case: Case) -> Case:
    """A smoke-run version: fewer samples and steps, same grid and step."""
    return dataclasses.replace(case, samples=min(case.samples, 2 if case.ndim > 1 else 4), steps=10)


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


def dynaforge_system(case: Case, dtype: str = "float32", fused: bool = False) -> SpectralSystem:
    overrides = case.overrides(dtype) + ["system.fused=true"] * fused
    return build_system(load_config(None, overrides).system)


def initial_batch(system: SpectralSystem, samples: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Parameters and initial fields drawn by dynaforge's own families (the config's defaults)."""
    rngs = [np.random.default_rng([SEED, i]) for i in range(samples)]
    return system.draw_samples(rngs)


def dynaforge_batched(
    system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor, cuda_graph: bool = True
) -> torch.Tensor:
    """The rollout as the generate stage runs it: subnormals flushed (store/writer.py); on a GPU each
    block's steps replayed from a CUDA graph unless `cuda_graph` is false."""
    with torch.inference_mode(), flush_denormals():
        return system.rollout(initial, params, cuda_graph=cuda_graph).fields


def dynaforge_loop(system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor) -> torch.Tensor:
    with torch.inference_mode(), flush_denormals():
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
    """exponax's stepper of the same PDE, its constants read from dynaforge's config of the case."""
    import exponax

    config = dynaforge_system(case).config
    fraction = exponax_dealiasing_fraction(case.resolution)
    grid = (case.ndim, case.domain_length, case.resolution, case.dt)
    common = {"order": ORDER, "dealiasing_fraction": fraction}
    if case.system == "navier_stokes":
        return exponax.stepper.NavierStokesVorticity(
            *grid, diffusivity=case.viscosity, vorticity_convection_scale=-1.0, drag=0.0, **common
        )
    if case.system == "burgers":
        return exponax.stepper.Burgers(
            *grid, diffusivity=case.viscosity, convection_scale=1.0, conservative=True, **common
        )
    if case.system == "ks2d":
        return isotropic_ks_stepper()(
            *grid, gradient_norm_scale=1.0, second_order_scale=1.0, fourth_order_scale=1.0, **common
        )
    if case.system == "gray_scott":
        return exponax.stepper.reaction.GrayScott(
            *grid, diffusivity_1=config.diffusion_u.low, diffusivity_2=config.diffusion_v.low,
            feed_rate=config.feed.low, kill_rate=config.kill.low, **common,
        )  # fmt: skip
    return exponax.stepper.KuramotoSivashinskyConservative(
        *grid, convection_scale=1.0, second_order_scale=1.0, fourth_order_scale=1.0, **common
    )


def isotropic_ks_stepper() -> type:
    """exponax's `KuramotoSivashinsky` with the isotropic bilaplacian (k_x^2 + k_y^2)^2 of dynaforge's KS 2D:
    exponax's own builds sum_i k_i^4 ("without spatial mixing"), a different PDE in 2D. Same cost."""
    import exponax

    class IsotropicKuramotoSivashinsky(exponax.stepper.KuramotoSivashinsky):
        def _build_linear_operator(self, derivative_operator):
            laplace = exponax.spectral.build_laplace_operator(derivative_operator, order=2)
            return -self.second_order_scale * laplace - self.fourth_order_scale * laplace**2

    return IsotropicKuramotoSivashinsky


def comparable(case: Case, fields: np.ndarray) -> np.ndarray:
    """The part of a state both solvers define alike: for KS 2D all but the spatial mean (exponax removes
    the mean of |grad h|^2 / 2, dynaforge lets the mean drift; the mean never feeds back into the other
    modes, which only see gradients)."""
    if case.system == "ks2d":
        return fields - fields.mean(axis=(-2, -1), keepdims=True)
    return fields


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


def jax_devices() -> str:
    import jax

    return ", ".join(str(d) for d in jax.devices())


def exponax_version() -> str:
    import exponax
    import jax

    return f"exponax {exponax.__version__} (jax {jax.__version__})"


# --------------------------------------------------------------------------------------------------
# One case


NOT_TRANSFORMS = ("fft_fftfreq", "fft_rfftfreq", "fft_fftshift", "fft_ifftshift")
"""torch.fft functions that transform nothing (the wavenumbers a set-up builds)."""


class FFTRecorder(TorchDispatchMode):
    """Records every torch.fft transform made under it (function and arguments), to replay them later."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.__name__.split(".")[0]
        if name.startswith("fft_") and name not in NOT_TRANSFORMS:
            self.calls.append((func, args, kwargs or {}))
        return func(*args, **(kwargs or {}))


def synchronized(run: Callable[[], object], device: torch.device) -> Callable[[], object]:
    """`run` followed by a wait for the device's queued work (a no-op on the CPU): timed calls end when
    the GPU's work does."""
    if device.type != "cuda":
        return run

    def call() -> object:
        result = run()
        torch.cuda.synchronize(device)
        return result

    return call


def step_fft_calls(
    system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor
) -> tuple[list[tuple[Callable[..., object], tuple[object, ...], dict[str, object]]], int]:
    """The torch.fft transforms one step of one block makes, and the block's sample count: one block
    (`block_samples` samples) is rolled out 1 and 2 steps with every transform recorded; the calls the second
    step adds (its nonlinear evaluations and the saved frame's inverse transform) are one step's, with their
    shapes, strides, dtypes and sizes. A rollout before them sets up the operators the system keeps
    (`SpectralSystem.shared_operators`), so that neither recorded rollout holds a set-up the other lacks; the
    two-step record must begin with the one-step record."""
    block = min(system.block_samples(initial.device), initial.shape[0])
    recorded = []
    with torch.inference_mode(), flush_denormals():
        system.rollout(initial[:block], params[:block], steps=1, save_every=1, cuda_graph=False)
        for steps in (1, 2):
            with FFTRecorder() as recorder:
                system.rollout(initial[:block], params[:block], steps=steps, save_every=1, cuda_graph=False)
            recorded.append(recorder.calls)
    one, two = ([func.__name__ for func, _, _ in calls] for calls in recorded)
    if two[: len(one)] != one:
        raise RuntimeError(f"the 2-step rollout's transforms {two} do not begin with the 1-step one's {one}")
    return recorded[1][len(recorded[0]) :], block


def fft_floor(system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor, repeats: int) -> dict:
    """The transforms one step of one block must do (`step_fft_calls`), timed alone on one thread: the
    solver's floor. They are replayed in a loop; the median over `repeats` timings of 50 replays, per sample,
    is the FFT time of one sample-step."""
    step_calls, block = step_fft_calls(system, params, initial)
    device = initial.device

    def replay() -> float:
        # CPU: process time on one thread; GPU: wall time until the device's queue is empty.
        clock = time.process_time if device.type == "cpu" else time.perf_counter
        start = clock()
        for _ in range(50):
            for func, args, kwargs in step_calls:
                func(*args, **kwargs)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return (clock() - start) / 50

    with torch.inference_mode(), flush_denormals():
        if device.type == "cpu":
            times = on_one_thread(lambda: [replay() for _ in range(repeats + 1)][1:])
        else:  # GPU blocks hold the whole batch of every case (`batching.GPU_BLOCK_VALUES`)
            times = [replay() for _ in range(repeats + 1)][1:]
    seconds = statistics.median(times) / block
    return {
        "fft_seconds_per_sample_step": seconds,
        "fft_calls_per_step": [func.__name__.split(".")[0] for func, _, _ in step_calls],
        "block_samples": block,
    }


def run_case(
    case: Case, repeats: int, device: torch.device, machine: str, cores: str, fused: bool = False
) -> list[dict[str, object]]:
    system = dynaforge_system(case)
    params64, initial64 = initial_batch(system, case.samples)
    params, initial64 = params64.to(device), initial64.to(device)
    initial = initial64.to(torch.float32)
    sample_steps = case.samples * case.steps
    threads = torch.get_num_threads()
    on_gpu = device.type == "cuda"

    check_same_dealiasing(case)
    exponax_run = exponax_rollout(case)
    initial_np = initial.cpu().numpy()
    runs = [
        synchronized(lambda: dynaforge_batched(system, params, initial), device),
        lambda: exponax_run(initial_np),
    ]
    if fused:  # `system.fused: true`: the same rollout with each stage's elementwise work compiled
        fused_system = dynaforge_system(case, fused=True)
        runs.append(synchronized(lambda: dynaforge_batched(fused_system, params, initial), device))
    if on_gpu:  # the same rollout stepped eagerly, without CUDA graphs
        runs.append(
            synchronized(lambda: dynaforge_batched(system, params, initial, cuda_graph=False), device)
        )
    batched, exp_timing, *others = time_interleaved(runs, repeats)
    fused_timing = others.pop(0) if fused else None
    eager_timing = others
    trajectories = dynaforge_batched(system, params, initial)
    fields = trajectories.cpu().numpy()
    exp_fields = np.asarray(exponax_run(initial_np))
    dyn_rate = sample_steps / batched.median
    exp_rate = sample_steps / exp_timing.median

    floor = fft_floor(system, params, initial, repeats)
    # The floor is one core's; with T threads the blocks run side by side on T cores. A GPU runs the whole
    # batch as one block.
    floor_rate = (1 if on_gpu else threads) / floor["fft_seconds_per_sample_step"]
    multiple = floor_rate / dyn_rate
    exp_multiple = floor_rate / exp_rate
    limit = {
        "fft_floor_sample_steps_per_s": floor_rate,
        "dynaforge_step_over_fft": multiple,
        "exponax_step_over_fft": exp_multiple,
        "fft_calls_per_step": floor["fft_calls_per_step"],
        "fft_block_samples": floor["block_samples"],
        "threads": threads,
    }
    where = (
        f"{device_name(device)}"
        if on_gpu
        else f"one thread, allow {floor_rate:.0f} sample-steps/s at {threads} thread(s)"
    )
    limit_note = (
        f"limit: the transforms one step must do (torch.fft calls recorded in one step of one "
        f"{floor['block_samples']}-sample block: {', '.join(floor['fft_calls_per_step'])}), replayed alone on "
        f"{where}"
        + (f", allow {floor_rate:.0f} sample-steps/s" if on_gpu else "")
        + f"; dynaforge's step takes {multiple:.2f}x that time, exponax's {exp_multiple:.2f}x"
    )

    # Accuracy: both float32 runs against each other and against dynaforge's float64 run of the same scheme
    # from the same initial fields (for the chaotic KS, tiny float32 differences grow exponentially with t,
    # so the float32 -> float64 difference of each solver is the floor any comparison can reach).
    reference = comparable(
        case, dynaforge_batched(dynaforge_system(case, "float64"), params, initial64).cpu().numpy()
    )
    fields, exp_fields = comparable(case, fields), comparable(case, exp_fields)
    early = max(1, case.steps // 10) + 1  # the first 10 % of the horizon, before chaotic growth dominates
    diff_all = float(np.abs(fields - exp_fields).max())
    diff_early = float(np.abs(fields[:, :early] - exp_fields[:, :early]).max())
    dyn_vs_64 = float(np.abs(fields - reference).max())
    exp_vs_64 = float(np.abs(exp_fields - reference).max())
    scale = float(np.abs(reference).max())
    horizon = case.steps * case.dt

    where = device_name(device) if on_gpu else f"{threads} thread{'s' if threads > 1 else ''}"
    print(f"\n{case.label()}, {where}")
    print(
        f"  dynaforge batched : {dyn_rate:12.0f} sample-steps/s  (median {batched.median:.3f} s, first call {batched.warmup:.3f} s)"
    )
    print(
        f"  exponax           : {exp_rate:12.0f} sample-steps/s  (median {exp_timing.median:.3f} s, first call incl. JIT {exp_timing.warmup:.3f} s)  ratio {dyn_rate / exp_rate:.2f}"
    )
    print(
        f"  FFT floor         : {floor_rate:12.0f} sample-steps/s  (dynaforge {multiple:.2f}x its time, exponax {exp_multiple:.2f}x)"
    )
    print(
        f"  max |dynaforge - exponax|: {diff_all:.2e} over t <= {horizon:g}, {diff_early:.2e} over t <= {(early - 1) * case.dt:g} (max |u| = {scale:.2f})"
    )
    print(f"  max |float32 - float64 dynaforge|: dynaforge {dyn_vs_64:.2e}, exponax {exp_vs_64:.2e}")

    environment = (
        f"torch {torch.__version__} with {threads} intra-op threads, subnormals flushed in dynaforge's runs "
        f"as its generate stage does (XLA flushes them too), "
        f"XLA_FLAGS={os.environ.get('XLA_FLAGS', '(unset)')!r}, Python {platform.python_version()}, "
        f"{platform.machine()} with {os.cpu_count()} cores, {cores}; {load_note(machine)} when written"
        + (f"; both libraries on {device_name(device)} (jax devices {jax_devices()})" if on_gpu else "")
    )
    accuracy = (
        f"max |dynaforge - exponax| = {diff_all:.2e} over all {case.steps + 1} frames (t <= {horizon:g}), "
        f"{diff_early:.2e} for t <= {(early - 1) * case.dt:g}; against dynaforge float64: dynaforge float32 "
        f"{dyn_vs_64:.2e}, exponax {exp_vs_64:.2e}; max |u| = {scale:.2f}"
        + ("; spatial means removed before comparing (see `comparable`)" if case.system == "ks2d" else "")
        + (f"; {GRAY_SCOTT_SPLIT}" if case.system == "gray_scott" else "")
    )
    label = f"{case.label()}, {where}"
    records = [
        {
            "case": label,
            "baseline": f"{exponax_version()}, jit(vmap(rollout))",
            "metric": "sample-steps/s",
            "dynaforge": dyn_rate,
            "baseline_value": exp_rate,
            "ratio": dyn_rate / exp_rate,
            "machine": device_name(device) if on_gpu else machine,
            "limit": limit,
            "notes": (
                f"{limit_note}; medians of {repeats} interleaved runs: dynaforge {batched.median:.4f} s (first "
                f"call {batched.warmup:.4f} s), exponax {exp_timing.median:.4f} s (first call incl. JIT "
                f"{exp_timing.warmup:.4f} s); process CPU time medians dynaforge {batched.cpu_median:.4f} s, "
                f"exponax {exp_timing.cpu_median:.4f} s (ratio {exp_timing.cpu_median / batched.cpu_median:.2f}); "
                f"every timed run (s): dynaforge {', '.join(f'{t:.3f}' for t in batched.runs)}, exponax "
                f"{', '.join(f'{t:.3f}' for t in exp_timing.runs)}; "
                f"{accuracy}; {environment}"
            ),
        }
    ]
    if eager_timing:
        eager = dynaforge_batched(system, params, initial, cuda_graph=False)
        identical = torch.equal(eager, trajectories)
        eager_rate = sample_steps / eager_timing[0].median
        print(
            f"  eager (no graphs) : {eager_rate:12.0f} sample-steps/s  (median {eager_timing[0].median:.3f} s)  "
            f"ratio {dyn_rate / eager_rate:.2f}; same bits: {identical}"
        )
        records.append(
            {
                "case": label,
                "baseline": "the same dynaforge rollout stepped eagerly (cuda_graph=False)",
                "metric": "sample-steps/s",
                "dynaforge": dyn_rate,
                "baseline_value": eager_rate,
                "ratio": dyn_rate / eager_rate,
                "machine": device_name(device),
                "limit": limit,
                "notes": (
                    f"each block's save_every steps replayed from a CUDA graph (pde.capture.CapturedSteps) against "
                    f"the same steps launched one by one from Python; trajectories bitwise identical: "
                    f"{identical}; medians of {repeats} interleaved runs: graphed {batched.median:.4f} s, eager "
                    f"{eager_timing[0].median:.4f} s (first call {eager_timing[0].warmup:.4f} s); {environment}"
                ),
            }
        )
    if fused_timing is not None:
        records.extend(
            fused_records(
                f"{label}, fused",
                case,
                dynaforge_batched(fused_system, params, initial),
                trajectories,
                (batched, exp_timing, fused_timing),
                device_name(device) if on_gpu else machine,
                limit,
                environment,
            )
        )
    if case.loop and not on_gpu:  # one sample at a time on a GPU only measures kernel launches
        # The loop's first call is a full pass too (its warm-up is in any case a single-sample rollout).
        loop = time_calls(lambda: dynaforge_loop(system, params, initial), 1)
        loop_rate = sample_steps / loop.median
        print(
            f"  per-sample loop   : {loop_rate:12.0f} sample-steps/s  ({loop.median:.2f} s)  ratio {dyn_rate / loop_rate:.2f}"
        )
        records.insert(
            0,
            {
                "case": label,
                "baseline": "per-sample Python loop over the same dynaforge solver",
                "metric": "sample-steps/s",
                "dynaforge": dyn_rate,
                "baseline_value": loop_rate,
                "ratio": dyn_rate / loop_rate,
                "machine": machine,
                "limit": limit,
                "notes": (
                    f"dynaforge batched median of {repeats} runs {batched.median:.4f} s (first call "
                    f"{batched.warmup:.4f} s); loop over the samples one at a time, "
                    f"{loop.median:.3f} s (first call {loop.warmup:.3f} s); {environment}"
                ),
            },
        )
    return records


def fused_records(
    label: str,
    case: Case,
    fused_fields: torch.Tensor,
    default_fields: torch.Tensor,
    timings: tuple[Timing, Timing, Timing],
    machine: str,
    limit: dict,
    environment: str,
) -> list[dict[str, object]]:
    """`system.fused: true` against exponax and against dynaforge's default step (`--fused`), with the
    largest difference of its trajectories from the default step's (the same numbers to rounding,
    fused.py)."""
    eager, exponax, fused = timings
    sample_steps = case.samples * case.steps
    fused_rate, eager_rate = sample_steps / fused.median, sample_steps / eager.median
    exponax_rate = sample_steps / exponax.median
    difference = float((fused_fields - default_fields).abs().max() / default_fields.abs().max())
    graphs = ", each block's steps replayed from a CUDA graph" if fused_fields.device.type == "cuda" else ""
    print(
        f"  fused (compiled)  : {fused_rate:12.0f} sample-steps/s  (median {fused.median:.3f} s, first call "
        f"incl. compiling {fused.warmup:.3f} s)  ratio to exponax {fused_rate / exponax_rate:.2f}, to the "
        f"default step {fused_rate / eager_rate:.2f}; max |fused - default| / max |default| {difference:.1e}"
    )
    notes = (
        f"system.fused: true (the elementwise stages of each step compiled by torch.compile{graphs}); medians "
        f"of {len(fused.runs)} interleaved runs: fused {fused.median:.4f} s (first call, compiling included, "
        f"{fused.warmup:.4f} s), default step {eager.median:.4f} s, exponax {exponax.median:.4f} s; every timed "
        f"fused run (s): {', '.join(f'{t:.3f}' for t in fused.runs)}; max |fused - default| / max |default| "
        f"over all frames {difference:.1e}; {environment}"
    )
    common = {"case": label, "metric": "sample-steps/s", "dynaforge": fused_rate, "machine": machine}
    return [
        {
            **common,
            "baseline": f"{exponax_version()}, jit(vmap(rollout))",
            "baseline_value": exponax_rate,
            "ratio": fused_rate / exponax_rate,
            "limit": limit,
            "notes": notes,
        },
        {
            **common,
            "baseline": "dynaforge's default step (system.fused: false)",
            "baseline_value": eager_rate,
            "ratio": fused_rate / eager_rate,
            "notes": notes,
        },
    ]


def set_threads(threads: int, hold: bool = True) -> str:
    """Limit torch and XLA (which reads XLA_FLAGS when jax is first imported, later in this process), and
    hold the process to `threads` cores when the machine has more; returns a note saying which.

    The core limit is what makes "N threads" true for exponax: at 1 thread, with the flags below, XLA's CPU
    runtime still ran a rollout on two `tf_XLAEigen` threads (KS N=200: 0.48-0.52 s of process CPU time for
    0.37-0.40 s of wall time on a 2-core Xeon), and held to one core it took the same wall time (0.366 s,
    CPU time = wall time): the second core did no useful work, but it was taken from whatever else ran.
    """

    if "jax" in sys.modules:
        raise RuntimeError("set_threads must run before jax is imported")
    torch.set_num_threads(threads)
    flags = f"--xla_cpu_multi_thread_eigen={'true' if threads > 1 else 'false'} intra_op_parallelism_threads={threads}"
    os.environ["XLA_FLAGS"] = f"{os.environ.get('XLA_FLAGS', '')} {flags}".strip()
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_setaffinity") else []
    if not hold or not allowed or threads >= len(allowed):
        return f"all cores allowed ({len(allowed) or os.cpu_count()})"
    cores = set(allowed[-threads:])  # threads started later (XLA's, torch's) inherit the mask
    os.sched_setaffinity(0, cores)
    return f"process held to core(s) {sorted(cores)} of {allowed} (os.sched_setaffinity), XLA's threads too"


def merged(earlier: list[dict], records: list[dict]) -> list[dict]:
    """`records`, after the earlier records of cases they do not cover."""
    ran = {record["case"] for record in records}
    return [r for r in earlier if r["case"] not in ran] + records


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: fewer samples and steps, 1 repeat")
    parser.add_argument(
        "--threads",
        default=None,
        help="comma-separated intra-op thread counts for torch and XLA alike, one process each (default "
        "1,2; --quick: 1); 0: each library's default",
    )
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per solver (median reported)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda: dynaforge on this torch device, exponax on jax's default device (its GPU "
        "where jax has CUDA); one process, --threads is ignored",
    )
    parser.add_argument(
        "--samples-scale",
        type=int,
        default=1,
        help="multiply every case's batch (a GPU needs larger batches than a 2-core CPU to fill it)",
    )
    parser.add_argument(
        "--all-cores",
        action="store_true",
        help="do not hold the process to --threads cores (how records before 2026-11-26 15:00 UTC were taken)",
    )
    parser.add_argument(
        "--cases",
        default="",
        help=f"comma-separated case names to run (default all: {', '.join(c.name for c in CASES)}); the "
        "other cases' records already in the results file are kept",
    )
    parser.add_argument(
        "--fused",
        action="store_true",
        help="also time `system.fused: true` (the step's elementwise stages compiled; on a GPU, replayed "
        "from CUDA graphs): records against exponax and against the default step",
    )
    add_out_argument(parser, RESULTS)
    args = parser.parse_args()
    device = torch.device(args.device)
    threads = args.threads or ("1" if args.quick else "1,2")
    counts = [int(t) for t in threads.split(",")] if device.type == "cpu" else [0]
    chosen = [
        dataclasses.replace(c, samples=c.samples * args.samples_scale)
        for c in selected_cases(args.cases, args.quick)
    ]
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    if len(counts) > 1:  # XLA reads its thread count once per process: one child process per count
        records = []
        for count in counts:
            part = out.with_name(f"{out.stem}.threads{count}.json")
            forwarded = ["--threads", str(count), "--repeats", str(args.repeats), "--out", str(part)]
            forwarded += ["--quick"] * args.quick + (["--cases", args.cases] if args.cases else [])
            forwarded += ["--samples-scale", str(args.samples_scale)]
            forwarded += ["--all-cores"] * args.all_cores + ["--fused"] * args.fused
            subprocess.run([sys.executable, __file__, *forwarded], check=True)
            records.extend(json.loads(part.read_text()))
            part.unlink()
    else:
        machine = machine_name()  # before the process is held to fewer cores: the machine's count
        cores = set_threads(counts[0], hold=not args.all_cores) if counts[0] > 0 else "all cores allowed"
        cases = [quick_case(c) for c in chosen] if args.quick else chosen
        repeats = 1 if args.quick else args.repeats
        earlier = json.loads(out.read_text()) if out.exists() else []
        records = []
        for case in cases:  # written after every case: a run cut short keeps the cases it finished
            # the smoke run takes every code path, the fused step's included
            records.extend(run_case(case, repeats, device, machine, cores, fused=args.fused or args.quick))
            atomic_write_json(out, merged(earlier, records))
    if out.exists() and (args.cases or len(counts) == 1):  # keep the other records of an earlier run
        records = merged(json.loads(out.read_text()), records)
    atomic_write_json(out, records)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
