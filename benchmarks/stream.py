"""Streaming against stored datasets at equal wall-clock budgets, generation included: FNO on Burgers 1D and KS 1D.

Systems: the quickstart's viscous Burgers (128 points, 51 frames, t in [0, 1]) and configs/ks1d.yaml's
Kuramoto-Sivashinsky (L = 100, 200 points, 101 frames 0.5 apart, t in [0, 50]). The model is the quickstart
FNO for both (width 32, 16 modes, 4 layers, 2 input frames -> 1), AdamW, batch 32, one torch thread for
training, the learning rate a cosine from 2e-3 to 0 over the wall clock left for training (set before every
step from the time elapsed: each case ends its budget with a decayed rate; at a constant rate the final
weights were too noisy to compare, runs of one case differing by up to 2x in rollout error). Every case gets
the same wall-clock budget B, counted from its start:

- disk N: `dynaforge generate` of N train trajectories (timed, inside the budget), then training on them
  (`data.reading=memory`) epoch after epoch until the budget is spent;
- stream: `data.source=stream` (buffer 64, reuse 2: each trajectory drawn in two rounds of all its
  windows, then replaced), generated while training runs by `--workers` generator processes
  (`data.stream.workers`, default 1; 0: a thread of the training process, as before issue 36).

All are scored on one fixed test split (32 trajectories of seed 0's test stream, never trained on), with
the normalisation of the 64-trajectory dataset for every case: the one-step nRMSE (every test window, true
inputs) and the 20-step rollout nRMSE from frames 0 and 1 (mean of the 20 frames), PDEBench's nRMSE
(`dynaforge.metrics.fields.nrmse_per_frame`) in physical units. Ratio = best disk error / stream error (> 1:
streaming better).

Besides the ratio at each budget, where budgets B and B/2 were both measured a record compares the stream
at B/2 with the best disk dataset at B (ratio > 1: the stream reached the best disk error in half the time),
and one compares training speed: the stream's windows per second against the fastest disk case's (trained
from memory), both counted from the end of the first step to the end of the budget (the start-up, the disk
cases' generation and the stream's first wait for its generator left out), issue 36's goal >= 0.95.

Writes benchmarks/results/stream.json (records), stream.runs.json (every case) and docs/stream.png (with
`--tag TAG`: stream.TAG.json, stream.TAG.runs.json and benchmarks/results/stream.TAG.png). Run:
`flock /tmp/dynaforge-heavy.lock env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/stream.py
--systems burgers,ks --budgets 30,60,120`

`--quick` is the smoke run (`make bench-smoke`): Burgers, a 3 s budget, one disk size (4 trajectories) and
the stream; not a figure: the records, runs and figure go to a temporary folder (smoke.quick_path).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from dynaforge.atomic import atomic_write_json

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import load_note
from smoke import quick_path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "stream.json"
DOCS_FIGURE = REPO / "docs" / "stream.png"
"""The figure the README shows (committed; benchmarks/results/*.png are not)."""
QUICKSTART = REPO / "configs" / "quickstart.yaml"
SYSTEMS = {"burgers": "Burgers 1D", "ks": "KS 1D"}
"""The --systems names and the labels their records carry."""
COMMON = [
    "train.schedule.name=constant",
    "train.schedule.warmup_fraction=0",
    "train.lr=0.002",
    "train.epochs=1000",
    "data.batch_size=32",
    "dataset.n_val=16",
    "dataset.n_test=32",
]

CHILD = r"""
import itertools, json, math, subprocess, sys, time
import torch
from dynaforge.config import load_config
from dynaforge.data import Normalizer
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.models import ModelInput, autoregressive_rollout
from dynaforge.store import DatasetFolder
from dynaforge.train.window import window_engine
from dynaforge.store.layout import fields_from_disk

budget, case, reference, scratch = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
overrides = json.loads(sys.argv[5])
started = time.perf_counter()
torch.set_num_threads(1)
if case == "stream":
    overrides += ["data.source=stream", "data.stream.buffer=64", "data.stream.reuse=2",
                  f"data.stream.workers={sys.argv[7]}"]
    data = reference  # val split and normalisation; training samples are streamed
else:
    data = scratch + "/data"
    n = int(case)
    subprocess.run([sys.executable, "-m", "dynaforge.cli", "-q", "generate", sys.argv[6], *overrides,
                    f"dataset.n_train={n}", "dataset.shard_size=1024", "--out", data, "--no-progress"], check=True)
    overrides += [f"dataset.n_train={n}"]
generated = time.perf_counter() - started
config = load_config(sys.argv[6], overrides)
engine = window_engine(config, data, scratch + "/run", overwrite=True, progress=False)
engine.model.train()
windows = 0
epoch = 0
steady_from, steady_windows = None, 0
peak = config.train.lr
first = time.perf_counter()
left = budget - (first - started)

def set_lr(value):
    for group in engine.optimizer.param_groups:
        if isinstance(group["lr"], torch.Tensor):
            group["lr"].fill_(value)
        else:
            group["lr"] = value

while time.perf_counter() - started < budget:
    engine.current_epoch, engine.batches_done = epoch, 0
    for batch in engine.task.epoch_batches(epoch, 0):
        engine.batches_done += 1
        done = min((time.perf_counter() - first) / left, 1.0)
        set_lr(0.5 * peak * (1.0 + math.cos(math.pi * done)))
        engine.micro_step(batch)
        windows += batch[0].shape[0]
        if steady_from is None:  # after the first step: start-up (and a stream's first wait) left out
            steady_from, steady_windows = time.perf_counter(), windows
        if time.perf_counter() - started >= budget:
            break
    epoch += 1
trained = time.perf_counter() - started - generated
steady_s = time.perf_counter() - steady_from if steady_from is not None else 0.0
engine.task.close()
made = engine.task.sources.loaded() if engine.task.sources.kind else int(case)

# Score on the fixed test split, physical units, the reference normalisation for every case.
folder = DatasetFolder(reference)
norm = Normalizer.from_stats(folder.stats)
test = fields_from_disk(folder.read_split("test").fields)  # (N, T, C, X)
model = engine.model.eval()
inputs = norm.physical_to_normalized(test, 1)
with torch.inference_mode():
    starts = range(0, test.shape[1] - 2)
    frames = torch.stack([inputs[:, s : s + 2] for s in starts], 1).flatten(0, 1)
    one = autoregressive_rollout(model, ModelInput(frames=frames), 1)
    truth_one = torch.stack([test[:, s + 2 : s + 3] for s in starts], 1).flatten(0, 1)
    one_step = float(nrmse_per_frame(norm.normalized_to_physical(one, 1), truth_one).mean())
    roll = autoregressive_rollout(model, ModelInput(frames=inputs[:, :2]), 20)
    rollout = float(nrmse_per_frame(norm.normalized_to_physical(roll, 1), test[:, 2:22]).mean())
print(json.dumps({"case": case, "generate_s": generated, "train_s": trained, "windows": windows,
                  "trajectories": made, "one_step": one_step, "rollout20": rollout,
                  "steady_windows": windows - steady_windows, "steady_s": steady_s}))
"""


def system_config(system: str, root: Path) -> Path:
    """The config a system's cases run: the quickstart itself for Burgers; for KS, the quickstart's data,
    model and training sections with configs/ks1d.yaml's system."""
    if system == "burgers":
        return QUICKSTART
    import yaml  # lazy: only the KS config is assembled

    config = yaml.safe_load(QUICKSTART.read_text())
    config["system"] = yaml.safe_load((REPO / "configs" / "ks1d.yaml").read_text())["system"]
    path = root / f"{system}.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def run_case(budget: float, case: str, reference: Path, config: Path, workers: int) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}
    with tempfile.TemporaryDirectory() as scratch:
        args = [str(budget), case, str(reference), scratch, json.dumps(COMMON), str(config), str(workers)]
        result = subprocess.run([sys.executable, "-c", CHILD, *args], capture_output=True, text=True, env=env)
    if result.returncode != 0:
        raise RuntimeError(result.stderr[-3000:])
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: Burgers, 3 s, 4 trajectories; to a temporary folder"
    )
    parser.add_argument("--systems", default="burgers", help=f"comma-separated, of {', '.join(SYSTEMS)}")
    parser.add_argument("--budgets", default="60", help="comma-separated wall-clock budgets in seconds")
    parser.add_argument("--sizes", default="64,256,1024", help="disk dataset sizes (train trajectories)")
    parser.add_argument(
        "--workers", type=int, default=1, help="the stream's generator processes (0: a thread, as before)"
    )
    parser.add_argument(
        "--tag",
        default="",
        help="write stream.TAG.json, stream.TAG.runs.json and benchmarks/results/stream.TAG.png (another "
        "machine or setting; the README's figure stays docs/stream.png)",
    )
    parser.add_argument(
        "--plot-only", action="store_true", help="redraw docs/stream.png from stream.runs.json"
    )
    args = parser.parse_args()
    if args.quick:
        args.systems, args.budgets, args.sizes = "burgers", "3", "4"
    named = RESULTS.with_name(f"stream.{args.tag}.json") if args.tag else RESULTS
    records_path = quick_path(named) if args.quick else named
    figure = records_path.with_suffix(".png") if args.tag else DOCS_FIGURE
    figure = quick_path(figure) if args.quick else figure
    runs_path = records_path.with_name(records_path.stem + ".runs.json")
    if args.plot_only:
        plot(read_runs(runs_path), figure)
        return
    systems = args.systems.split(",")
    unknown = sorted(set(systems) - set(SYSTEMS))
    if unknown:
        parser.error(f"unknown system(s) {', '.join(unknown)}: choose from {', '.join(SYSTEMS)}")
    budgets = [float(b) for b in args.budgets.split(",")]
    sizes = args.sizes.split(",")
    runs = read_runs(runs_path)
    with tempfile.TemporaryDirectory() as root:
        for system in systems:
            config = system_config(system, Path(root))
            reference = Path(root) / f"reference-{system}"
            command = [sys.executable, "-m", "dynaforge.cli", "-q", "generate", str(config), *COMMON]
            subprocess.run(
                [*command, "dataset.n_train=64", "--out", str(reference), "--no-progress"],
                check=True,
                env={**os.environ, "PYTHONPATH": str(REPO / "src")},
            )
            for budget in budgets:
                results = {
                    case: run_case(budget, case, reference, config, args.workers)
                    for case in [*sizes, "stream"]
                }
                run = {
                    "system": SYSTEMS[system],
                    "budget_s": budget,
                    "workers": args.workers,
                    "results": results,
                    "machine": load_note(),
                }
                print(json.dumps(run, indent=1), flush=True)
                # Runs of other systems and budgets measured earlier are kept; this one replaces its own.
                runs = [r for r in runs if (r["system"], r["budget_s"]) != (run["system"], budget)] + [run]
                atomic_write_json(runs_path, runs)
                atomic_write_json(records_path, records_of(runs))
    plot(runs, figure)
    print(f"wrote {records_path}, {runs_path.name} and {figure}")


def records_of(runs: list[dict]) -> list[dict]:
    """The benchmark records of every run: stream against the best disk dataset at each budget, and, where
    budgets B and B/2 were both measured for a system, the stream at B/2 against the best disk at B."""
    records = []
    by_key = {(r["system"], r["budget_s"]): r for r in runs}
    for run in sorted(runs, key=lambda r: (r["system"], r["budget_s"])):
        system, budget, results = run["system"], run["budget_s"], run["results"]
        sizes = [c for c in results if c != "stream"]
        stream = results["stream"]
        half = by_key.get((system, budget / 2))
        for metric, key in (("20-step rollout nRMSE", "rollout20"), ("one-step nRMSE", "one_step")):
            best = min(sizes, key=lambda s: results[s][key])
            records.append(
                {
                    "case": f"{system} FNO, {budget:g} s wall clock incl. generation: {metric}",
                    "baseline": f"best disk dataset ({best} trajectories, of {', '.join(sizes)})",
                    "metric": f"test {metric} (lower is better)",
                    "dynaforge": stream[key],
                    "baseline_value": results[best][key],
                    "ratio": results[best][key] / stream[key],
                    "notes": "; ".join(
                        f"{c}: generate {r['generate_s']:.1f} s, train {r['train_s']:.1f} s, "
                        f"{r['windows']} windows, {r['trajectories']} trajectories, one-step "
                        f"{r['one_step']:.4f}, 20-step {r['rollout20']:.4f}"
                        for c, r in results.items()
                    )
                    + f". {run.get('machine', 'machine not recorded (an earlier run)')}; one seed per case; "
                    + generator_note(run),
                }
            )
            if half is not None:
                records.append(
                    {
                        "case": f"{system} FNO, stream at {budget / 2:g} s vs disk at {budget:g} s: {metric}",
                        "baseline": f"best disk dataset at {budget:g} s ({best} trajectories)",
                        "metric": f"test {metric} (lower is better); ratio > 1: the stream reached the best "
                        "disk error in half the wall time",
                        "dynaforge": half["results"]["stream"][key],
                        "baseline_value": results[best][key],
                        "ratio": results[best][key] / half["results"]["stream"][key],
                        "notes": f"{half.get('machine', '')}; one seed per case",
                    }
                )
        speed = {c: r["steady_windows"] / r["steady_s"] for c, r in results.items() if r.get("steady_s")}
        fastest = max((s for s in sizes if s in speed), key=speed.get, default=None)
        if fastest is None or "stream" not in speed:
            continue  # a run before the speed was recorded, or a smoke run with no disk step
        records.append(
            {
                "case": f"{system} FNO, {budget:g} s: training windows per second, stream vs memory",
                "baseline": f"the fastest disk dataset, trained from memory ({fastest} trajectories)",
                "metric": "training windows per second after the first step (higher is better; goal >= 0.95)",
                "dynaforge": speed["stream"],
                "baseline_value": speed[fastest],
                "ratio": speed["stream"] / speed[fastest],
                "notes": ", ".join(f"{c}: {v:.0f} windows/s" for c, v in speed.items())
                + f". {run.get('machine', 'machine not recorded (an earlier run)')}; "
                + generator_note(run),
            }
        )
    return records


def generator_note(run: dict) -> str:
    """Where a run's stream was generated (runs before issue 36 record no workers: a thread)."""
    workers = run.get("workers", 0)
    if workers == 0:
        return "the stream's generator thread can use the second core while training uses one"
    return f"the stream generated in {workers} worker process(es) beside the one training thread"


def plot(runs: list[dict], out: Path) -> None:
    """Test nRMSE (one-step and 20-step rollout) against the wall-clock budget, one line per case, one row
    of panels per system."""
    import matplotlib  # lazy: only the figure needs it

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # lazy: as above

    systems = sorted({r["system"] for r in runs})
    figure, grid = plt.subplots(
        len(systems), 2, figsize=(9, 3.4 * len(systems)), constrained_layout=True, squeeze=False
    )
    for axes, system in zip(grid, systems, strict=True):
        mine = sorted((r for r in runs if r["system"] == system), key=lambda r: r["budget_s"])
        budgets = [r["budget_s"] for r in mine]
        for ax, (key, title) in zip(
            axes, (("one_step", "one-step"), ("rollout20", "20-step rollout")), strict=True
        ):
            for case in mine[0]["results"]:
                label = "stream" if case == "stream" else f"disk, {case} trajectories"
                values = [r["results"][case][key] for r in mine]
                ax.plot(budgets, values, marker="o", label=label, linewidth=2.5 if case == "stream" else 1.2)
            ax.set_xlabel("wall clock incl. generation [s]")
            ax.set_ylabel(f"test {title} nRMSE")
            ax.set_yscale("log")
            ax.set_title(f"{system}, FNO: {title}")
        axes[0].legend(fontsize=8)
    figure.savefig(out, dpi=120)
    plt.close(figure)


def read_runs(path: Path) -> list[dict]:
    """Every run measured so far (runs of the first version, Burgers only, carry no system: Burgers 1D)."""
    runs = json.loads(path.read_text()) if path.exists() else []
    return [{"system": "Burgers 1D", **r} for r in runs]


if __name__ == "__main__":
    main()
