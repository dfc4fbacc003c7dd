"""APEBench's `diff_burgers` scenario (Koehler, Niedermayr, Westermann & Thuerey, NeurIPS 2024; APEBench 0.1.1):
dynaforge's default surrogate against APEBench's default emulator, both trained on exactly APEBench's
trajectories for the same wall time, scored by APEBench's own per-step nRMSE over its 200-step test rollout.

The scenario with its defaults: 1D viscous Burgers in difficulty form (convection difficulty 1.5, diffusion
difficulty 1.5), 160 points, initial conditions truncated Fourier series (5 modes, zero mean, max one),
50 training trajectories of 50 steps (seed 0), 30 test trajectories of 200 steps (seed 773).
- APEBench: its default emulator `Conv;34;10;relu` trained by its default `one` (one-step supervised) with its
  default optimiser (Adam, 10,000 steps, warmup-cosine to 1e-3, batch 20), the seed choosing the network's
  initialisation and shuffling as `scenario(start_seed=seed)` does. Its clock covers the training call only
  (with its JIT compilation), not the data generation before or the test after.
- dynaforge: `configs/apebench_burgers.yaml` (the quickstart FNO) trained by the window engine on the same
  50 trajectories, converted to a dataset folder, with `train.time_budget` = APEBench's measured seconds of
  the same seed; validation on 10 more trajectories from APEBench's generator (train seed 1).
- The metric: APEBench's `mean_nRMSE` (`scenario.perform_tests` for its emulator, `perform_tests_on_rollout`
  for dynaforge's rollout of the same test initial conditions): per step, the mean over the 30 test
  trajectories of ||pred - ref|| / ||ref||. Records at steps 1, 10, 50, 100, 200 and the mean over the 200,
  each the mean of the seeds; ratio = APEBench's nRMSE / dynaforge's (> 1: dynaforge lower).
Both on one thread (torch.set_num_threads(1); XLA's CPU client told to use one thread).

APEBench 0.1.1 pins exponax 0.1.0 and the main benchmark environment holds exponax 0.2.0, so this script runs
in its own environment, `.venv-apebench` (`make bench-env-apebench`; benchmarks/requirements-apebench.txt,
constraints/bench-apebench.txt); started from another interpreter it runs itself again there.

    .venv-apebench/bin/python benchmarks/apebench.py --seeds 0,1,2     # results/apebench.json (+ .detail.json)
    .venv-apebench/bin/python benchmarks/apebench.py --quick           # smoke run: not a figure

`--quick`: 4 training and 4 test trajectories, 200 APEBench steps, to a temporary folder (smoke.quick_path).
APEBench's runs are cached per seed in --cache (their curves and seconds), so dynaforge's side can be rerun
alone (`--variant NAME=override,override` adds a dynaforge run with config overrides, for diagnosis).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
# this script's folder comes first on sys.path and this file is named apebench.py: without it there,
# `import apebench` finds APEBench, not this script (the folder is added back, last, for machine and smoke)
sys.path = [p for p in sys.path if Path(p or ".").resolve() != HERE]
APE_PYTHON = HERE.parent / ".venv-apebench" / "bin" / "python"


def run_in_own_environment() -> None:
    """Without APEBench importable here, run again with .venv-apebench's interpreter (or say how to build it)."""
    try:
        import apebench  # noqa: F401
    except ImportError:
        if not APE_PYTHON.exists():
            sys.exit(
                "error: APEBench is not installed here and .venv-apebench does not exist: run "
                "`make bench-env-apebench` (APEBench 0.1.1 pins exponax 0.1.0, so it has its own environment)"
            )
        os.execv(str(APE_PYTHON), [str(APE_PYTHON), str(Path(__file__).resolve()), *sys.argv[1:]])


if __name__ == "__main__":
    run_in_own_environment()
    # one thread for XLA's CPU client, before jax is imported
    os.environ.setdefault("XLA_FLAGS", "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1")
    os.environ.setdefault("TQDM_DISABLE", "1")  # APEBench's per-step training bar

import argparse  # noqa: E402
import json  # noqa: E402
import statistics  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from typing import Any  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

sys.path.append(str(HERE))
from dynaforge.atomic import atomic_write_json  # noqa: E402
from dynaforge.config import load_config  # noqa: E402
from dynaforge.models import ModelInput  # noqa: E402
from dynaforge.store.convert import convert  # noqa: E402
from dynaforge.store.pdebench import write_tensor_file  # noqa: E402
from dynaforge.train.window import window_engine  # noqa: E402
from machine import load_note  # noqa: E402
from smoke import quick_path  # noqa: E402

RESULTS = HERE / "results" / "apebench.json"
CONFIG = HERE.parent / "configs" / "apebench_burgers.yaml"
NETWORK = "Conv;34;10;relu"
"""APEBench's default emulator (`BaseScenario.__call__`'s default network_config)."""
STEPS = (1, 10, 50, 100, 200)
"""The steps the issue asks dynaforge to be lower at."""
VAL_SEED, VAL_TRAJECTORIES = 1, 10


def scenario(quick: bool, **changes: Any) -> Any:
    """APEBench's diff_burgers with its defaults (the smoke run's tiny sizes with `quick`)."""
    import apebench

    sizes = {}
    if quick:
        sizes = {
            "num_train_samples": 4,
            "num_test_samples": 4,
            "optim_config": "adam;200;warmup_cosine;0.0;1e-3;40",
        }
    return apebench.scenarios.scenario_dict["diff_burgers"](**(sizes | changes))


def apebench_run(quick: bool, seed: int) -> dict[str, Any]:
    """Train APEBench's default emulator as `scenario(start_seed=seed)` does (one seed), timing the training."""
    import jax

    ape = scenario(quick)
    trainer = ape.get_trainer(train_config="one")  # generates the training trajectories
    init_key, shuffle_key = jax.random.split(jax.random.PRNGKey(seed), 2)
    stepper = ape.get_neural_stepper(task_config="predict", network_config=NETWORK, key=init_key)
    began = time.perf_counter()
    trained, losses, _ = trainer(stepper, shuffle_key, record_loss_every=ape.record_loss_every)
    jax.block_until_ready(jax.tree_util.tree_leaves(trained))
    seconds = time.perf_counter() - began
    nrmse = np.asarray(ape.perform_tests(trained, remove_singleton_axis=True)["mean_nRMSE"][0])
    return {
        "seed": seed,
        "seconds": seconds,
        "training_steps": ape.num_training_steps,
        "parameters": int(sum(x.size for x in jax.tree_util.tree_leaves(trained) if hasattr(x, "size"))),
        "nrmse": nrmse.tolist(),
        "final_loss": float(np.asarray(losses)[-1]),
    }


def dataset_folder(quick: bool, cache: Path) -> Path:
    """APEBench's training trajectories (and 10 more for validation) as a dynaforge dataset folder."""
    folder = cache / ("folder-quick" if quick else "folder")
    if (folder / "manifest.json").exists():
        return folder
    train = np.asarray(scenario(quick).get_train_data())[:, :, 0]  # (n, 51, 160)
    val = np.asarray(
        scenario(quick, train_seed=VAL_SEED, num_train_samples=VAL_TRAJECTORIES).get_train_data()
    )[:, :, 0]
    # a PDEBench tensor file tests on its first samples, then validates, then trains: the test split is a
    # copy of the validation trajectories (this benchmark tests on APEBench's own test set instead)
    fields = np.concatenate([val, val, train]).astype(np.float32)
    file = cache / ("apebench-quick.hdf5" if quick else "apebench.hdf5")
    points, frames = fields.shape[2], fields.shape[1]
    write_tensor_file(file, fields, np.arange(points) / points, np.arange(frames + 1, dtype=float))
    convert(file, folder, fractions=(len(train), len(val), len(val)), progress=False)
    return folder


def dynaforge_run(
    quick: bool, seed: int, seconds: float, folder: Path, out: Path, overrides: list[str]
) -> dict[str, Any]:
    """Train configs/apebench_burgers.yaml for `seconds`, roll out APEBench's test set, score it with
    APEBench's metric."""
    import jax.numpy as jnp

    config = load_config(CONFIG, [f"train.time_budget={seconds}", f"train.seed={seed}", *overrides])
    engine = window_engine(config, folder, out, progress=False, overwrite=True)
    summary = engine.fit()
    model, normalizer = engine.model.eval(), engine.task.normalizer
    ape = scenario(quick)
    test = np.asarray(ape.get_test_data())  # (n, 201, 1, 160)
    frames = torch.from_numpy(test[:, :1].astype(np.float32))  # (n, history 1, channels 1, 160)
    predicted = []
    with torch.inference_mode():
        for _ in range(test.shape[1] - 1):
            normalized = normalizer.physical_to_normalized(frames, spatial_dims=1)
            step = normalizer.normalized_to_physical(model(ModelInput(frames=normalized)).frames, 1)
            frames = torch.cat([frames[:, 1:], step[:, :1]], dim=1)
            predicted.append(step[:, :1])
    rollout = torch.cat(predicted, dim=1).numpy()  # (n, 200, 1, 160)
    nrmse = np.asarray(ape.perform_tests_on_rollout(jnp.asarray(rollout))["mean_nRMSE"]).reshape(-1)
    return {
        "seed": seed,
        "seconds": summary.seconds,
        "budget": seconds,
        "parameters": sum(p.numel() for p in model.parameters()),
        "overrides": overrides,
        "nrmse": nrmse.tolist(),
    }


def records(runs: dict[str, list[dict[str, Any]]], machine: str) -> list[dict[str, Any]]:
    """Per step of STEPS and the mean over all steps: both libraries' nRMSE, mean of the seeds."""
    ape, ours = runs["apebench"], runs["dynaforge"]
    seeds = [r["seed"] for r in ours]
    seconds = statistics.mean(r["seconds"] for r in ape)

    def value(row: dict[str, Any], step: int | None) -> float:
        """One run's nRMSE at `step` (None: the mean over all steps)."""
        return float(np.mean(row["nrmse"])) if step is None else row["nrmse"][step - 1]

    def at(rows: list[dict[str, Any]], step: int | None) -> float:
        return statistics.mean(value(r, step) for r in rows)

    out = []
    for step in [*STEPS, None]:
        if step is not None and step > len(ape[0]["nrmse"]):
            continue
        dyn, base = at(ours, step), at(ape, step)
        label = f"step {step}" if step is not None else f"mean over the {len(ape[0]['nrmse'])} steps"
        out.append(
            {
                "case": f"APEBench diff_burgers (1D, 160 points), test rollout nRMSE at {label}",
                "baseline": f"APEBench 0.1.1 default emulator {NETWORK}, `one` training, its default optimiser",
                "metric": f"mean nRMSE (APEBench's mean_nRMSE), mean of seeds {seeds}",
                "dynaforge": dyn,
                "baseline_value": base,
                "ratio": base / dyn,
                "notes": (
                    f"ratio > 1: dynaforge lower; equal wall time per seed (APEBench's training call, mean "
                    f"{seconds:.0f} s; dynaforge configs/apebench_burgers.yaml with that train.time_budget, "
                    f"trained {[round(r['seconds']) for r in ours]} s against {[round(r['seconds']) for r in ape]} s); "
                    f"per seed dynaforge {[round(value(r, step), 5) for r in ours]}, "
                    f"APEBench {[round(value(r, step), 5) for r in ape]}; "
                    f"parameters dynaforge {ours[0]['parameters']}, APEBench {ape[0]['parameters']}; one thread; "
                    f"torch {torch.__version__}; {machine}"
                ),
            }
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, not a figure")
    parser.add_argument("--seeds", default="0,1,2")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dynaforge-apebench")
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="NAME=override,override: another dynaforge run per seed with these config overrides (diagnosis; "
        "kept in the detail file, not in the records)",
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = [0] if args.quick else [int(s) for s in args.seeds.split(",")]
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    cache = args.cache / ("quick" if args.quick else "full")
    cache.mkdir(parents=True, exist_ok=True)
    folder = dataset_folder(args.quick, cache)
    variants = {"dynaforge": []} | {
        v.split("=", 1)[0]: [o for o in v.split("=", 1)[1].split(",") if o] for v in args.variant
    }
    runs: dict[str, list[dict[str, Any]]] = {"apebench": []} | {name: [] for name in variants}
    for seed in seeds:
        saved = cache / f"apebench-seed{seed}.json"
        if saved.exists():
            ape = json.loads(saved.read_text())
        else:
            ape = apebench_run(args.quick, seed)
            atomic_write_json(saved, ape)
        runs["apebench"].append(ape)
        print(
            f"APEBench seed {seed}: {ape['seconds']:.0f} s, mean nRMSE {np.mean(ape['nrmse']):.4f}",
            flush=True,
        )
        for name, overrides in variants.items():
            with tempfile.TemporaryDirectory() as run_dir:
                ours = dynaforge_run(args.quick, seed, ape["seconds"], folder, Path(run_dir), overrides)
            runs[name].append(ours)
            picks = {s: round(ours["nrmse"][s - 1], 5) for s in STEPS if s <= len(ours["nrmse"])}
            print(f"{name} seed {seed}: {ours['seconds']:.0f} s, nRMSE at {picks}", flush=True)
    machine = load_note()
    atomic_write_json(out, records(runs, machine))
    atomic_write_json(out.with_suffix(".detail.json"), {"machine": machine, "runs": runs})
    for row in records(runs, machine):
        print(
            f"{row['case']}: dynaforge {row['dynaforge']:.5f}, APEBench {row['baseline_value']:.5f}, ratio {row['ratio']:.2f}"
        )


if __name__ == "__main__":
    main()
