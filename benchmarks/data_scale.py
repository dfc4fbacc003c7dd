"""Training on stored datasets of 0.1x, 1x and 4x a memory budget: peak memory and training windows/s of
lazy reading (`data.reading=lazy`) against today's in-memory path (`data.reading=memory`) where it fits.

Data: the quickstart's viscous Burgers system (128 points, 51 frames: 26 112 bytes a trajectory), generated
by `dynaforge generate` into BENCH_DATA (default /tmp/dynaforge-data-scale, outside git) with as many train
trajectories as 0.1, 1 and 4 times the budget hold (val and test: 16 each). Model: the quickstart FNO
(width 32, 16 modes, 4 layers), AdamW, batch 32, one torch thread.

Each case runs in a fresh interpreter: it builds the trainer (`train.window.window_engine`, which verifies
every shard's SHA-256 and then reads the splits whole or opens them lazily), trains WARMUP micro-batches,
then times STEPS more (the files were just written, so they sit in the page cache), and reports its peak
RSS (`ru_maxrss`). The *floor* is the same run on a dataset of 64 trajectories held in memory: torch, the
model, the optimiser and the trainer, without data to speak of. Data memory = peak RSS - floor; the budget
applies to it (the floor is the same for every dataset size). A record per lazy case also holds the peak
RSS of the whole process against the budget: with a budget above the floor (e.g. `--budget-mib 1024`), the
whole training process stays under it while reading a dataset four times its size.

Writes benchmarks/results/data_scale.json (ratio > 1: dynaforge's lazy path better); records of other
budgets already there are kept. Run:
`flock /tmp/dynaforge-heavy.lock env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/data_scale.py
--budget-mib 1024`

`--quick` is the smoke run (`make bench-smoke`): the 0.1x and 1x cases at a 0.5 MiB budget (2 and 20 train
trajectories; the in-memory 0.1x case is the floor), 2 warm-up and 5 timed micro-batches, one run each,
datasets in a temporary folder; not a figure, written to a temporary folder (smoke.quick_path).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from dynaforge.atomic import atomic_write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import load_note
from smoke import quick_path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "data_scale.json"
TRAJECTORY_BYTES = 51 * 128 * 4
SCALES, QUICK_SCALES = (0.1, 1.0, 4.0), (0.1, 1.0)
"""Dataset sizes as multiples of the budget (the smoke run leaves out the largest)."""
WARMUP, STEPS = 100, 600

CHILD = r"""
import itertools, json, resource, sys, time
import torch
from dynaforge.config import load_config
from dynaforge.train.window import window_engine

config_path, data, out, reading, buffer, warmup, steps = sys.argv[1:8]
torch.set_num_threads(1)
config = load_config(config_path, [f"data.reading={reading}", f"data.buffer={buffer}", "train.epochs=1"])
engine = window_engine(config, data, out, overwrite=True, progress=False)
engine.model.train()
batches = itertools.chain.from_iterable(engine.task.epoch_batches(e, 0) for e in itertools.count())
done = 0
for i, batch in enumerate(itertools.islice(batches, int(warmup) + int(steps))):
    if i == int(warmup):
        started = time.perf_counter()
    engine.micro_step(batch)
    done += batch[0].shape[0] if i >= int(warmup) else 0
seconds = time.perf_counter() - started
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
print(json.dumps({"windows_per_s": done / seconds, "peak_rss_mib": peak}))
"""


def make_dataset(root: Path, n_train: int) -> Path:
    folder = root / f"burgers-{n_train}"
    if (folder / "manifest.json").exists() and json.loads((folder / "manifest.json").read_text()).get(
        "complete"
    ):
        return folder
    overrides = [
        f"dataset.n_train={n_train}",
        "dataset.n_val=16",
        "dataset.n_test=16",
        "dataset.shard_size=1024",
    ]
    command = [
        sys.executable,
        "-m",
        "dynaforge.cli",
        "-q",
        "generate",
        str(REPO / "configs" / "quickstart.yaml"),
    ]
    subprocess.run([*command, *overrides, "--out", str(folder), "--no-progress"], check=True)
    # The files stay in the page cache; flush them to disk now, so that the kernel's write-back of
    # gigabytes does not run during the timed cases (it slowed the first 1 GiB run's in-memory case too).
    os.sync()
    return folder


def run_case(
    data: Path, reading: str, buffer: int, out: Path, steps: int, warmup: int = WARMUP
) -> dict[str, float]:
    config = data / "config.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    args = [str(config), str(data), str(out), reading, str(buffer), str(warmup), str(steps)]
    result = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-2000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny budget and steps, to a temporary folder"
    )
    parser.add_argument("--budget-mib", type=float, default=256.0)
    parser.add_argument("--buffer", type=int, default=64, help="data.buffer of the lazy runs")
    parser.add_argument("--steps", type=int, default=STEPS, help="timed micro-batches per case")
    parser.add_argument(
        "--repeats", type=int, default=3, help="runs of each case, interleaved; the median windows/s is kept"
    )
    parser.add_argument("--data", default=os.environ.get("BENCH_DATA", "/tmp/dynaforge-data-scale"))
    args = parser.parse_args()
    results = quick_path(RESULTS) if args.quick else RESULTS
    warmup = 2 if args.quick else WARMUP
    if args.quick:
        args.budget_mib, args.steps, args.repeats = 0.5, 5, 1
    with tempfile.TemporaryDirectory() as quick_data:
        root = Path(quick_data if args.quick else args.data)
        runs = measure(args, root, warmup)
    write_records(args, runs, results, warmup)


def measure(args: argparse.Namespace, root: Path, warmup: int) -> dict[str, dict]:
    """Every case's windows/s and peak RSS (the floor first)."""
    root.mkdir(parents=True, exist_ok=True)
    budget = args.budget_mib
    sizes = dataset_sizes(budget, args.quick)
    runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "run"
        if not args.quick:  # the smoke run's floor is its in-memory 0.1x case
            runs["floor"] = run_case(make_dataset(root, 64), "memory", args.buffer, out, args.steps, warmup)
        for scale, n in sizes.items():
            data = make_dataset(root, n)
            readings = ["lazy", "memory"] if scale <= 1.0 else ["lazy"]
            timed: dict[str, list[dict[str, float]]] = {reading: [] for reading in readings}
            for _ in range(args.repeats):  # interleaved, so that a slow spell of the machine hits both
                for reading in readings:
                    timed[reading].append(run_case(data, reading, args.buffer, out, args.steps, warmup))
            for reading, results in timed.items():
                runs[f"{reading} {scale}x"] = {
                    "windows_per_s": statistics.median(r["windows_per_s"] for r in results),
                    "peak_rss_mib": max(r["peak_rss_mib"] for r in results),
                    "all_windows_per_s": [r["windows_per_s"] for r in results],
                }
            print(scale, n, {k: v for k, v in runs.items() if k.endswith(f"{scale}x")}, flush=True)
    runs.setdefault("floor", runs["memory 0.1x"])
    return runs


def dataset_sizes(budget: float, quick: bool) -> dict[float, int]:
    """Train trajectories of each dataset: scale -> count."""
    return {
        scale: int(scale * budget * 2**20 / TRAJECTORY_BYTES) for scale in (QUICK_SCALES if quick else SCALES)
    }


def write_records(args: argparse.Namespace, runs: dict[str, dict], results: Path, warmup: int) -> None:
    """The records of `runs`, added to those of other budgets in `results`."""
    budget = args.budget_mib
    sizes = dataset_sizes(budget, args.quick)
    floor = runs["floor"]["peak_rss_mib"]
    notes = (
        f"budget {budget:g} MiB for data (peak RSS - floor; floor {floor:.0f} MiB: torch, model, optimiser, "
        f"trainer on 64 trajectories); datasets {', '.join(f'{s}x = {n} trajectories' for s, n in sizes.items())} "
        f"of 26 112 B; quickstart FNO, batch 32, {args.steps} timed micro-batches after {warmup}, median of "
        f"{args.repeats} interleaved runs per case (peak RSS: the largest), 1 torch thread, "
        f"page cache warm, lazy data.buffer={args.buffer}. {load_note()} (other helpers shared the 2 cores: "
        "timings noisy)"
    )
    records = []
    tag = f"a {budget:g} MiB budget"
    memory_rate = runs["memory 1.0x"]["windows_per_s"]
    for scale in sizes:
        lazy = runs[f"lazy {scale}x"]
        records.append(
            {
                "case": f"lazy reading, dataset {scale}x {tag}: training windows/s",
                "baseline": "in-memory path on the 1x dataset",
                "metric": "windows/s (higher is better)",
                "dynaforge": lazy["windows_per_s"],
                "baseline_value": memory_rate,
                "ratio": lazy["windows_per_s"] / memory_rate,
                "notes": f"lazy runs {', '.join(f'{w:.0f}' for w in lazy['all_windows_per_s'])}; in-memory 1x "
                f"runs {', '.join(f'{w:.0f}' for w in runs['memory 1.0x']['all_windows_per_s'])}. " + notes,
            }
        )
        data_mib = max(lazy["peak_rss_mib"] - floor, 0.0)
        records.append(
            {
                "case": f"lazy reading, dataset {scale}x {tag}: data memory (peak RSS - floor)",
                "baseline": f"the budget, {budget:g} MiB",
                "metric": "MiB (lower is better)",
                "dynaforge": data_mib,
                "baseline_value": budget,
                "ratio": budget / max(data_mib, 1.0),
                "notes": f"peak RSS {lazy['peak_rss_mib']:.0f} MiB. " + notes,
            }
        )
        records.append(
            {
                "case": f"lazy reading, dataset {scale}x {tag}: peak RSS of the whole training process",
                "baseline": f"the budget, {budget:g} MiB",
                "metric": "MiB (lower is better; under the budget when the ratio is above 1)",
                "dynaforge": lazy["peak_rss_mib"],
                "baseline_value": budget,
                "ratio": budget / lazy["peak_rss_mib"],
                "notes": notes,
            }
        )
    for scale in (0.1, 1.0):
        memory = runs[f"memory {scale}x"]
        lazy = runs[f"lazy {scale}x"]
        records.append(
            {
                "case": f"dataset {scale}x {tag}: data memory, lazy vs in-memory",
                "baseline": "in-memory path (data.reading=memory)",
                "metric": "MiB of data memory (lower is better)",
                "dynaforge": max(lazy["peak_rss_mib"] - floor, 0.0),
                "baseline_value": max(memory["peak_rss_mib"] - floor, 0.0),
                "ratio": max(memory["peak_rss_mib"] - floor, 1.0) / max(lazy["peak_rss_mib"] - floor, 1.0),
                "notes": f"in-memory {memory['windows_per_s']:.0f} windows/s (runs: "
                f"{', '.join(f'{w:.0f}' for w in memory['all_windows_per_s'])}), lazy "
                f"{lazy['windows_per_s']:.0f} (runs: {', '.join(f'{w:.0f}' for w in lazy['all_windows_per_s'])}). "
                + notes,
            }
        )
    results.parent.mkdir(parents=True, exist_ok=True)
    # Records of other budgets are kept (those of the first version, 256 MiB, name no budget).
    kept = json.loads(results.read_text()) if results.exists() else []
    kept = [r for r in kept if tag not in r["case"]]
    atomic_write_json(results, kept + records)
    print(f"wrote {results}")
    print(json.dumps(runs, indent=1))


if __name__ == "__main__":
    main()
