"""`dynaforge generate --processes 2` against one process on a 2-core machine, for a 1D system.

    python benchmarks/generate_processes.py            # writes benchmarks/results/generate_processes.json
    python benchmarks/generate_processes.py --quick    # tiny sizes, written to a temporary folder (smoke run)

Each run is the whole `dynaforge generate` command, as a user types it (a fresh interpreter, its imports
included), of Burgers N=256 (configs/burgers1d.yaml: ETDRK4, dt 0.01, 200 steps, 101 frames) with 2,048
samples (times `--scale`) in shards of 256 and batches of 256 (two solver blocks of 128 per batch, so that one process of two
threads has two blocks to run side by side). Three configurations, alternated `--repeats` times:
- `--processes 2` (what `--processes auto` picks here): two processes of one thread each;
- `--processes 1` with OMP_NUM_THREADS=2: one process, its blocks on two threads (the default threads);
- `--processes 1` with OMP_NUM_THREADS=1: one process, one thread (the scaling reference).
Every output folder is checked to hold the same shard bytes as the first. Records (case, baseline, metric,
dynaforge, baseline_value, ratio, notes), ratio > 1: two processes faster; the medians of the wall times.
Run it under `/work/wt/_notes/heavy2` (or on an otherwise quiet machine): it needs both cores.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from dynaforge.atomic import atomic_write_json
from machine import load_note, machine_name
from smoke import quick_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "generate_processes.json"


def full(scale: int) -> list[str]:
    """The measured dataset: 2,048 samples (1,536 / 256 / 256) times `scale`, shards and batches of 256."""
    return [
        f"dataset.n_train={1536 * scale}",
        f"dataset.n_val={256 * scale}",
        f"dataset.n_test={256 * scale}",
        "dataset.shard_size=256",
        "dataset.batch_size=256",
    ]


QUICK = [
    "system.resolution=64",
    "system.steps=20",
    "dataset.n_train=8",
    "dataset.n_val=4",
    "dataset.n_test=4",
    "dataset.shard_size=4",
    "dataset.batch_size=4",
]
VARIANTS = {  # name: (--processes, OMP_NUM_THREADS)
    "2 processes": ("2", "2"),
    "1 process, 2 threads": ("1", "2"),
    "1 process, 1 thread": ("1", "1"),
}


def run_generate(overrides: list[str], out: Path, processes: str, threads: str) -> float:
    """Seconds of one `dynaforge generate` command (a fresh interpreter)."""
    env = {**os.environ, "OMP_NUM_THREADS": threads, "PYTHONPATH": str(ROOT / "src")}
    command = [
        sys.executable,
        "-m",
        "dynaforge.cli",
        "-q",
        "generate",
        str(ROOT / "configs" / "burgers1d.yaml"),
    ]
    command += [*overrides, "--out", str(out), "--no-progress", "--processes", processes]
    started = time.perf_counter()
    subprocess.run(command, check=True, env=env, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def shard_digest(root: Path) -> str:
    """SHA-256 over the shard files' data as the manifest records it (per-sample hashes, in order)."""
    manifest = json.loads((root / "manifest.json").read_text())
    digest = hashlib.sha256()
    for shard in manifest["shards"]:
        for value in shard["sample_sha256"]:
            digest.update(value.encode())
    return digest.hexdigest()


def import_seconds() -> float:
    """Seconds a fresh interpreter takes to import torch and dynaforge's generate stage (what a spawned
    worker would pay again; a forked one does not)."""
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-c", "import torch, dynaforge.generate"],
        check=True,
        env={**os.environ, "PYTHONPATH": str(ROOT / "src")},
    )
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one repeat, to a temporary folder")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--scale",
        type=int,
        default=1,
        help="dataset size: 2,048 samples times this (the command's fixed start-up weighs less on a larger one)",
    )
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    overrides, repeats = (QUICK, 1) if args.quick else (full(args.scale), args.repeats)
    out = quick_path(args.out) if args.quick else args.out
    work = Path(tempfile.mkdtemp(prefix="dynaforge-processes-"))
    times: dict[str, list[float]] = {name: [] for name in VARIANTS}
    digests = set()
    load_before = load_note()
    try:
        for repeat in range(repeats):
            order = list(VARIANTS) if repeat % 2 == 0 else list(reversed(VARIANTS))  # alternated
            for name in order:
                folder = work / f"{name.replace(' ', '_').replace(',', '')}-{repeat}"
                seconds = run_generate(overrides, folder, *VARIANTS[name])
                times[name].append(seconds)
                digests.add(shard_digest(folder))
                shutil.rmtree(folder)
                print(f"{name}: {seconds:.2f} s", flush=True)
        start_cost = import_seconds()
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if len(digests) != 1:
        raise SystemExit(f"the variants wrote different samples: {len(digests)} distinct digests")
    load_after = load_note()
    median = {name: statistics.median(values) for name, values in times.items()}
    samples = 16 if args.quick else 2048 * args.scale
    case = f"burgers_256 (ETDRK4, 200 steps, 101 frames), {samples} samples" + (
        " quick" if args.quick else ""
    )
    records = []
    for baseline in ("1 process, 2 threads", "1 process, 1 thread"):
        records.append(
            {
                "case": case,
                "baseline": f"dynaforge generate, {baseline}",
                "metric": "seconds per dataset (whole command)",
                "dynaforge": median["2 processes"],
                "baseline_value": median[baseline],
                "ratio": median[baseline] / median["2 processes"],
                "notes": (
                    f"{machine_name()}, torch {torch.__version__}; {samples} samples of Burgers N=256 in shards "
                    f"of 256, batches of 256; `dynaforge generate --processes 2` (forked workers, one thread "
                    f"each) against --processes 1 at OMP_NUM_THREADS={VARIANTS[baseline][1]}; median of "
                    f"{repeats} alternated runs each, seconds {', '.join(f'{k}: ' + ' '.join(f'{t:.2f}' for t in v) for k, v in times.items())}; "
                    f"the same per-sample SHA-256 in every run; a fresh interpreter's import of torch and "
                    f"dynaforge.generate {start_cost:.2f} s (in every command once); before: {load_before}; "
                    f"after: {load_after}; command: /work/wt/_notes/heavy2 .venv/bin/python "
                    f"benchmarks/generate_processes.py --scale {args.scale}"
                ),
            }
        )
    # Records of other dataset sizes are kept (those of before the size was named held 2,048 samples).
    earlier = json.loads(out.read_text()) if out.exists() else []
    old_label = "burgers_256 (ETDRK4, 200 steps, 101 frames)"
    earlier = [
        r | {"case": f"{old_label}, 2048 samples"} if r["case"] == old_label else r
        for r in earlier
        if not (r["case"] == case or (r["case"] == old_label and samples == 2048))
    ]
    atomic_write_json(out, earlier + records)
    for record in records:
        print(f"{record['case']}: {record['ratio']:.2f}x {record['baseline']}")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
