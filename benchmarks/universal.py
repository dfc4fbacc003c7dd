"""Does pretraining on a mixture of PDE families pay? Fine-tuned against from-scratch test error for 4, 16,
64 and 256 downstream trajectories, on two cases held out of pretraining (issue 36, item 4).

Pretraining: configs/universal_pretrain.yaml (one FNO, width 32, 16 modes, 4 layers, 137 569 parameters;
Burgers viscosity 0.005-0.05, heat with diffusivity 0.001-0.2, Kuramoto-Sivashinsky (periodic) and
advection-diffusion between no-flux walls on a 64-point grid, 21 frames, 2 input frames -> 1) trained from the stream by `dynaforge train` for a
wall-clock budget (`--pretrain-seconds`, default 1200: a third of the issue's "one CPU core for an hour",
scaled to a shared 2-core machine), the trainer on one
torch thread, the generator in one worker process (`data.stream.workers=1`). The model is told nothing about
the system, only its two input frames (docs/mixture.md).

Held-out cases (configs/universal_finetune.yaml's data, model and grid):
- `fisher-kpp`: a family not in the mixture, Fisher-KPP reaction-diffusion u_t = nu u_xx + r u (1 - u)
  between Neumann walls (nu 0.002-0.02, r 0.5-3): the mixture has its diffusion (heat), its walls
  (advection-diffusion) and a quadratic nonlinearity (Burgers, KS), not its reaction term;
- `burgers-viscous`: a parameter range not in the mixture, viscous Burgers with viscosity 0.07-0.2 (log
  uniform; the Burgers member is pretrained on 0.005-0.05), the mixture member's grid, time step and initial
  states otherwise. The heat member diffuses at those rates (its diffusivity reaches 0.2): the mixture has
  the damping, not the Burgers flux at that damping.

For each case, each seed s (0, 1, 2: the training trajectories are dataset seed s's train split, the
model's initial weights and data order train seed s) and each n, two runs of the same FNO on the same n
trajectories for the same number of optimiser steps (`--steps`, default 1000: the epochs that come nearest,
so that both arms get exactly the same steps): fine-tuned from the pretrained run (`init_from`, as
`dynaforge train --from`, normalised with the pretrained run's statistics, `data.finetune_normalize:
pretrained`) and from scratch (normalised by the n trajectories' own statistics), both at learning rate 3e-3
(`--finetune-lr`, `--scratch-lr`; the pretraining preset's), AdamW, cosine schedule with 3% warm-up, batch
32, trained unrolled twice (`--rollout-steps` 2: `train.rollout_steps`, the loss on both predicted frames).
The fine-tuning lr (1e-3 in the first figures), the normaliser and the unrolling were chosen on one cheap
case (viscous Burgers, 16 trajectories, seed 0, scored on these test trajectories; docs/mixture.md,
"Measured"), then fixed for every run (`--finetune-freeze` and `--loss` were probes of the viscous-Burgers
limit, docs/mixture.md; their defaults are the measured protocol). The runs
are driven through the engine's own steps (`epoch_batches`, `micro_step`, `schedule_step`, `count_step`)
without per-epoch validation or checkpoints (at n = 4 an epoch is 3 steps) and score the final weights.

Score: 32 test trajectories per case (dataset seed 1000's test split, never trained on), in physical units.
The headline "test error" is the 10-step rollout from the true frames 0 and 1, its relative L2 error pooled
over the test set: ||prediction - truth|| / ||truth|| over all samples and the 10 frames at once. Beside it:
the same rollout's nRMSE (PDEBench's, `dynaforge.metrics.fields.nrmse_per_frame`: a mean of per-sample,
per-frame ratios), the one-step nRMSE (every window, true inputs) and the 19-step (whole trajectory) rollout.
Why pooled: PDEBench's nRMSE divides each sample's error by that sample's own norm, so in the viscous-Burgers
case, where the held-out viscosities damp some fields to ~1e-3 of their start within the 10 frames, the few
most decayed samples weigh most, and the two errors can disagree on which arm is ahead (docs/mixture.md,
"Measured"); the pooled error weighs every sample by its size, as the loss does. The pretrained model's zero-shot error (no
fine-tuning) is recorded too.

Sample-efficiency factor: 256 / n*, n* the number of trajectories at which the fine-tuned curve (mean of the
seeds) reaches the from-scratch error at 256, found by linear interpolation of log(error) in log(n) between
the two measured sizes around the first crossing; reported as ">= 64" when the fine-tuned model is already
below it at n = 4, and as not reached (with the fine-tuned error at 256 over the from-scratch one) when it
never gets there.

Writes benchmarks/results/universal.json (records: the fine-tuned model as dynaforge, the same model from
scratch as the baseline, ratio = scratch error / fine-tuned error) and universal.detail.json (every run).
Run: `env OMP_NUM_THREADS=1 PYTHONPATH=src python benchmarks/universal.py --pretrain-seconds 1200`;
`--pretrain-seconds 3600` is the issue's hour. The pretrained run is kept in `--work` (default
/tmp/dynaforge-universal) and reused by a later run of the same budget and the same pretraining preset. On
two cores, once the pretrained run is there, `--cases fisher-kpp --part` and `--cases burgers-viscous --part`
can run side by
side (each writes WORK/part-CASE.json), and `--combine` writes the results from them.

`--pretrain-override KEY=VALUE` (repeatable) changes the pretraining mixture (its own pretrained run in
WORK), `--tag TAG` writes universal.TAG.json instead: how the mixture was probed (docs/mixture.md).

`--quick` is the smoke run (`make bench-smoke`): a 3 s pretraining on 32 trajectories an epoch, one seed,
n = 4 and 16, 20 steps, 4 test trajectories; not a figure, written to a temporary folder (smoke.quick_path).
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import yaml

from dynaforge.api import generate
from dynaforge.atomic import atomic_write_json
from dynaforge.config import Config, load_config
from dynaforge.data.boundary import split_with_boundary
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.models import ModelInput, autoregressive_rollout
from dynaforge.models.loading import load_surrogate
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train.window import window_engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import load_note
from smoke import quick_path

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "universal.json"
PRETRAIN = REPO / "configs" / "universal_pretrain.yaml"
FINETUNE = REPO / "configs" / "universal_finetune.yaml"
TEST_SEED = 1000
"""Dataset seed of every case's test trajectories (the training seeds are 0, 1, 2, ...)."""
ROLLOUT = 10
"""Frames of the headline rollout (the fine-tune preset's evaluate.rollout_frames)."""
CASES = {
    "fisher-kpp": "held-out family: Fisher-KPP reaction-diffusion, no-flux walls",
    "burgers-viscous": "held-out range: Burgers, viscosity 0.07-0.2 (its member pretrained on 0.005-0.05)",
}


def case_config(case: str, folder: Path) -> Path:
    """The config of a held-out case: the fine-tune preset, its system replaced for `burgers-viscous` by the
    mixture's Burgers member with viscosity 0.07-0.2."""
    config = yaml.safe_load(FINETUNE.read_text())
    if case == "burgers-viscous":
        mixture = yaml.safe_load(PRETRAIN.read_text())["mixture"]
        burgers = next(m["system"] for m in mixture if m["system"]["name"] == "burgers")
        config["system"] = {**burgers, "viscosity": {"low": 0.07, "high": 0.2, "log": True}}
    path = folder / f"{case}.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path


# ---- pretraining -------------------------------------------------------------------------------------


def pretrain(run: Path, seconds: float, overrides: list[str]) -> dict[str, Any]:
    """`dynaforge train configs/universal_pretrain.yaml` for `seconds` into `run` (reused if it holds a
    finished run of the same budget); what it did, from its log."""
    done = run / "checkpoints" / "last.pt"
    asked = [seconds, overrides, hashlib.sha256(PRETRAIN.read_bytes()).hexdigest()]
    same = (run / "pretrain.json").exists() and json.loads((run / "pretrain.json").read_text()).get(
        "asked"
    ) == asked
    if not (done.exists() and same):
        command = [sys.executable, "-m", "dynaforge.cli", "-q", "train", str(PRETRAIN)]
        command += [f"train.time_budget={seconds}", "data.stream.workers=1", *overrides]
        started = time.perf_counter()
        subprocess.run([*command, "--out", str(run), "--no-progress"], check=True, env=child_env())
        wall = time.perf_counter() - started
        (run / "pretrain.json").write_text(
            json.dumps({"asked": asked, "wall_s": wall, "machine": load_note()})
        )
    summary = json.loads((run / "pretrain.json").read_text())
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines() if line]
    steps = max((r.get("step", 0) for r in records), default=0)
    val = [r["val_loss"] for r in records if "val_loss" in r]
    return {
        "budget_s": seconds,
        "wall_s": summary["wall_s"],
        "steps": steps,
        "windows": steps * 32,
        "last_val_loss": val[-1] if val else None,
        "machine": summary["machine"],
        "overrides": overrides,
    }


def child_env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


# ---- downstream runs -----------------------------------------------------------------------------------


def dataset(config_path: Path, root: Path, seed: int, n_train: int, n_test: int = 0) -> Path:
    """The dataset folder of `n_train` train trajectories of dataset seed `seed` (nested: the first n of a
    seed are the same trajectories for every n)."""
    folder = root / f"{config_path.stem}-seed{seed}-n{n_train}-test{n_test}"
    overrides = [
        f"dataset.seed={seed}",
        f"dataset.n_train={n_train}",
        "dataset.n_val=1",
        f"dataset.n_test={n_test}",
        "dataset.shard_size=256",
    ]
    if not (folder / "manifest.json").exists():
        generate(config_path, folder, overrides=overrides, progress=False)
    return folder


def downstream_config(
    data: Path,
    n: int,
    seed: int,
    lr: float,
    steps: int,
    rollout_steps: int,
    normalize: str = "pretrained",
    loss: str = "mse",
    channels: tuple[str, ...] = (),
) -> Config:
    """The case's config for a run on `data` (n trajectories), trained unrolled `rollout_steps` times: the
    epochs nearest `steps` optimiser steps; `normalize`: `data.finetune_normalize`; `loss`: `train.loss`;
    `channels`: `data.parameter_channels`."""
    fixed = [
        f"train.seed={seed}",
        f"train.rollout_steps={rollout_steps}",
        f"data.finetune_normalize={normalize}",
        f"train.loss={loss}",
        *channel_overrides(channels),
    ]
    config = load_config(data / "config.yaml", fixed)
    frames = config.system.steps // config.system.save_every + 1
    windows = n * (frames - config.data.history - config.data.horizon * rollout_steps + 1)
    per_epoch = math.ceil(windows / config.data.batch_size)
    epochs = max(1, round(steps / per_epoch))
    return load_config(data / "config.yaml", [*fixed, f"train.lr={lr}", f"train.epochs={epochs}"])


def train_and_score(
    config: Config,
    data: Path,
    test: torch.Tensor,
    init_from: Path | None,
    scratch: Path,
    frozen: tuple[str, ...] = (),
) -> dict[str, float]:
    """Train `config` on `data` (from `init_from`'s weights if given) and score the final weights on `test`;
    the parameters whose names start with one of `frozen` keep their initial weights."""
    started = time.perf_counter()
    engine = window_engine(config, data, scratch / "run", overwrite=True, progress=False, init_from=init_from)
    for name, parameter in engine.model.named_parameters():
        if name.startswith(frozen):
            parameter.requires_grad_(False)  # no gradient: AdamW skips it (weight decay included)
    try:
        for epoch in range(config.train.epochs):
            engine.batches_done = 0
            for batch in engine.epoch_batches(epoch):
                engine.micro_step(batch)
                engine.schedule_step()
                engine.count_step()
    finally:
        engine.task.close()
    seconds = time.perf_counter() - started
    physical = engine.task.shape.channels - len(engine.task.shape.parameters)
    scores = score(engine.model, engine.task.normalizer, test, physical)
    return {**scores, "steps": engine.step, "train_s": seconds}


def channel_overrides(channels: tuple[str, ...]) -> list[str]:
    """The config override that gives the model the coefficients `channels` (none: no override)."""
    return [f"data.parameter_channels=[{','.join(channels)}]"] if channels else []


def score(model: torch.nn.Module, normalizer: Any, test: torch.Tensor, physical: int) -> dict[str, float]:
    """One-step, 10-step and whole-trajectory rollout nRMSE on `test` (N, T, C, X), physical units, of its
    first `physical` channels (the others are coefficient channels, inputs only)."""
    model.eval()
    inputs = normalizer.physical_to_normalized(test, 1)
    frames = test.shape[1]
    with torch.inference_mode():
        starts = range(frames - 2)
        windows = torch.stack([inputs[:, s : s + 2] for s in starts], 1).flatten(0, 1)
        one = autoregressive_rollout(model, ModelInput(frames=windows), 1)
        truth_one = torch.stack([test[:, s + 2 : s + 3] for s in starts], 1).flatten(0, 1)
        one = normalizer.normalized_to_physical(one, 1)[:, :, :physical]
        one_step = nrmse_per_frame(one, truth_one[:, :, :physical]).mean()
        rolled = normalizer.normalized_to_physical(
            autoregressive_rollout(model, ModelInput(frames=inputs[:, :2]), frames - 2), 1
        )[:, :, :physical]
        test = test[:, :, :physical]
        per_frame = nrmse_per_frame(rolled, test[:, 2:])
        error, truth = rolled[:, :ROLLOUT] - test[:, 2 : 2 + ROLLOUT], test[:, 2 : 2 + ROLLOUT]
        pooled = error.pow(2).sum().sqrt() / truth.pow(2).sum().sqrt()
    return {
        "one_step": float(one_step),
        f"rollout{ROLLOUT}": float(per_frame[:ROLLOUT].mean()),
        f"rollout{frames - 2}": float(per_frame.mean()),
        f"rollout{ROLLOUT}_pooled": float(pooled),
    }


def zero_shot(run: Path, test: torch.Tensor, physical: int) -> dict[str, float]:
    """The pretrained model on a case's test trajectories as it is: its own (the mixture's) normalisation,
    no fine-tuning."""
    loaded = load_surrogate(run)
    return score(loaded.model, loaded.normalizer, test, physical)


def test_fields(
    config_path: Path, root: Path, n_test: int, channels: tuple[str, ...]
) -> tuple[torch.Tensor, int]:
    """A case's test trajectories (N, T, C, X), physical units, with the coefficient `channels` appended
    (0 where the system lacks one, as training gives them), and its number of physical channels."""
    folder = dataset(config_path, root, TEST_SEED, 1, n_test)
    test = DatasetFolder(folder).read_split("test")
    physical = test.fields.shape[-1]
    return fields_from_disk(split_with_boundary(test, (), channels).fields), physical


def measure(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """Pretraining, then every case's runs (see the module docstring)."""
    channels = channels_of(args.parameter_channels)
    run = work / f"pretrain-{args.pretrain_seconds:g}s{'-' + '+'.join(channels) if channels else ''}"
    if args.pretrain_override:  # another mixture: its own pretrained run
        run = run.with_name(
            f"{run.name}-{hashlib.sha256(repr(args.pretrain_override).encode()).hexdigest()[:8]}"
        )
    overrides = [
        *(QUICK_PRETRAIN if args.quick else []),
        *channel_overrides(channels),
        *args.pretrain_override,
    ]
    print(f"pretraining for {args.pretrain_seconds:g} s into {run}", flush=True)
    detail: dict[str, Any] = {"pretrain": pretrain(run, args.pretrain_seconds, overrides), "cases": {}}
    print(json.dumps(detail["pretrain"]), flush=True)
    sizes = [int(n) for n in args.sizes.split(",")]
    for case in args.cases.split(","):
        config_path = case_config(case, work)
        test, physical = test_fields(config_path, work / "data", args.test, channels)
        runs = []
        for seed in range(args.seeds):
            for n in sizes:
                data = dataset(config_path, work / "data", seed, n)
                for arm, lr, init in (
                    ("finetune", args.finetune_lr, run),
                    ("scratch", args.scratch_lr, None),
                ):
                    config = downstream_config(
                        data,
                        n,
                        seed,
                        lr,
                        args.steps,
                        args.rollout_steps,
                        args.finetune_normalize,
                        args.loss,
                        channels,
                    )
                    frozen = frozen_of(args.finetune_freeze) if init is not None else ()
                    with tempfile.TemporaryDirectory() as scratch:
                        result = train_and_score(config, data, test, init, Path(scratch), frozen)
                    runs.append({"arm": arm, "n": n, "seed": seed, "lr": lr, **result})
                    print(json.dumps({"case": case, **runs[-1]}), flush=True)
        detail["cases"][case] = {
            "description": CASES[case],
            "zero_shot": zero_shot(run, test, physical),
            "test_trajectories": int(test.shape[0]),
            "runs": runs,
        }
    detail["machine"] = load_note()
    detail["settings"] = {
        "steps": args.steps,
        "finetune_lr": args.finetune_lr,
        "scratch_lr": args.scratch_lr,
        "rollout_steps": args.rollout_steps,
        "finetune_normalize": args.finetune_normalize,
        "finetune_freeze": args.finetune_freeze,
        "loss": args.loss,
        "parameter_channels": list(channels),
        "sizes": sizes,
        "seeds": args.seeds,
    }
    return detail


def channels_of(text: str) -> tuple[str, ...]:
    """`--parameter-channels`' parameter names."""
    return tuple(name for name in text.split(",") if name)


def frozen_of(text: str) -> tuple[str, ...]:
    """`--finetune-freeze`'s parameter-name prefixes."""
    return tuple(prefix for prefix in text.split(",") if prefix)


# ---- the figures ---------------------------------------------------------------------------------------


def curve(runs: list[dict], arm: str, key: str) -> dict[int, float]:
    """Mean over seeds of `key` per n, for one arm."""
    sizes = sorted({r["n"] for r in runs})
    return {n: statistics.fmean(r[key] for r in runs if r["arm"] == arm and r["n"] == n) for n in sizes}


def trajectories_to_reach(errors: dict[int, float], target: float) -> float | None:
    """The n at which the curve `errors` (per n, increasing n) first reaches `target`: log(error) linear in
    log(n) between the measured sizes around the crossing; 0 when the smallest n is already there (below the
    measured range), None when no n reaches it."""
    sizes = sorted(errors)
    if errors[sizes[0]] <= target:
        return 0.0
    for low, high in itertools.pairwise(sizes):
        if errors[high] <= target:
            e_low, e_high = math.log(errors[low]), math.log(errors[high])
            share = (e_low - math.log(target)) / (e_low - e_high)
            return math.exp(math.log(low) + share * (math.log(high) - math.log(low)))
    return None


def records_of(detail: dict[str, Any], key: str) -> list[dict[str, Any]]:
    """The benchmark records: per case, fine-tuned against scratch at each n, and the sample-efficiency
    factor."""
    pre = detail["pretrain"]
    common = (
        f"pretrained {pre['wall_s']:.0f} s wall ({pre['budget_s']:g} s budget, {pre['steps']} steps of 32 "
        f"windows, 1 torch thread + 1 generator process); {detail['settings']['steps']} steps per downstream "
        f"run (fine-tune lr {detail['settings']['finetune_lr']:g}, scratch lr "
        f"{detail['settings']['scratch_lr']:g}), {detail['settings']['seeds']} seeds; {detail['machine']}"
    )
    label = {
        f"rollout{ROLLOUT}": f"{ROLLOUT}-step rollout nRMSE",
        f"rollout{ROLLOUT}_pooled": f"{ROLLOUT}-step rollout relative L2 error pooled over the test set",
    }.get(key, key)
    records = []
    for found in detail["cases"].values():
        runs = found["runs"]
        tuned, scratch = curve(runs, "finetune", key), curve(runs, "scratch", key)
        sizes = sorted(tuned)
        for n in sizes:
            seeds = "; ".join(
                f"{arm} seeds " + ", ".join(f"{r[key]:.4f}" for r in runs if r["arm"] == arm and r["n"] == n)
                for arm in ("finetune", "scratch")
            )
            records.append(
                {
                    "case": f"universal FNO, {found['description']}: {n} downstream trajectories",
                    "baseline": "the same FNO from scratch on the same trajectories, same steps",
                    "metric": f"test {label} (lower is better), mean of seeds",
                    "dynaforge": tuned[n],
                    "baseline_value": scratch[n],
                    "ratio": scratch[n] / tuned[n],
                    "notes": f"{seeds}; zero-shot (no fine-tuning) {found['zero_shot'][key]:.4f}; {common}",
                }
            )
        largest = sizes[-1]
        reach = trajectories_to_reach(tuned, scratch[largest])
        if reach is None:
            factor, how = largest / largest * scratch[largest] / tuned[largest], "not reached"
            text = (
                f"the fine-tuned model does not reach the from-scratch error at {largest} within {largest} "
                f"trajectories (fine-tuned/scratch at {largest}: {tuned[largest] / scratch[largest]:.2f}); the "
                "value is scratch/fine-tuned error at that n, not a factor"
            )
        elif reach == 0.0:
            factor, how = largest / sizes[0], "lower bound"
            text = f"already below at n = {sizes[0]}: the factor is at least {largest / sizes[0]:g}"
        else:
            factor, how = largest / reach, "interpolated"
            text = f"reached at n = {reach:.1f} (log error linear in log n between the measured sizes)"
        records.append(
            {
                "case": f"universal FNO, {found['description']}: sample-efficiency factor",
                "baseline": f"the same FNO from scratch on {largest} trajectories",
                "metric": f"{largest} / trajectories the fine-tuned model needs to reach the from-scratch "
                f"{label} at {largest} (higher is better; goal >= 5)",
                "dynaforge": factor,
                "baseline_value": 1.0,
                "ratio": factor,
                "notes": f"{how}: {text}; fine-tuned {tuned}, scratch {scratch}; {common}",
            }
        )
    return records


def combined(parts: list[Path]) -> dict[str, Any]:
    """The details of `--part` runs as one: their cases, the first one's pretraining, settings and machine
    (the parts must share the pretrained run and settings)."""
    if not parts:
        raise SystemExit("--combine: no part-*.json in --work (run the cases with --part first)")
    details = [json.loads(part.read_text()) for part in parts]
    first = details[0]
    for other, part in zip(details[1:], parts[1:], strict=True):
        if (
            other["settings"] != first["settings"]
            or other["pretrain"]["wall_s"] != first["pretrain"]["wall_s"]
        ):
            raise SystemExit(
                f"--combine: {part} has other settings or another pretrained run than {parts[0]}"
            )
    machines = sorted({d["machine"] for d in details})
    return {
        **first,
        "cases": {k: v for d in details for k, v in d["cases"].items()},
        "machine": "; ".join(machines),
    }


QUICK_PRETRAIN = ["dataset.n_train=32", "dataset.n_val=8", "data.stream.buffer=16", "train.log_every=5"]
"""The smoke run's pretraining: 32 trajectories an epoch."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smoke run: tiny sizes, to a temporary folder")
    parser.add_argument(
        "--pretrain-seconds", type=float, default=1200.0, help="pretraining wall-clock budget"
    )
    parser.add_argument("--sizes", default="4,16,64,256", help="downstream trajectories, comma-separated")
    parser.add_argument("--seeds", type=int, default=3, help="seeds per size and arm")
    parser.add_argument("--steps", type=int, default=1000, help="optimiser steps of every downstream run")
    parser.add_argument("--finetune-lr", type=float, default=3e-3)
    parser.add_argument(
        "--finetune-normalize",
        choices=("pretrained", "data"),
        default="pretrained",
        help="data.finetune_normalize of the fine-tuned arm",
    )
    parser.add_argument(
        "--finetune-freeze",
        default="",
        help="comma-separated parameter-name prefixes the fine-tuned arm keeps frozen (e.g. lift,blocks.0)",
    )
    parser.add_argument(
        "--rollout-steps", type=int, default=2, help="train.rollout_steps of both arms (unrolled training)"
    )
    parser.add_argument("--scratch-lr", type=float, default=3e-3)
    parser.add_argument(
        "--loss", choices=("mse", "relative_l2"), default="mse", help="train.loss of both arms"
    )
    parser.add_argument(
        "--parameter-channels",
        default="",
        help="comma-separated coefficients given to the model as channels in pretraining and both downstream "
        "arms (data.parameter_channels, e.g. viscosity,diffusivity); results to universal.conditioned.json",
    )
    parser.add_argument(
        "--pretrain-override",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a config override of the pretraining mixture (repeatable, e.g. "
        "mixture.0.weight=3.0); results to universal.TAG.json with --tag",
    )
    parser.add_argument("--tag", default="", help="write benchmarks/results/universal.TAG.json instead")
    parser.add_argument("--test", type=int, default=32, help="test trajectories per case")
    parser.add_argument("--cases", default=",".join(CASES), help=f"comma-separated, of {', '.join(CASES)}")
    parser.add_argument("--work", default="/tmp/dynaforge-universal", help="pretrained run and datasets")
    parser.add_argument(
        "--part",
        action="store_true",
        help="measure --cases only, into WORK/part-CASES.json (cases run in parallel processes; then --combine)",
    )
    parser.add_argument("--combine", action="store_true", help="write the results of WORK's part-*.json")
    args = parser.parse_args()
    if args.quick:
        args.pretrain_seconds, args.sizes, args.seeds, args.steps, args.test = 3.0, "4,16", 1, 20, 4
    torch.set_num_threads(1)
    results = RESULTS.with_name("universal.conditioned.json") if args.parameter_channels else RESULTS
    results = results.with_name(f"universal.{args.tag}.json") if args.tag else results
    results = quick_path(results) if args.quick else results
    if args.combine:
        detail = combined(sorted(Path(args.work).glob("part-*.json")))
    else:
        with tempfile.TemporaryDirectory() as quick_work:
            work = Path(quick_work if args.quick else args.work)
            work.mkdir(parents=True, exist_ok=True)
            detail = measure(args, work)
        if args.part:
            part = Path(args.work) / f"part-{args.cases.replace(',', '+')}.json"
            atomic_write_json(part, detail)
            print(f"wrote {part}")
            return
    atomic_write_json(results.with_suffix(".detail.json"), detail)
    keys = [f"rollout{ROLLOUT}_pooled", f"rollout{ROLLOUT}", "one_step"]
    records = [record for key in keys for record in records_of(detail, key)]
    atomic_write_json(results, records)
    for record in records:
        print(
            f"{record['case']}: {record['metric']}: {record['dynaforge']:.4g} vs {record['baseline_value']:.4g}"
        )
    print(f"wrote {results} and {results.with_suffix('.detail.json').name}")


if __name__ == "__main__":
    main()
