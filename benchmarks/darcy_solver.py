"""Time per Darcy sample: dynaforge's batched preconditioned CG (`systems/elliptic/five_point.py`) against a
sparse direct solve of the same matrix per sample (scipy's SuperLU, two orderings), one thread, on the solve
grids of configs/darcy.yaml (193 x 193) and of the FNO paper (421 x 421), the FNO paper's 12 / 3 field.

    python benchmarks/darcy_solver.py                 # CPU, one thread
    python benchmarks/darcy_solver.py --device cuda   # the CG on a GPU (scipy stays on the CPU)
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import scipy.sparse
import scipy.sparse.linalg
import torch

from dynaforge.systems.elliptic import five_point
from dynaforge.systems.elliptic.darcy import Darcy, DarcyConfig, draw_permeability
from machine import load_note

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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(1)
    device = torch.device(args.device)
    rows = []
    for resolution, refinement in ((49, 4), (43, 10)):  # solve grids 193 and 421
        config = DarcyConfig(resolution=resolution, refinement=refinement)
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
        for ordering in ("COLAMD", "MMD_AT_PLUS_A"):
            row[f"spsolve_{ordering}_seconds"] = min(direct_seconds(fields[i], ordering) for i in range(2))
        print(json.dumps(row))
        rows.append(row)
    args.out.write_text(json.dumps({"machine": load_note(), "rows": rows}, indent=2) + "\n")


if __name__ == "__main__":
    main()
