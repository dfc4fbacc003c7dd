"""The lid-driven cavity against Ghia, Ghia & Shin (1982): steady centre-line velocities at Re = 100 and
1,000, each of the 17 tabulated points beside dynaforge's value, with the largest error in lid speeds (issue
35's band: 0.02) and the time to reach the steady state.

    python benchmarks/cavity_ghia.py --resolution 128 --dtype float32   # results/cavity_ghia.json
    python benchmarks/cavity_ghia.py --quick   # smoke run: Re = 100, 16 x 16, tolerance 1e-2, temp folder

Writes the standard records (one per Reynolds number: case, baseline, metric, dynaforge, baseline_value,
ratio, notes): metric the largest |error| in lid speeds over both centre lines, baseline_value the band
0.02, ratio band / error (above 1: inside the band); the centre-line values themselves go to
cavity_ghia.detail.json beside it.

The tables are tests/physics/ghia_1982.py (the test suite checks Re = 100 at 32 x 32 and Re = 1000 at
64 x 64); dynaforge's values are interpolated between the faces by a cubic spline through the wall values.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from scipy.interpolate import CubicSpline

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.systems import build_system
from machine import load_note
from smoke import quick_path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "physics"))  # the published tables
import ghia_1982

RESULTS = Path(__file__).resolve().parent / "results" / "cavity_ghia.json"
BAND = 0.02
"""Issue 35: every tabulated centre-line velocity within 0.02 lid speeds of Ghia, Ghia & Shin (1982)."""


def measure(reynolds: int, resolution: int, dtype: str, tolerance: float, safety: float) -> dict[str, object]:
    base = load_config(None, ["system.name=cavity", f"system.resolution={resolution}", f"system.reynolds={reynolds}",
                              "system.dt=1e-4"]).system  # fmt: skip
    dt = safety * base.largest_stable_dt()
    system = build_system(
        load_config(
            None,
            [
                "system.name=cavity",
                f"system.resolution={resolution}",
                f"system.reynolds={reynolds}",
                f"system.dtype={dtype}",
                f"system.dt={dt}",
            ],
        ).system
    )
    params = torch.tensor([[1.0, float(reynolds), 1.0]], dtype=torch.float64)  # domain_length, reynolds, lid
    start = time.perf_counter()
    steady = system.steady_state(params, tolerance=tolerance)  # type: ignore[attr-defined]
    seconds = time.perf_counter() - start
    lines = system.centre_lines(steady.velocity, params)  # type: ignore[attr-defined]
    u = CubicSpline(lines.y, lines.u[0])(ghia_1982.Y)
    v = CubicSpline(lines.x, lines.v[0])(ghia_1982.X)
    u_error = np.abs(u - ghia_1982.U[reynolds])
    v_error = np.abs(v - ghia_1982.V[reynolds])
    print(f"\nRe = {reynolds}, {resolution} x {resolution}, {dtype}, dt = {dt:.4g}: {steady.steps} steps "
          f"(t = {steady.steps * dt:.1f}), {seconds:.1f} s, last change {steady.change:.1e} U per unit time")  # fmt: skip
    print("   y      Ghia u     ours u   |err|      x      Ghia v     ours v   |err|")
    for i in range(len(ghia_1982.Y)):
        print(f"{ghia_1982.Y[i]:.4f} {ghia_1982.U[reynolds][i]:9.5f} {u[i]:9.5f} {u_error[i]:7.4f}   "
              f"{ghia_1982.X[i]:.4f} {ghia_1982.V[reynolds][i]:9.5f} {v[i]:9.5f} {v_error[i]:7.4f}")  # fmt: skip
    print(f"max |err| / U: u {u_error.max():.4f}, v {v_error.max():.4f} (band 0.02)")
    return {
        "reynolds": reynolds,
        "resolution": resolution,
        "dtype": dtype,
        "dt": dt,
        "steps": steady.steps,
        "seconds": seconds,
        "max_error_u": float(u_error.max()),
        "max_error_v": float(v_error.max()),
        "u": u.tolist(),
        "v": v.tolist(),
    }


def detail_path(out: Path) -> Path:
    """cavity_ghia.json -> cavity_ghia.detail.json: the centre-line values beside the records."""
    return out.with_name(out.name.removesuffix(".json") + ".detail.json")


def record(run: dict, machine: str, threads: int) -> dict[str, object]:
    """The standard record of one measured run (a `measure` result)."""
    error = max(run["max_error_u"], run["max_error_v"])
    return {
        "case": f"cavity Re={run['reynolds']} {run['resolution']}^2 {run['dtype']}",
        "baseline": "Ghia, Ghia & Shin (1982) table",
        "metric": "max |error| / lid speed",
        "dynaforge": error,
        "baseline_value": BAND,
        "ratio": BAND / error,
        "notes": (
            f"accuracy, not speed: dynaforge = largest |dynaforge - Ghia| in lid speeds over the 17 "
            f"tabulated points of each centre line (u on x = 1/2: {run['max_error_u']!r}; v on y = 1/2: "
            f"{run['max_error_v']!r}), baseline_value = issue 35's band, ratio = band / error (above 1: "
            f"inside the band); steady state (change < tolerance per unit time) after {run['steps']} steps "
            f"of dt = {run['dt']!r} (t = {run['steps'] * run['dt']:.1f}), {run['seconds']!r} s to reach it "
            f"with {threads} thread(s); centre-line values in cavity_ghia.detail.json; {machine}"
        ),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resolution", type=int, default=128)
    parser.add_argument("--dtype", choices=("float32", "float64"), default="float32")
    parser.add_argument("--reynolds", type=int, nargs="+", default=[100, 1000], choices=[100, 1000])
    parser.add_argument("--tolerance", type=float, default=1e-5, help="steady: change per unit time, in U")
    parser.add_argument("--safety", type=float, default=0.9, help="dt as a fraction of the stability bound")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true", help="smoke run: Re = 100, 16 x 16, tolerance 1e-2")
    parser.add_argument("--out", "--json", type=Path, default=None, help=f"records (default {RESULTS.name})")
    args = parser.parse_args()
    if args.quick:
        args.resolution, args.reynolds, args.tolerance = 16, [100], 1e-2
    torch.set_num_threads(args.threads)
    note = load_note()
    print(note)
    results = [measure(re, args.resolution, args.dtype, args.tolerance, args.safety) for re in args.reynolds]
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    detail = {"machine": note, "threads": args.threads, "tolerance": args.tolerance, "runs": results}
    atomic_write_json(detail_path(out), detail)
    atomic_write_json(out, [record(run, note, args.threads) for run in results])
    print(f"wrote {out} and {detail_path(out).name}")


if __name__ == "__main__":
    main()
