"""Time per Darcy sample: dynaforge's batched preconditioned CG (`systems/elliptic/five_point.py`) against a
sparse direct solve of the same matrix per sample (scipy's SuperLU, two orderings), one thread, on the solve
grids of configs/darcy.yaml (193 x 193) and of the FNO paper (421 x 421), the FNO paper's 12 / 3 field.

    python benchmarks/darcy_solver.py                 # CPU, one thread
    python benchmarks/darcy_solver.py --device cuda   # the CG on a GPU (scipy stays on the CPU)
    python benchmarks/darcy_solver.py --quick         # smoke run: a 17 x 17 solve grid, to a temporary folder

Writes the standard records, one per solve grid and SuperLU ordering: metric seconds per sample, dynaforge the
CG's (best of 2 batched solves / batch), baseline_value SuperLU's (best of 2 samples, assembly included),
ratio = SuperLU / CG (above 1: dynaforge faster); the measured rows whole in darcy_solver.detail.json.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynaforge.atomic import atomic_write_json
from dynaforge.systems.elliptic import five_point
from dynaforge.systems.elliptic.darcy import Darcy, DarcyConfig, draw_permeability
from machine import device_name, load_note
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "darcy_solver.json"


def cg_seconds(a: torch.Tensor, repeats: int) -> tuple[float, float]:
    """Seconds per sample of a solve of the batch `a` (B, s, s), best of `repeats`; mean iterations."""
    h = torch.full((a.shape[0],), 1.0 / (a.shape[-1] - 1), dtype=torch.float64, device=a.device)
    best, iterations = float("inf"), 0.0
    for _ in range(repeats):
        if a.is_cuda:
            torch.cuda.synchronize()
        began = time.perf_counter()
        solution = five_point.solve(a, torch.ones_like(a), h)
        if a.is_cuda:
            torch.cuda.synchronize()
        best = min(best, time.perf_counter() - began)
        iterations = float(solution.iterations.double().mean())
    return best / a.shape[0], iterations


def direct_seconds(a: np.ndarray, ordering: str) -> float:
    """Seconds to assemble and solve one sample with SuperLU (`permc_spec=ordering`)."""
    began = time.perf_counter()
    rows, cols, values = five_point.sparse_matrix(torch.from_numpy(a), "harmonic")
    m = a.shape[0] - 2
    matrix = scipy.sparse.csc_matrix((values.numpy(), (rows.numpy(), cols.numpy())), shape=(m * m, m * m))
    scipy.sparse.linalg.spsolve(matrix, np.ones(m * m), permc_spec=ordering)
    return time.perf_counter() - began


ORDERINGS = ("COLAMD", "MMD_AT_PLUS_A")


def detail_path(out: Path) -> Path:
    """darcy_solver.json -> darcy_solver.detail.json: the measured rows beside the records."""
    return out.with_name(out.name.removesuffix(".json") + ".detail.json")


def records(row: dict, machine: str) -> list[dict[str, object]]:
    """The standard records of one measured row: one per SuperLU ordering."""
    cg = row["cg_seconds_per_sample"]
    where = "CPU" if row["device"] == "cpu" else row["device"]
    out = []
    for ordering in ORDERINGS:
        direct = row[f"spsolve_{ordering}_seconds"]
        out.append(
            {
                "case": f"Darcy solve {row['solve_grid']}^2, FNO 12/3 field, float64, CG on {where}",
                "baseline": f"scipy spsolve (SuperLU, permc_spec={ordering}) per sample, CPU",
                "metric": "seconds per sample",
                "dynaforge": cg,
                "baseline_value": direct,
                "ratio": direct / cg,
                "notes": (
                    f"ratio = scipy / CG (above 1: dynaforge faster); dynaforge: batched preconditioned CG "
                    f"of {row['cg_batch']} samples, best of 2 solves / batch, {row['cg_iterations_mean']!r} "
                    f"iterations on average; scipy: assembly + SuperLU solve of one sample, best of 2 "
                    f"samples; one thread; {machine}"
                ),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--quick", action="store_true", help="smoke run: a 17 x 17 solve grid")
    parser.add_argument("--out", type=Path, default=None, help=f"records (default {RESULTS.name})")
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    machine = load_note() + (f"; CG on {device_name(device)}" if device.type == "cuda" else "")
    rows = []
    grids = ((9, 2, 16),) if args.quick else ((49, 4, 64), (43, 10, 64))  # solve grids 17; 193 and 421
    for resolution, refinement, modes in grids:
        config = DarcyConfig(resolution=resolution, refinement=refinement, modes=modes)
        block = Darcy(config).block_samples(device)
        fields = [draw_permeability(config, np.random.default_rng(i)) for i in range(min(block, 64))]
        a = torch.from_numpy(np.stack(fields)).to(device)
        per_sample, iterations = cg_seconds(a, repeats=2)
        row = {
            "solve_grid": config.solve_points,
            "device": str(device),
            "cg_batch": a.shape[0],
            "cg_iterations_mean": iterations,
            "cg_seconds_per_sample": per_sample,
        }
        for ordering in ORDERINGS:
            row[f"spsolve_{ordering}_seconds"] = min(direct_seconds(fields[i], ordering) for i in range(2))
        print(json.dumps(row))
        rows.append(row)
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    atomic_write_json(detail_path(out), {"machine": machine, "rows": rows})
    atomic_write_json(out, [r for row in rows for r in records(row, machine)])
    print(f"wrote {out} and {detail_path(out).name}")


if __name__ == "__main__":
    main()
