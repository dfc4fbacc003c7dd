"""Flow past a cylinder in a channel, the DFG benchmark 2D-2 of Schäfer & Turek (1996), with the cylinder a
volume-penalised mask (`dynaforge.systems.flow.channel`, a first version): the Strouhal number, the largest
drag and lift coefficients over the last seconds of periodic shedding, beside the benchmark's bands.

    python benchmarks/cylinder_dfg.py --cells 82 --until 10 --average-from 6 [--json benchmarks/results/cylinder_dfg.json]

Coefficients: c_D = 2 F_x / (U_mean^2 D), c_L = 2 F_y / (U_mean^2 D) with U_mean = 1 (2/3 of the inflow peak
1.5) and D = 0.1; F the force of the fluid on the cylinder (the momentum the penalisation takes out). The
Strouhal number D f / U_mean from the mean period between upward zero crossings of c_L - mean(c_L).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from dynaforge.systems.flow.channel import dfg_channel, stable_dt, step
from machine import load_note

BANDS = {"strouhal": (0.295, 0.305), "drag_max": (3.23 * 0.97, 3.23 * 1.03), "lift_max": (0.95, 1.05)}
"""Issue 35 item 4: St in [0.295, 0.305], max c_D within 3% of 3.23, max c_L within 5% of 1.00 (the
benchmark's reference intervals: St 0.295-0.305, c_D max 3.22-3.24, c_L max 0.99-1.01)."""


def measure(cells: int, until: float, average_from: float, eta: float, safety: float) -> dict[str, float]:
    dt = safety * stable_dt(cells)
    channel, c, velocity = dfg_channel(cells, dt, eta)
    steps = round(until / dt)
    drag, lift = np.empty(steps), np.empty(steps)
    start = time.perf_counter()
    for n in range(steps):
        velocity, force = step(velocity, channel, c)
        drag[n], lift[n] = 20.0 * float(force.x[0]), 20.0 * float(force.y[0])  # 2 F / (1^2 * 0.1)
    seconds = time.perf_counter() - start
    t = np.arange(1, steps + 1) * dt
    late = t >= average_from
    z = lift[late] - lift[late].mean()
    tl = t[late]
    up = np.where((z[:-1] < 0) & (z[1:] >= 0))[0]
    crossings = tl[up] - z[up] * (tl[up + 1] - tl[up]) / (z[up + 1] - z[up])
    period = float(np.diff(crossings).mean())
    return {
        "cells_across": cells,
        "cells_per_diameter": cells * 0.1 / 0.41,
        "dt": dt,
        "eta": eta,
        "steps": steps,
        "seconds": seconds,
        "periods": len(crossings) - 1,
        "strouhal": 0.1 / period,
        "drag_max": float(drag[late].max()),
        "drag_mean": float(drag[late].mean()),
        "lift_max": float(lift[late].max()),
        "lift_min": float(lift[late].min()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cells", type=int, nargs="+", default=[41, 82], help="cells across the channel")
    parser.add_argument("--until", type=float, default=10.0)
    parser.add_argument("--average-from", type=float, default=6.0)
    parser.add_argument("--eta", type=float, default=1e-4, help="penalisation time scale")
    parser.add_argument("--safety", type=float, default=0.9, help="dt as a fraction of the stability bound")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    note = load_note()
    print(note)
    runs = []
    for cells in args.cells:
        result = measure(cells, args.until, args.average_from, args.eta, args.safety)
        runs.append(result)
        print(f"\n{cells} cells across ({result['cells_per_diameter']:.1f} per diameter), dt = {result['dt']:.4g}, "
              f"{result['steps']} steps, {result['seconds']:.0f} s, {result['periods']} periods")  # fmt: skip
        for key, (low, high) in BANDS.items():
            value = result[key]
            verdict = "inside" if low <= value <= high else "OUTSIDE"
            print(f"  {key:9s} {value:.4f}   band [{low:.4f}, {high:.4f}]  {verdict}")
    if args.json is not None:
        args.json.write_text(json.dumps({"machine": note, "threads": 1, "runs": runs}, indent=1))


if __name__ == "__main__":
    main()
