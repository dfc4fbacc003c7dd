"""How far the golden curve of configs/tiny.yaml moves when only the last bits change, and how far real
changes move it: the measurement behind the tolerance of `test_loss_decreases_along_the_golden_curve`.

Last-bit changes, each a full `dynaforge run configs/tiny.yaml` in its own process:
- the code paths this machine can take: torch threads 1/2, MKL's AVX2 path instead of its AVX-512 one
  (`MKL_ENABLE_INSTRUCTIONS=AVX2`, what an AMD CPU gets), torch's AVX2 kernels (`ATEN_CPU_CAPABILITY`),
  oneDNN without AVX-512 (`ONEDNN_MAX_CPU_ISA`);
- `--perturbations` copies of the dataset with one value in 16 of the training fields moved by one unit in
  the last place (seeded), trained with the same config.
Changes a regression test should catch: the same run with one setting changed (learning rate, modes, width,
schedule).

Run: `.venv/bin/python tests/integration/golden/measure_spread.py [--perturbations 12]` (about 4 minutes on
a 2-core machine); prints the largest relative deviation from the golden values per epoch for each group.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import h5py
import numpy as np

ROOT = Path(__file__).resolve().parents[3]
TINY = ROOT / "configs" / "tiny.yaml"
GOLDEN = json.loads((Path(__file__).parent / "tiny_val_loss.json").read_text())["val_loss"]

CODE_PATHS = {
    "2 threads": {"OMP_NUM_THREADS": "2"},
    "MKL AVX2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "MKL AVX2, 2 threads": {"MKL_ENABLE_INSTRUCTIONS": "AVX2", "OMP_NUM_THREADS": "2"},
    "torch AVX2 kernels": {"ATEN_CPU_CAPABILITY": "avx2"},
    "oneDNN AVX2": {"ONEDNN_MAX_CPU_ISA": "AVX2"},
}
REGRESSIONS = {
    "learning rate 0.008 (-20%)": ["train.lr=0.008"],
    "6 Fourier modes instead of 8": ["model.modes=6"],
    "width 6 instead of 8": ["model.width=6"],
    "constant schedule instead of cosine": ["train.schedule.name=constant"],
}


def dynaforge(args: list[str], env: dict[str, str]) -> None:
    command = [sys.executable, "-m", "dynaforge.cli", "-q", *args, "--no-progress"]
    subprocess.run(
        command, check=True, env={**os.environ, "OMP_NUM_THREADS": "1", **env}, capture_output=True
    )


def val_losses(run: Path) -> list[float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return [r["val_loss"] for r in records if r["kind"] == "epoch"]


def deviation(curve: list[float]) -> list[float]:
    return [abs(a / b - 1) for a, b in zip(curve, GOLDEN, strict=True)]


def nudge_one_in_sixteen(root: Path, seed: int) -> None:
    """Move one value in 16 of every training shard's fields by one unit in the last place."""
    rng = np.random.default_rng(seed)
    for shard in sorted((root / "train").glob("shard-*.h5")):
        with h5py.File(shard, "r+") as h5:
            fields = h5["fields"][...]
            chosen = rng.random(fields.shape) < 1 / 16
            toward = np.where(rng.random(fields.shape) < 0.5, np.inf, -np.inf).astype(np.float32)
            h5["fields"][...] = np.where(chosen, np.nextafter(fields, toward), fields)


def report(name: str, curve: list[float]) -> list[float]:
    dev = deviation(curve)
    print(f"  {name:40s} " + " ".join(f"{d * 100:6.2f}%" for d in dev), flush=True)
    return dev


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--perturbations", type=int, default=12)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        work_dir = Path(work)
        groups: dict[str, list[list[float]]] = {"code paths": [], "last-bit data": [], "regressions": []}
        print("relative deviation from the golden val_loss, per epoch")
        print("code paths (a full run each):")
        for name, env in CODE_PATHS.items():
            dynaforge(["run", str(TINY), "--out", str(work_dir / name)], env)
            groups["code paths"].append(report(name, val_losses(work_dir / name / "run")))
        data = work_dir / "reference" / "data"
        dynaforge(["run", str(TINY), "--out", str(work_dir / "reference")], {})
        report("reference (this machine, 1 thread)", val_losses(work_dir / "reference" / "run"))
        print("last-bit changes of the training data:")
        for seed in range(args.perturbations):
            copy = work_dir / f"nudged-{seed}"
            shutil.copytree(data, copy)
            nudge_one_in_sixteen(copy, seed)
            dynaforge(["train", str(TINY), "--data", str(copy), "--out", str(copy / "run")], {})
            groups["last-bit data"].append(report(f"seed {seed}", val_losses(copy / "run")))
        print("changes a golden test should catch:")
        for name, overrides in REGRESSIONS.items():
            out = work_dir / name.replace(" ", "_")
            dynaforge(["train", str(TINY), *overrides, "--data", str(data), "--out", str(out)], {})
            groups["regressions"].append(report(name, val_losses(out)))
        print("largest deviation per epoch:")
        for name, rows in groups.items():
            worst = np.max(np.asarray(rows), axis=0)
            print(f"  {name:40s} " + " ".join(f"{d * 100:6.2f}%" for d in worst))
        smallest = np.min(np.max(np.asarray(groups["regressions"]), axis=1))
        print(f"smallest largest-epoch deviation of a regression: {smallest * 100:.2f}%")


if __name__ == "__main__":
    main()
