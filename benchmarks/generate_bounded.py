"""Generation speed of the bounded systems against py-pde at equal error (benchmark environment only), one thread.

    python benchmarks/generate_bounded.py            # writes benchmarks/results/generate_bounded.json
    python benchmarks/generate_bounded.py --quick    # tiny sizes, written to a temporary folder (smoke run)

Cases: the heat equation u_t = nu laplacian(u), nu = 0.05, whose exact solution is known, so each tool's
error is measured against the truth at its own grid points (max norm at the final time):
- 1D on [0, 1], 128 points: u = 1 at x = 0, du/dn = 0.5 at x = 1;
  u = 1 + x / 2 + sin(3 pi x / 2) exp(-nu (3 pi / 2)^2 t) / 2.
- 2D on [0, 1]^2, 64 x 64 points: u = 0 at x = 0, du/dn = 0 at x = 1, u = 0 at y = 0 and y = 1;
  u = sin(3 pi x / 2) sin(pi y) exp(-nu ((3/2)^2 + 1) pi^2 t) + sin(pi x / 2) sin(2 pi y) exp(-nu (1/4 + 4) pi^2 t) / 2.
dynaforge steps a batch of samples at once with SSP-RK3 (three Laplacians a step, `heat_bounded`, nodes
j / (n - 1) with both ends); py-pde 0.59 one sample at a time with its numba-compiled explicit Euler (one
Laplacian a step, cells centred at (j + 1/2) / n). Each tool takes the largest step that is stable with a
margin (`STEP_FRACTION` of its bound: the spatial error dominates both at these steps, so a smaller step
buys neither tool accuracy); the errors printed beside the figures say how equal they are (`EQUAL_ERROR`).
Timings exclude numba compilation (a warm-up run first), but each py-pde `solve` compiles its stepper again,
so two py-pde rates are recorded: per solve of one sample (what generating samples one by one costs) and of
its steps alone (a stepper compiled once by `make_stepper` and timed over the whole span).

Writes the standard records (case, baseline, metric, dynaforge, baseline_value, ratio, notes), ratio > 1:
dynaforge faster: sample-steps/s against py-pde per solve and against its steps alone, and samples taken to
the final time per second (at the errors recorded in the notes) against its steps alone. The measured
figures whole go to generate_bounded.detail.json beside it.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynaforge.atomic import atomic_write_json
from dynaforge.config.base import Range
from dynaforge.systems.bounded.core import STABILITY_EXTENT
from dynaforge.systems.bounded.heat import HeatBounded, HeatBoundedConfig
from dynaforge.systems.bounded.system import BoundaryConfig, SideConfig
from machine import load_note, machine_name
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "generate_bounded.json"
NU = 0.05
STEP_FRACTION = 0.9
"""Each tool steps at this fraction of its stability bound."""
EQUAL_ERROR = 1.25
"""Errors within this factor of each other count as equal."""


def cases(quick: bool) -> list[dict]:
    if quick:
        return [
            {"ndim": 1, "n": 32, "t_end": 0.05, "samples": 16, "pypde_samples": 1},
            {"ndim": 2, "n": 16, "t_end": 0.05, "samples": 16, "pypde_samples": 1},
        ]
    return [
        {"ndim": 1, "n": 128, "t_end": 0.5, "samples": 1024, "pypde_samples": 2},
        {"ndim": 2, "n": 64, "t_end": 0.2, "samples": 32, "pypde_samples": 2},
    ]


def exact(ndim: int, x: np.ndarray, y: np.ndarray | None, t: float) -> np.ndarray:
    """The cases' exact solutions at points x (and y, 2D) at time t (module docstring)."""
    if ndim == 1:
        return 1 + 0.5 * x + 0.5 * np.sin(1.5 * np.pi * x) * np.exp(-NU * (1.5 * np.pi) ** 2 * t)
    assert y is not None
    first = np.sin(1.5 * np.pi * x) * np.sin(np.pi * y) * np.exp(-NU * (2.25 + 1) * np.pi**2 * t)
    second = np.sin(0.5 * np.pi * x) * np.sin(2 * np.pi * y) * np.exp(-NU * (0.25 + 4) * np.pi**2 * t)
    return first + 0.5 * second


def points(ndim: int, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """x (and y) of every grid point, from the nodes of one axis (x along the first axis)."""
    if ndim == 1:
        return nodes, None
    x, y = np.meshgrid(nodes, nodes, indexing="ij")
    return x, y


def boundary(ndim: int) -> BoundaryConfig:
    if ndim == 1:
        return BoundaryConfig(
            left=SideConfig(value=Range(1.0, 1.0)), right=SideConfig(kind="neumann", value=Range(0.5, 0.5))
        )
    return BoundaryConfig(right=SideConfig(kind="neumann"))


def steps_for(t_end: float, bound: float) -> int:
    """Steps to t_end at no more than STEP_FRACTION of the stability bound."""
    return math.ceil(t_end / (STEP_FRACTION * bound))


def dynaforge_system(case: dict) -> HeatBounded:
    h = 1.0 / (case["n"] - 1)
    bound = STABILITY_EXTENT[3][0] / (4 * NU * case["ndim"] / h**2)  # SSP-RK3 along the negative real axis
    steps = steps_for(case["t_end"], bound)
    config = HeatBoundedConfig(
        ndim=case["ndim"],
        resolution=case["n"],
        dt=case["t_end"] / steps,
        steps=steps,
        save_every=steps,
        diffusivity=Range(NU, NU),
        boundary=boundary(case["ndim"]),
        dtype="float64",
    )
    return HeatBounded(config)


def time_dynaforge(system: HeatBounded, case: dict) -> tuple[float, float]:
    """Seconds for a batch of `samples` rollouts to the final time, and the max error of one of them."""
    samples, n, ndim = case["samples"], case["n"], case["ndim"]
    drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(samples)])
    x, y = points(ndim, np.arange(n) / (n - 1))
    u0 = torch.from_numpy(exact(ndim, x, y, 0.0)).expand(samples, 1, *([n] * ndim)).contiguous()
    system.rollout(u0[:16], drawn.params[:16], steps=2, save_every=1)  # warm-up
    start = time.perf_counter()
    fields = system.rollout(u0, drawn.params).fields
    seconds = time.perf_counter() - start
    error = np.abs(fields[0, -1, 0].numpy() - exact(ndim, x, y, case["t_end"])).max()
    return seconds, float(error)


def time_pypde(case: dict) -> dict:
    """py-pde's explicit Euler on its cell-centred grid: seconds for `pypde_samples` solves (one sample
    each, as a generator would call py-pde), the sample-steps/s of its steps alone (its compiled stepper
    called again), its steps and error."""
    import numba  # benchmark-only peers, imported here so that --help works without them
    import pde

    numba.set_num_threads(1)
    n, ndim, t_end = case["n"], case["ndim"], case["t_end"]
    grid = pde.CartesianGrid([[0.0, 1.0]] * ndim, [n] * ndim)
    if ndim == 1:
        bc = [[{"value": 1.0}, {"derivative": 0.5}]]
    else:
        bc = [[{"value": 0.0}, {"derivative": 0.0}], [{"value": 0.0}, {"value": 0.0}]]
    equation = pde.DiffusionPDE(diffusivity=NU, bc=bc)
    x, y = points(ndim, (np.arange(n) + 0.5) / n)
    state = pde.ScalarField(grid, exact(ndim, x, y, 0.0))
    h = 1.0 / n
    steps = steps_for(t_end, h**2 / (2 * NU * ndim))  # explicit Euler: dt <= h^2 / (2 d nu)
    dt = t_end / steps
    solve = {"t_range": t_end, "dt": dt, "solver": "euler", "adaptive": False, "tracker": None}
    equation.solve(state, **{**solve, "t_range": 2 * dt})  # warm-up: numba compiles
    start = time.perf_counter()
    for _ in range(case["pypde_samples"]):
        equation.solve(state, **solve)
    per_call = time.perf_counter() - start
    # its steps alone: a stepper compiled once and called again (best of three runs to the final time)
    stepper = pde.EulerSolver(equation, adaptive=False).make_stepper(state, dt=dt)
    stepper(state.copy(), 0.0, 2 * dt)
    stepping = math.inf
    for _ in range(3):
        final = state.copy()
        start = time.perf_counter()
        stepper(final, 0.0, t_end)
        stepping = min(stepping, time.perf_counter() - start)
    return {
        "seconds": per_call,
        "steps_only_sample_steps_per_s": steps / stepping,
        "steps": steps,
        "dt": dt,
        "error": float(np.abs(final.data - exact(ndim, x, y, t_end)).max()),
        "version": pde.__version__,
    }


def detail_path(out: Path) -> Path:
    """generate_bounded.json -> generate_bounded.detail.json: the measured figures beside the records."""
    return out.with_name(out.name.removesuffix(".json") + ".detail.json")


def equality(run: dict) -> str:
    """How equal the two errors are, in words."""
    if run["equal_error"]:
        return f"equal within {EQUAL_ERROR}x"
    if run["error_ratio"] > EQUAL_ERROR:
        return (
            f"not equal within {EQUAL_ERROR}x: dynaforge is the more accurate, so at equal error its ratio "
            "would be higher (this one is a lower bound)"
        )
    return f"not equal within {EQUAL_ERROR}x: py-pde is the more accurate"


def records(run: dict) -> list[dict]:
    """The standard records of one measured case (a `run_case` result)."""
    pypde = f"py-pde {run['pypde']} explicit Euler (numba)"
    overhead = (
        run["pypde_steps"] / run["pypde_sample_steps_per_s"]
        - run["pypde_steps"] / run["pypde_steps_only_sample_steps_per_s"]
    )
    common = (
        f"{run['boundary']}; max error against the exact solution at t = {run['t_end']}: dynaforge "
        f"{run['error_dynaforge']:.3g} ({run['steps']} steps of {run['dt']:.3g}, float64 SSP-RK3, 3 Laplacians "
        f"a step, nodes with both ends, a batch of {run['dynaforge_samples']}), py-pde {run['error_pypde']:.3g} "
        f"({run['pypde_steps']} steps of {run['pypde_dt']:.3g}, explicit Euler, 1 Laplacian a step, "
        f"cell-centred); error ratio py-pde / dynaforge {run['error_ratio']:.3g} "
        f"({equality(run)}); "
        f"each at {STEP_FRACTION} of its stability bound; py-pde recompiles its stepper at every solve "
        f"({overhead:.2f} s per solve beyond its steps); {run['threads']} thread, torch {run['torch']}, "
        f"{run['machine']}; {run['load']}"
    )
    return [
        {
            "case": run["case"],
            "baseline": f"{pypde}, one solve per sample (each solve compiles its stepper again)",
            "metric": "sample-steps/s",
            "dynaforge": run["dynaforge_sample_steps_per_s"],
            "baseline_value": run["pypde_sample_steps_per_s"],
            "ratio": run["ratio"],
            "notes": f"ratio > 1: dynaforge faster; py-pde's per-solve compile time counted; {common}",
        },
        {
            "case": run["case"],
            "baseline": f"{pypde}, its steps alone (per-solve compilation excluded)",
            "metric": "sample-steps/s",
            "dynaforge": run["dynaforge_sample_steps_per_s"],
            "baseline_value": run["pypde_steps_only_sample_steps_per_s"],
            "ratio": run["ratio_steps_only"],
            "notes": f"ratio > 1: dynaforge faster; a step of either tool, whatever its size; {common}",
        },
        {
            "case": run["case"],
            "baseline": f"{pypde}, its steps alone (per-solve compilation excluded)",
            "metric": f"samples to t = {run['t_end']} per s, at the errors in the notes",
            "dynaforge": run["dynaforge_samples_per_s"],
            "baseline_value": run["pypde_samples_per_s"],
            "ratio": run["ratio_to_time"],
            "notes": f"ratio > 1: dynaforge faster; the equal-error figure (each tool's own step count); {common}",
        },
    ]


def run_case(case: dict) -> dict:
    system = dynaforge_system(case)
    seconds, error = time_dynaforge(system, case)
    peer = time_pypde(case)
    steps = system.config.steps
    ours_rate = case["samples"] * steps / seconds
    theirs_rate = case["pypde_samples"] * peer["steps"] / peer["seconds"]
    ours_samples = case["samples"] / seconds
    theirs_samples = peer["steps_only_sample_steps_per_s"] / peer["steps"]
    ratio = peer["error"] / error
    return {
        "case": f"heat {case['ndim']}D, {case['n']} points per axis, nu={NU}, t = 0 to {case['t_end']}",
        "boundary": "u = 1 left, du/dn = 0.5 right"
        if case["ndim"] == 1
        else "u = 0 left, du/dn = 0 right, u = 0 bottom and top",
        "t_end": case["t_end"],
        "steps": steps,
        "dt": system.config.dt,
        "dynaforge_samples": case["samples"],
        "dynaforge_sample_steps_per_s": ours_rate,
        "dynaforge_samples_per_s": ours_samples,
        "error_dynaforge": error,
        "pypde_steps": peer["steps"],
        "pypde_dt": peer["dt"],
        "pypde_sample_steps_per_s": theirs_rate,
        "pypde_steps_only_sample_steps_per_s": peer["steps_only_sample_steps_per_s"],
        "pypde_samples_per_s": theirs_samples,
        "error_pypde": peer["error"],
        "error_ratio": ratio,
        "equal_error": bool(1 / EQUAL_ERROR <= ratio <= EQUAL_ERROR),
        "ratio": ours_rate / theirs_rate,
        "ratio_steps_only": ours_rate / peer["steps_only_sample_steps_per_s"],
        "ratio_to_time": ours_samples / theirs_samples,
        "threads": 1,
        "machine": machine_name(),
        "load": load_note(),
        "pypde": peer["version"],
        "torch": torch.__version__,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, written to a temporary folder")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    out = quick_path(args.out) if args.quick else args.out
    runs = []
    for case in cases(args.quick):
        run = run_case(case)
        print(json.dumps(run, indent=1))
        runs.append(run)
    atomic_write_json(detail_path(out), runs)
    atomic_write_json(out, [record for run in runs for record in records(run)])
    print(f"wrote {out} and {detail_path(out).name}")


if __name__ == "__main__":
    main()
