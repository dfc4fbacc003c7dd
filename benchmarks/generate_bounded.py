"""Generation speed of the bounded systems against py-pde at equal error (benchmark environment only), one thread.

    python benchmarks/generate_bounded.py            # writes benchmarks/results/generate_bounded.json
    python benchmarks/generate_bounded.py --quick    # tiny sizes, written to a temporary folder (smoke run)

Cases: the heat equation u_t = nu laplacian(u), nu = 0.05, whose exact solution is known, so each tool's
error is measured against the truth at its own grid points (max norm at the final time):
- 1D on [0, 1], 128 points: u = 1 at x = 0, du/dn = 0.5 at x = 1;
  u = 1 + x / 2 + sin(3 pi x / 2) exp(-nu (3 pi / 2)^2 t) / 2.
- 2D on [0, 1]^2, 64 x 64 points: u = 0 at x = 0, du/dn = 0 at x = 1, u = 0 at y = 0 and y = 1;
  u = sin(3 pi x / 2) sin(pi y) exp(-nu ((3/2)^2 + 1) pi^2 t) + sin(pi x / 2) sin(2 pi y) exp(-nu (1/4 + 4) pi^2 t) / 2.
dynaforge (`heat_bounded`, nodes j / (n - 1) with both ends) steps a batch of samples at once, two ways:
exactly in time (`time_stepping: exact`: the semi-discrete solution at each of `FRAMES` stored frames, one
inverse transform per frame, in the sine/cosine eigenbasis of its difference Laplacian) and with SSP-RK3
(three Laplacians a step, at `STEP_FRACTION` of its stability bound); and at equal error, exactly in time
with Chebyshev collocation (`discretisation: chebyshev`) on the fewest Gauss-Lobatto nodes per axis whose
error at its own nodes is at most py-pde's (`equal_error_chebyshev`). py-pde 0.59 steps one sample at a time
with its numba-compiled explicit Euler (one Laplacian a step, cells centred at (j + 1/2) / n) at
`STEP_FRACTION` of its bound (the spatial error dominates there, so a smaller step buys it no accuracy); the
errors printed beside the figures say how equal they are (`EQUAL_ERROR`). Timings exclude numba compilation
(a warm-up run first), but each py-pde `solve` compiles its stepper again, so two py-pde rates are recorded:
per solve of one sample (what generating samples one by one costs) and of its steps alone (a stepper
compiled once by `make_stepper` and timed over the whole span). The floor beside dynaforge's exact figure is
the time of the bare transforms it runs (one analysis per rollout and one synthesis per frame, a matrix
product per axis each).

Writes the standard records (case, baseline, metric, dynaforge, baseline_value, ratio, notes), ratio > 1:
dynaforge faster: samples taken to the final time per second, each tool at its own step count and at the
errors in the notes, also written as sample-steps/s counted in py-pde's steps (the same ratio). The measured
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
from scipy.interpolate import CubicSpline

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.config.base import Range
from dynaforge.systems.bounded.core import STABILITY_EXTENT
from dynaforge.systems.bounded.exact import Basis
from dynaforge.systems.bounded.heat import HeatBounded, HeatBoundedConfig
from dynaforge.systems.bounded.system import BoundaryConfig, SideConfig
from dynaforge.systems.registry import build_system
from machine import load_note, machine_name
from smoke import quick_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "physics"))  # the published tables
import ghia_1982

RESULTS = Path(__file__).resolve().parent / "results" / "generate_bounded.json"
NU = 0.05
STEP_FRACTION = 0.9
"""Each tool steps at this fraction of its stability bound."""
EQUAL_ERROR = 1.25
"""Errors within this factor of each other count as equal."""
FRAMES = 10
"""Frames the exact stepper stores between t = 0 and the final time (a dataset stores frames; py-pde only
reaches the final one), each an inverse transform."""
EXACT_DTYPES = ("float64", "float32")
"""Exact stepping is timed in both (py-pde runs in float64; its error at these grids, ~1e-4, is far above
float32's rounding, so the two dynaforge errors agree to their first digits)."""
REPEATS = 5
"""dynaforge's batch is timed this many times, the best kept (milliseconds each with exact stepping)."""


def cases(quick: bool) -> list[dict]:
    if quick:
        return [
            {"ndim": 1, "n": 32, "t_end": 0.05, "samples": 16, "exact_samples": 16, "pypde_samples": 1},
            {"ndim": 2, "n": 16, "t_end": 0.05, "samples": 16, "exact_samples": 16, "pypde_samples": 1},
        ]
    # chebyshev_samples: the batch timed on the (much smaller) equal-error Chebyshev grid
    return [
        {
            "ndim": 1,
            "n": 128,
            "t_end": 0.5,
            "samples": 1024,
            "exact_samples": 4096,
            "chebyshev_samples": 16384,
            "pypde_samples": 2,
        },
        {
            "ndim": 2,
            "n": 64,
            "t_end": 0.2,
            "samples": 32,
            "exact_samples": 256,
            "chebyshev_samples": 4096,
            "pypde_samples": 2,
        },
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


def dynaforge_system(
    case: dict, exact: bool = False, dtype: str = "float64", chebyshev_nodes: int | None = None
) -> HeatBounded:
    """SSP-RK3 at STEP_FRACTION of its bound, or exact stepping with FRAMES frames to the final time (on
    `chebyshev_nodes` Gauss-Lobatto nodes per axis, `discretisation: chebyshev`, where given)."""
    h = 1.0 / (case["n"] - 1)
    bound = STABILITY_EXTENT[3][0] / (4 * NU * case["ndim"] / h**2)  # SSP-RK3 along the negative real axis
    steps = FRAMES if exact else steps_for(case["t_end"], bound)
    config = HeatBoundedConfig(
        ndim=case["ndim"],
        resolution=chebyshev_nodes or case["n"],
        dt=case["t_end"] / steps,
        steps=steps,
        save_every=1 if exact else steps,
        diffusivity=Range(NU, NU),
        boundary=boundary(case["ndim"]),
        dtype=dtype,
        time_stepping="exact" if exact else "runge_kutta",
        discretisation="finite_difference" if chebyshev_nodes is None else "chebyshev",
    )
    return HeatBounded(config)


def time_dynaforge(
    system: HeatBounded, case: dict, samples: int, repeats: int = REPEATS
) -> tuple[float, float]:
    """Seconds for a batch of `samples` rollouts to the final time (best of REPEATS with exact stepping,
    one run with Runge-Kutta), and the max error of one of them."""
    n, ndim = system.config.resolution, case["ndim"]
    drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(samples)])
    x, y = points(ndim, system.unit_nodes())  # each tool's error at its own points
    u0 = torch.from_numpy(exact(ndim, x, y, 0.0)).expand(samples, 1, *([n] * ndim)).contiguous()
    system.rollout(u0[:16], drawn.params[:16], steps=2, save_every=1)  # warm-up
    seconds = math.inf
    for _ in range(repeats if system.exact else 1):
        start = time.perf_counter()
        fields = system.rollout(u0, drawn.params).fields
        seconds = min(seconds, time.perf_counter() - start)
    error = np.abs(fields[0, -1, 0].numpy() - exact(ndim, x, y, case["t_end"])).max()
    return seconds, float(error)


def equal_error_chebyshev(case: dict, target: float, dtype: str) -> tuple[int, float]:
    """The fewest Gauss-Lobatto nodes per axis (from 4) whose Chebyshev error at the final time is at most
    `target` (py-pde's), and that error (one sample each; the figures are deterministic)."""
    for n in range(4, case["n"] + 1):
        _, error = time_dynaforge(dynaforge_system(case, True, dtype, chebyshev_nodes=n), case, 1, repeats=1)
        if error <= target:
            return n, error
    raise RuntimeError(f"no Chebyshev grid up to {case['n']} nodes reaches py-pde's error {target:.3g}")


def transform_floor(system: HeatBounded, samples: int) -> float:
    """Seconds of the bare transforms of an exact rollout of `samples` samples: one analysis and FRAMES
    syntheses (a matrix product per axis each), in blocks of the system's size (best of REPEATS)."""
    basis = Basis(system.shape, system.kinds, system.real_dtype, torch.device("cpu"))
    block = system.block_samples(torch.device("cpu"))
    field = torch.randn((block, 1, *system.shape), dtype=system.real_dtype)
    coefficients = basis.to_spectral(field)
    grid = torch.empty_like(field)
    work = basis.workspace(block, 1)
    best = math.inf
    for _ in range(REPEATS):
        start = time.perf_counter()
        basis.to_spectral(field)
        for _ in range(FRAMES):
            basis.to_grid(coefficients, grid, work)
        best = min(best, time.perf_counter() - start)
    return best * math.ceil(samples / block)


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


def equality(ratio: float) -> str:
    """How equal two errors are (py-pde's over dynaforge's), in words."""
    if 1 / EQUAL_ERROR <= ratio <= EQUAL_ERROR:
        return f"equal within {EQUAL_ERROR}x"
    if ratio > EQUAL_ERROR:
        return (
            f"not equal within {EQUAL_ERROR}x: dynaforge is the more accurate, so at equal error its ratio "
            "would be higher (this one is a lower bound)"
        )
    return f"not equal within {EQUAL_ERROR}x: py-pde is the more accurate"


def record(run: dict, baseline: str, metric: str, ours: float, theirs: float, notes: str) -> dict:
    """One standard record of a heat case: samples per second to the final time on both sides (`ours`,
    `theirs`), written as sample-steps/s in py-pde's steps where the metric says so."""
    scale = run["pypde_steps"] if metric.startswith("sample-steps") else 1
    return {
        "case": run["case"],
        "baseline": baseline,
        "metric": metric,
        "dynaforge": ours * scale,
        "baseline_value": theirs * scale,
        "ratio": ours / theirs,
        "notes": f"ratio > 1: dynaforge faster; {notes}",
    }


def records(run: dict) -> list[dict]:
    """The standard records of one measured case (a `run_case` result): exact stepping in each of
    EXACT_DTYPES against py-pde's steps alone, the fastest of them against py-pde's solves, SSP-RK3."""
    pypde = f"py-pde {run['pypde']} explicit Euler (numba)"
    steps = run["pypde_steps"]
    overhead = steps / run["pypde_sample_steps_per_s"] - steps / run["pypde_steps_only_sample_steps_per_s"]
    errors = (
        f"max error against the exact solution at t = {run['t_end']}: py-pde {run['error_pypde']:.3g} "
        f"({steps} steps of {run['pypde_dt']:.3g}, explicit Euler, 1 Laplacian a step, cell-centred, at "
        f"{STEP_FRACTION} of its stability bound)"
    )
    where = (
        f"py-pde recompiles its stepper at every solve ({overhead:.2f} s per solve beyond its steps); "
        f"{run['threads']} thread, torch {run['torch']}, {run['machine']}; {run['load']}"
    )
    metric = f"sample-steps/s at equal error (py-pde's {steps} steps to t = {run['t_end']} per sample)"
    alone = f"{pypde}, its steps alone (per-solve compilation excluded)"

    def exact_notes(dtype: str) -> str:
        side = run["exact"][dtype]
        return (
            f"dynaforge stepping exactly in time, {dtype}; {run['boundary']}; {errors}; dynaforge "
            f"{side['error']:.3g} (exact time stepping, {FRAMES} frames stored to the final time, {dtype}, nodes "
            f"with both ends, batches of {run['exact_samples']}); error ratio py-pde / dynaforge "
            f"{side['error_ratio']:.3g} ({equality(side['error_ratio'])}); transform floor (the bare matrix "
            f"products of its transforms, {dtype}) {side['floor_samples_per_s']:.4g} samples/s, dynaforge at "
            f"{side['samples_per_s'] / side['floor_samples_per_s']:.2f} of it; {where}"
        )

    result = [
        record(run, alone, metric, side["samples_per_s"], run["pypde_samples_per_s"], exact_notes(dtype))
        for dtype, side in run["exact"].items()
    ]
    n, ndim = run["n"], run["ndim"]
    for dtype, side in run.get("chebyshev", {}).items():
        nodes = side["nodes"]
        grid = " x ".join([str(nodes)] * ndim)
        notes = (
            f"dynaforge Chebyshev collocation (`discretisation: chebyshev`) stepped exactly in time, {dtype}, on "
            f"the fewest Gauss-Lobatto nodes whose error is at most py-pde's: {grid} nodes against py-pde's "
            f"{' x '.join([str(n)] * ndim)} cells; {run['boundary']}; {errors}, at its cell centres; dynaforge "
            f"{side['error']:.3g} at its own nodes ({FRAMES} frames stored to the final time, {dtype}, batches of "
            f"{side['samples']}); error ratio py-pde / dynaforge {side['error_ratio']:.3g}; {where}"
        )
        case = (
            f"heat {ndim}D at equal error: dynaforge Chebyshev {grid} vs py-pde {' x '.join([str(n)] * ndim)}"
        )
        result.append(
            {
                **record(run, alone, metric, side["samples_per_s"], run["pypde_samples_per_s"], notes),
                "case": case,
            }
        )
    fastest = max(run["exact"], key=lambda dtype: run["exact"][dtype]["samples_per_s"])
    result.append(
        record(
            run,
            f"{pypde}, one solve per sample (each solve compiles its stepper again)",
            metric,
            run["exact"][fastest]["samples_per_s"],
            run["pypde_solve_samples_per_s"],
            f"py-pde's per-solve compile time counted; {exact_notes(fastest)}",
        )
    )
    rk = (
        f"dynaforge {run['error_rk']:.3g} (SSP-RK3, {run['rk_steps']} steps of {run['rk_dt']:.3g} at "
        f"{STEP_FRACTION} of its bound, 3 Laplacians a step, float64, a batch of {run['rk_samples']}); error "
        f"ratio py-pde / dynaforge {run['error_ratio_rk']:.3g} ({equality(run['error_ratio_rk'])})"
    )
    result.append(
        record(
            run,
            alone,
            f"samples to t = {run['t_end']} per s, at the errors in the notes",
            run["rk_samples_per_s"],
            run["pypde_samples_per_s"],
            f"dynaforge with SSP-RK3 (`time_stepping: runge_kutta`, the default); {run['boundary']}; {errors}; "
            f"{rk}; {where}",
        )
    )
    return result


def run_case(case: dict) -> dict:
    exact = {}
    peer = time_pypde(case)
    for dtype in EXACT_DTYPES:
        system = dynaforge_system(case, exact=True, dtype=dtype)
        seconds, error = time_dynaforge(system, case, case["exact_samples"])
        exact[dtype] = {
            "seconds": seconds,
            "samples_per_s": case["exact_samples"] / seconds,
            "floor_samples_per_s": case["exact_samples"] / transform_floor(system, case["exact_samples"]),
            "error": error,
            "error_ratio": peer["error"] / error,
        }
    chebyshev = {}
    samples = case.get("chebyshev_samples", case["exact_samples"])
    for dtype in EXACT_DTYPES:
        nodes, _ = equal_error_chebyshev(case, peer["error"], dtype)
        system = dynaforge_system(case, exact=True, dtype=dtype, chebyshev_nodes=nodes)
        seconds, error = time_dynaforge(system, case, samples)
        chebyshev[dtype] = {
            "nodes": nodes,
            "samples": samples,
            "seconds": seconds,
            "samples_per_s": samples / seconds,
            "error": error,
            "error_ratio": peer["error"] / error,
        }
    rk_system = dynaforge_system(case)
    rk_seconds, rk_error = time_dynaforge(rk_system, case, case["samples"])
    return {
        "case": f"heat {case['ndim']}D, {case['n']} points per axis, nu={NU}, t = 0 to {case['t_end']}",
        "boundary": "u = 1 left, du/dn = 0.5 right"
        if case["ndim"] == 1
        else "u = 0 left, du/dn = 0 right, u = 0 bottom and top",
        "t_end": case["t_end"],
        "n": case["n"],
        "ndim": case["ndim"],
        "frames": FRAMES,
        "exact_samples": case["exact_samples"],
        "exact": exact,
        "chebyshev": chebyshev,
        "rk_samples": case["samples"],
        "rk_steps": rk_system.config.steps,
        "rk_dt": rk_system.config.dt,
        "rk_samples_per_s": case["samples"] / rk_seconds,
        "error_rk": rk_error,
        "pypde_steps": peer["steps"],
        "pypde_dt": peer["dt"],
        "pypde_sample_steps_per_s": case["pypde_samples"] * peer["steps"] / peer["seconds"],
        "pypde_solve_samples_per_s": case["pypde_samples"] / peer["seconds"],
        "pypde_steps_only_sample_steps_per_s": peer["steps_only_sample_steps_per_s"],
        "pypde_samples_per_s": peer["steps_only_sample_steps_per_s"] / peer["steps"],
        "error_pypde": peer["error"],
        "error_ratio_rk": peer["error"] / rk_error,
        "threads": 1,
        "machine": machine_name(),
        "load": load_note(),
        "pypde": peer["version"],
        "torch": torch.__version__,
    }


REYNOLDS = 100
"""The cavity case's Reynolds number (lid speed 1, side 1)."""


def cavity_case(quick: bool) -> dict:
    """Same cells per side, Re and time span for both tools: 10 lid-passing times, near the steady state that
    Ghia et al. tabulate (dynaforge's 32 x 32 flow changes by < 1e-6 lid speeds per unit time from t = 23,
    docs/cavity.md; the span is cut to 10 to keep PhiFlow's run to minutes on one core)."""
    if quick:
        return {"n": 8, "t_end": 0.2, "samples": 8}
    return {"n": 32, "t_end": 10.0, "samples": 8}


def centre_line_error(u: np.ndarray, v: np.ndarray) -> float:
    """Largest |error| in lid speeds against Ghia, Ghia & Shin (1982) at Re = 100 over their 17 points of each
    centre line, from cell-centred u, v (n, n), x first: the two middle columns (rows) averaged onto x = 1/2
    (y = 1/2), a cubic spline through them and the wall values (the same for both tools)."""
    n = u.shape[0]
    positions = np.concatenate([[0.0], (np.arange(n) + 0.5) / n, [1.0]])
    u_line = np.concatenate([[0.0], 0.5 * (u[n // 2 - 1] + u[n // 2]), [1.0]])
    v_line = np.concatenate([[0.0], 0.5 * (v[:, n // 2 - 1] + v[:, n // 2]), [0.0]])
    u_error = np.abs(CubicSpline(positions, u_line)(ghia_1982.Y) - ghia_1982.U[REYNOLDS])
    v_error = np.abs(CubicSpline(positions, v_line)(ghia_1982.X) - ghia_1982.V[REYNOLDS])
    return float(max(u_error.max(), v_error.max()))


def time_dynaforge_cavity(case: dict) -> dict:
    """dynaforge's cavity (MAC grid, SSP-RK3, exact DCT projection), float64, a batch of `samples`."""
    n, samples = case["n"], case["samples"]
    overrides = ["system.name=cavity", f"system.resolution={n}", f"system.reynolds={REYNOLDS}"]
    bound = load_config(None, [*overrides, "system.dt=1e-4"]).system.largest_stable_dt()
    steps = math.ceil(case["t_end"] / (STEP_FRACTION * bound))
    dt = case["t_end"] / steps
    system = build_system(load_config(None, [*overrides, "system.dtype=float64", f"system.dt={dt}"]).system)
    params = torch.tensor([[1.0, float(REYNOLDS), 1.0]], dtype=torch.float64).expand(samples, 3).contiguous()
    system.rollout(params[:1], steps=2, save_every=2)  # warm-up
    start = time.perf_counter()
    fields = system.rollout(params, steps=steps, save_every=steps).fields
    seconds = time.perf_counter() - start
    last = fields[0, -1].numpy()
    return {"steps": steps, "dt": dt, "seconds": seconds, "error": centre_line_error(last[0], last[1])}


def time_phiflow(case: dict) -> dict | str:
    """PhiFlow's own cavity recipe, one sample (semi-Lagrangian advection, explicit diffusion, its pressure
    projection by conjugate gradients to 1e-5, warm-started), at STEP_FRACTION of its explicit diffusion
    bound h^2 / (4 nu) and of CFL 1; or why it did not run."""
    try:
        import phi
        from phi import flow
    except ImportError:
        return "skipped: phiflow is not installed (benchmarks/requirements.txt, `make bench-env`)"
    flow.math.set_global_precision(64)
    n = case["n"]
    nu = 1.0 / REYNOLDS
    h = 1.0 / n
    steps = math.ceil(case["t_end"] / (STEP_FRACTION * min(h / 1.0, h * h / (4 * nu))))
    dt = case["t_end"] / steps
    boundary = {"x": 0, "y-": 0, "y+": flow.vec(x=1, y=0)}
    velocity = flow.StaggeredGrid(0, boundary, x=n, y=n, bounds=flow.Box(x=1, y=1))

    def step(velocity: object, pressure: object) -> tuple[object, object]:
        velocity = flow.advect.semi_lagrangian(velocity, velocity, dt)
        velocity = flow.diffuse.explicit(velocity, nu, dt)
        # near the steady state its CG stops on a rising residual at some steps ("Diverged", "NotConverged"); keep the
        # partial result there instead of aborting (the error against Ghia below says what it cost)
        solve = flow.Solve(
            "CG",
            1e-5,
            1e-5,
            x0=pressure,
            rank_deficiency=1,
            suppress=[flow.math.Diverged, flow.math.NotConverged],
        )
        return flow.fluid.make_incompressible(velocity, (), solve)

    step(velocity, None)  # warm-up
    pressure = None
    start = time.perf_counter()
    for _ in range(steps):
        velocity, pressure = step(velocity, pressure)
    seconds = time.perf_counter() - start
    centred = velocity.at_centers().values.numpy("x,y,vector")
    return {
        "steps": steps,
        "dt": dt,
        "seconds": seconds,
        "error": centre_line_error(centred[..., 0], centred[..., 1]),
        "version": phi.__version__,
    }


def run_cavity(case: dict) -> dict:
    ours = time_dynaforge_cavity(case)
    peer = time_phiflow(case)
    run = {"case": case, "dynaforge": ours, "phiflow": peer, "machine": machine_name(), "load": load_note()}
    if isinstance(peer, str):
        print(f"PhiFlow cavity: {peer}")
    return run


def cavity_records(run: dict) -> list[dict]:
    """The standard record of the cavity case; none where PhiFlow was skipped."""
    ours, peer, case = run["dynaforge"], run["phiflow"], run["case"]
    if isinstance(peer, str):
        return []
    ours_rate = case["samples"] / ours["seconds"]
    theirs_rate = 1 / peer["seconds"]
    ratio = peer["error"] / ours["error"]
    return [
        {
            "case": f"lid-driven cavity Re={REYNOLDS}, {case['n']} x {case['n']} cells, t = 0 to {case['t_end']}",
            "baseline": f"PhiFlow {peer['version']} (numpy backend), one sample",
            "metric": f"sample-steps/s at equal error (PhiFlow's {peer['steps']} steps to t = {case['t_end']} "
            "per sample)",
            "dynaforge": ours_rate * peer["steps"],
            "baseline_value": theirs_rate * peer["steps"],
            "ratio": ours_rate / theirs_rate,
            "notes": (
                f"ratio > 1: dynaforge faster (samples to t = {case['t_end']} per s); max |error| in lid "
                f"speeds against Ghia, Ghia & Shin (1982), 17 points per centre line: dynaforge "
                f"{ours['error']:.3g} (MAC grid, SSP-RK3, exact DCT projection, {ours['steps']} steps of "
                f"{ours['dt']:.3g}, float64, a batch of {case['samples']}), PhiFlow {peer['error']:.3g} "
                f"(semi-Lagrangian advection, explicit diffusion, CG projection to 1e-5 (a CG stopped on a rising "
                f"residual keeps its partial result), {peer['steps']} steps "
                f"of {peer['dt']:.3g}, float64); error ratio PhiFlow / dynaforge {ratio:.3g} "
                f"({equality(ratio)}); each at {STEP_FRACTION} of its step bound; 1 thread, "
                f"torch {torch.__version__}, {run['machine']}; {run['load']}"
            ),
        }
    ]


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
    cavity = run_cavity(cavity_case(args.quick))
    print(json.dumps(cavity, indent=1))
    atomic_write_json(detail_path(out), [*runs, cavity])
    atomic_write_json(out, [record for run in runs for record in records(run)] + cavity_records(cavity))
    print(f"wrote {out} and {detail_path(out).name}")


if __name__ == "__main__":
    main()
