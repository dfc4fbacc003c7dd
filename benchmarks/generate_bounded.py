"""Generation speed of the bounded systems against py-pde (benchmark environment only), one thread.

    python benchmarks/generate_bounded.py            # writes benchmarks/results/generate_bounded.json
    python benchmarks/generate_bounded.py --quick    # tiny sizes, written to a temporary folder (smoke run)

Cases: the heat equation u_t = nu laplacian(u) on [0, 1] (128 grid points) and [0, 1]^2 (64 x 64), u = 1 on
the left side, du/dn = 0.5 on the right, u = 0 on the bottom and top (2D), the same nu, dt, time span and
initial field for both. dynaforge steps a batch of samples at once with SSP-RK3 (three evaluations of the
Laplacian per step, `heat_bounded`); py-pde 0.59 steps one sample at a time with its numba-compiled explicit
Euler scheme (one evaluation per step: the cheapest step py-pde has, so the per-step ratio favours py-pde by
up to 3x at equal step count). Both grids have 128 (64) points per axis, but not the same points: dynaforge's
nodes include both ends (j / (n - 1)), py-pde's cells are centred ((j + 1/2) / n); equal error against a fine
reference is not measured here (issue 35 item 6 asks for it). Timings exclude numba compilation (a warm-up
run first), but each py-pde `solve` compiles its stepper again (2.1 s per solve in 1D, 4.5 s in 2D beyond
its steps in the recorded run; each record's notes give it), so two py-pde rates are recorded: per solve
of one sample (`pypde_sample_steps_per_s`, what generating samples one by one costs) and of its steps alone
(`pypde_steps_only_sample_steps_per_s`, from `extra_steps` more steps in one solve).

Writes the standard records (case, baseline, metric, dynaforge, baseline_value, ratio, notes), two per case,
metric sample-steps/s, ratio > 1: dynaforge faster: against py-pde per solve (its recompilation counted: what
generating samples one by one with py-pde costs) and against py-pde's steps alone (compilation excluded); each
record's notes give the other ratio, the machine and its load. The measured figures whole go to
generate_bounded.detail.json beside it.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynaforge.atomic import atomic_write_json
from dynaforge.config.base import Range
from dynaforge.systems.bounded.heat import HeatBounded, HeatBoundedConfig
from dynaforge.systems.bounded.system import BoundaryConfig, SideConfig
from machine import load_note, machine_name
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "generate_bounded.json"
NU = 0.05


def cases(quick: bool) -> list[dict]:
    if quick:
        return [
            {"ndim": 1, "n": 32, "steps": 20, "samples": 4, "pypde_samples": 1, "extra_steps": 200},
            {"ndim": 2, "n": 16, "steps": 10, "samples": 2, "pypde_samples": 1, "extra_steps": 200},
        ]
    return [
        {"ndim": 1, "n": 128, "steps": 1000, "samples": 256, "pypde_samples": 4, "extra_steps": 20000},
        {"ndim": 2, "n": 64, "steps": 200, "samples": 32, "pypde_samples": 2, "extra_steps": 20000},
    ]


def dynaforge_system(case: dict) -> HeatBounded:
    sides = BoundaryConfig(
        left=SideConfig(value=Range(1.0, 1.0)),
        right=SideConfig(kind="neumann", value=Range(0.5, 0.5)),
    )
    h = 1.0 / (case["n"] - 1)
    dt = 0.5 * 2.5 / (4 * NU * case["ndim"] / h**2)  # half the SSP-RK3 bound
    config = HeatBoundedConfig(
        ndim=case["ndim"],
        resolution=case["n"],
        dt=dt,
        steps=case["steps"],
        save_every=case["steps"],
        diffusivity=Range(NU, NU),
        boundary=sides,
        dtype="float64",
    )
    return HeatBounded(config)


def time_dynaforge(system: HeatBounded, samples: int) -> tuple[float, np.ndarray]:
    drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(samples)])
    system.rollout(drawn.initial[:1], drawn.params[:1], steps=2, save_every=1)  # warm-up
    start = time.perf_counter()
    fields = system.rollout(drawn.initial, drawn.params).fields
    return time.perf_counter() - start, fields[0, -1, 0].numpy()


def time_pypde(system: HeatBounded, case: dict) -> tuple[float, float, np.ndarray]:
    """Seconds for `pypde_samples` solves (one sample each, as a generator would call py-pde), the
    sample-steps/s of its steps alone, and the last final state."""
    import numba  # benchmark-only peers, imported here so that --help works without them
    import pde

    numba.set_num_threads(1)
    n, ndim = case["n"], case["ndim"]
    grid = pde.CartesianGrid([[0.0, 1.0]] * ndim, [n] * ndim)
    bc_x = [{"value": 1.0}, {"derivative": 0.5}]
    bc = [bc_x, [{"value": 0.0}, {"value": 0.0}]] if ndim == 2 else [bc_x]
    equation = pde.DiffusionPDE(diffusivity=NU, bc=bc)
    drawn = system.draw_samples([np.random.default_rng(0)])
    state = pde.ScalarField(grid, drawn.initial[0, 0].numpy())
    dt, t_end = system.config.dt, system.config.dt * case["steps"]
    solve = {
        "t_range": t_end,
        "dt": dt,
        "solver": "euler",
        "adaptive": False,
        "tracker": None,
    }
    equation.solve(state, **{**solve, "t_range": 2 * dt})  # warm-up: numba compiles
    start = time.perf_counter()
    for _ in range(case["pypde_samples"]):
        final = equation.solve(state, **solve)
    per_call = time.perf_counter() - start
    start = time.perf_counter()
    equation.solve(state, **{**solve, "t_range": t_end + dt * case["extra_steps"]})
    longer = time.perf_counter() - start
    # each solve compiles its stepper again (seconds per solve); the extra steps of a longer run
    # time the steps alone
    marginal = case["extra_steps"] / max(longer - per_call / case["pypde_samples"], 1e-9)
    return per_call, marginal, final.data


def detail_path(out: Path) -> Path:
    """generate_bounded.json -> generate_bounded.detail.json: the measured figures beside the records."""
    return out.with_name(out.name.removesuffix(".json") + ".detail.json")


def records(run: dict) -> list[dict]:
    """The standard records of one measured case (a `run_case` result): against py-pde per solve, its
    recompilation included, and against its steps alone."""
    pypde = f"py-pde {run['pypde']} explicit Euler (numba)"
    steps = run["steps"]
    overhead = steps / run["pypde_sample_steps_per_s"] - steps / run["pypde_steps_only_sample_steps_per_s"]
    common = (
        f"{run['boundary']}; dynaforge float64 SSP-RK3 (3 Laplacians per step), a batch of "
        f"{run['dynaforge_samples']} samples; py-pde explicit Euler (1 Laplacian per step); cell-centred vs "
        f"vertex grids, equal accuracy not measured; final means dynaforge {run['final_mean_dynaforge']!r}, "
        f"py-pde {run['final_mean_pypde']!r}; {run['threads']} thread, torch {run['torch']}; {run['load']}"
    )
    return [
        {
            "case": run["case"],
            "baseline": f"{pypde}, one solve per sample (each solve compiles its stepper again)",
            "metric": "sample-steps/s",
            "dynaforge": run["dynaforge_sample_steps_per_s"],
            "baseline_value": run["pypde_sample_steps_per_s"],
            "ratio": run["ratio"],
            "notes": (
                f"ratio > 1: dynaforge faster; this ratio counts py-pde's per-solve compile time (each solve "
                f"compiles its stepper again: {overhead:.2f} s per solve beyond its steps in this run, what "
                f"generating samples one by one with py-pde costs); py-pde's steps alone (compilation "
                f"excluded) run {run['pypde_steps_only_sample_steps_per_s']!r} sample-steps/s, a "
                f"stepping-only ratio of {run['ratio_steps_only']!r}; {common}"
            ),
        },
        {
            "case": run["case"],
            "baseline": f"{pypde}, its steps alone (per-solve compilation excluded)",
            "metric": "sample-steps/s",
            "dynaforge": run["dynaforge_sample_steps_per_s"],
            "baseline_value": run["pypde_steps_only_sample_steps_per_s"],
            "ratio": run["ratio_steps_only"],
            "notes": (
                f"ratio > 1: dynaforge faster; the stepping-only ratio: py-pde's rate from the extra steps "
                f"of a longer solve, its per-solve compile time ({overhead:.2f} s per solve beyond its "
                f"steps) excluded (with it counted, per solve: {run['pypde_sample_steps_per_s']!r} "
                f"sample-steps/s, ratio {run['ratio']!r}); {common}"
            ),
        },
    ]


def run_case(case: dict) -> dict:
    system = dynaforge_system(case)
    seconds, ours = time_dynaforge(system, case["samples"])
    peer_seconds, peer_marginal, theirs = time_pypde(system, case)
    ours_rate = case["samples"] * case["steps"] / seconds
    theirs_rate = case["pypde_samples"] * case["steps"] / peer_seconds
    return {
        "case": f"heat {case['ndim']}D, {case['n']} points per axis, nu={NU}, {case['steps']} steps of dt={system.config.dt:.3g}",
        "boundary": "u = 1 left, du/dn = 0.5 right" + (", u = 0 bottom and top" if case["ndim"] == 2 else ""),
        "steps": case["steps"],
        "dynaforge_samples": case["samples"],
        "dynaforge_sample_steps_per_s": ours_rate,
        "pypde_sample_steps_per_s": theirs_rate,
        "ratio": ours_rate / theirs_rate,
        "pypde_steps_only_sample_steps_per_s": peer_marginal,
        "ratio_steps_only": ours_rate / peer_marginal,
        "final_mean_dynaforge": float(ours.mean()),
        "final_mean_pypde": float(theirs.mean()),
        "threads": 1,
        "machine": machine_name(),
        "load": load_note(),
        "pypde": __import__("pde").__version__,
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
