"""Long rollouts that stay right (issue 38, items 2-4): PDE-Refiner's KS task, scaled down for one CPU core.
Does a refinement stage in PDE-Refiner's form (Lippe et al., NeurIPS 2023; `dynaforge.train.refiner`)
raise the high-correlation time of the same operator trained with MSE alone, at equal training wall time;
does its one-call student keep the gain; how do the stack and the plain FNO and U-Net compare; does the
spread of an ensemble of refiner draws track the error?

Data (dynaforge's generator, configs/ks_long_rollouts.yaml): u_t + u u_x + u_xx + u_xxxx = 0, periodic,
L ~ U(57.6, 70.4) per trajectory, 256 points, ETDRK4 dt 0.05 saved every 4th step (frames 0.2 apart). The
dataset is generated once (dataset seed 0) and shared by every model and seed.

Trained on the same windows (one input frame, one frame out), each for the same wall-clock budget
(`train.time_budget` = BUDGET seconds, one thread; the engine turns it into whole epochs), per seed
(`train.seed` = 0, 1, 2: initialisation, data order, refinement noise):
- `mse_operator`: stage `refiner` with K = 0: the operator (OPERATOR: dynaforge's U-Net, 16 channels, 4
  levels, circular padding, the best plain model here and the paper's architecture family; until
  2026-11-28 the preset's FNO) trained with the one-step MSE alone, one call per step (the refiner's own
  network: its two extra input frames are always zero);
- `refiner`: stage `refiner` with K = 3 and sigma_min = 4e-7 (the public release's KS settings), K + 1 = 4
  calls per step; the same architecture, the same budget;
- `refiner_first`: not trained: the refiner's own k = 0 prediction alone (K = 0 at inference, one call per
  step), to tell what the K denoising calls add from what the shared training costs the first estimate;
- `student`: stage `refiner_distill`, one call per step, started from the refiner's weights and trained for
  another BUDGET seconds to reproduce its 4-call prediction (so the stack with the student has had 2x the
  training time of the MSE operator: said in every record that uses it);
- `fno`: configs/ks_long_rollouts.yaml's FNO (width 32, 32 modes, 4 layers) through the plain windows
  trainer (`dynaforge train`'s path: residual, MSE);
- `unet`: the operator's U-Net through the plain windows trainer (the same network as `mse_operator`
  through the other trainer: a check that the K = 0 stage trains as well as the plain path).

Scored on the test split, in normalised units (the Pearson correlation does not change under the per-channel
affine normalisation), from the true frame START_FRAME (t = 72, past the burn-in) for ROLLOUT frames:
- high-correlation time (`dynaforge.metrics.horizon`): per test trajectory the time until the Pearson
  correlation of prediction and truth first falls below 0.8; the mean over trajectories with its standard
  error; per model the mean over the 3 seeds with the standard error over seeds; a trajectory that never
  falls below within the rollout counts its length (censored; the notes count them);
- the refiner is scored on one draw of its refinement noise (ensemble member 0);
- one-step nRMSE (the first predicted frame); for the refiner also after each of its K + 1 calls (the
  k = 0 estimate, then each denoising step; one noise draw);
- cost per rollout step: network calls (counted with a hook) and milliseconds for the batch of test
  trajectories on one thread (fastest of 3 timed 10-step rollouts);
- an ensemble of MEMBERS refiner draws (different noise, same weights): spread-skill ratio (RMS of the
  members' standard deviation over RMS error of their mean) and the Pearson correlation of spread and error
  over (trajectory, frame) (`dynaforge.metrics.ensemble.spread_error_correlation`), over the whole rollout
  and its first 50 frames.
Item 2's figure: ratio = mean over seeds of the refiner's high-correlation time / the MSE operator's, target
>= 1.3; the student's share of the gain = (student - MSE operator) / (refiner - MSE operator), target >= 0.8.

Against the paper's protocol (configs/ks_long_rollouts.yaml gives the protocol and where it was checked):
- 32 training trajectories of 801 frames (t = 0 .. 160, every window used, burn-in included) against
  2048 x 140 frames: 25.6k training windows against 285k (0.09x); 4 validation and 16 test trajectories
  against 128 and 128;
- test rollouts of ROLLOUT = 400 frames (80 time units) from frame 360, against 640 frames: a model that
  stays correlated past 80 time units is censored there (the paper's MSE U-Net holds about 75);
- training: BUDGET = 80 s of one shared core per model (about 1k optimiser steps at batch 64) against
  400 epochs of batch 128 on a GPU (about 890k steps): the models here are far from converged;
- the operator is dynaforge's U-Net of 16 channels, not the paper's modern U-Net of 64 channels (with
  attention-free residual blocks and k embedded as a conditioning vector, not an input frame); no dt/dx conditioning
  (L varies by 10%), no EMA, dynaforge's cosine schedule (lr 1e-3), AdamW;
- the refiner predicts the noise (the paper's form) added to the change over one step divided by 0.3 (the
  release's `predict_difference`, `difference_weight`), at the release's noise levels (its DDPM schedule:
  sigma_min is the smallest variance, standard deviations 0.086, 0.0074, 6.3e-4), not through its
  v-prediction DDPM scheduler.

`python benchmarks/long_rollouts.py` runs everything (about 40 minutes of one loaded core, 13 per seed);
`--seed S` runs one seed into the work folder (two seeds can run side by side, one per core), `--aggregate`
writes the JSON from the seeds found there. `--quick` is the smoke run (tiny sizes, a few seconds per model; written to a
temporary folder).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from dynaforge.atomic import atomic_write_json
from dynaforge.config import Config, FNOConfig, UNetConfig, load_config
from dynaforge.data.normalize import Normalizer
from dynaforge.generate import generate
from dynaforge.metrics.ensemble import spread_error_correlation
from dynaforge.metrics.fields import nrmse_per_sample
from dynaforge.metrics.horizon import high_correlation_summary, mean_and_stderr, pearson_per_sample_frame
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.models.refiner import Refiner, refined_rollout
from dynaforge.runs import load_checkpoint
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train import window_engine
from dynaforge.train.refiner import run_refiner_stages
from machine import load_note
from smoke import quick_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "long_rollouts.json"
CONFIG = ROOT / "configs" / "ks_long_rollouts.yaml"
SEEDS = (0, 1, 2)
REFINEMENT_STEPS = 3
"""K of the public release's KS config."""
BALANCE = True
"""`stages.refiner.balance`: each k's loss weighted by the inverse of its batch mean (not the paper's plain
mean; a one-seed probe, docs/long_rollouts.md: the paper's mean left the k = 0 estimate 2.6x worse than
the MSE operator's at this budget)."""
OPERATOR = UNetConfig(channels=16, levels=4)
"""The operator of `mse_operator`, `refiner` and `student` (and the plain `unet`)."""
PAPER = {"mse_unet": 75.0, "pde_refiner": 98.0}
"""The paper's high-correlation times on KS (time units), as the issue gives them (about)."""


class Sizes(NamedTuple):
    n_train: int
    n_val: int
    n_test: int
    solver_steps: int
    budget: float
    """Training seconds per model."""
    start_frame: int
    rollout: int
    members: int
    val_windows: int


SIZES = {
    "full": Sizes(n_train=32, n_val=4, n_test=16, solver_steps=3200, budget=80.0, start_frame=360,
                  rollout=400, members=4, val_windows=32),
    "quick": Sizes(n_train=2, n_val=1, n_test=2, solver_steps=1500, budget=2.0, start_frame=360,
                   rollout=6, members=2, val_windows=4),
}  # fmt: skip


def base_config(size: Sizes, seed: int, steps: int = REFINEMENT_STEPS) -> Config:
    """The preset at `size` with OPERATOR as its model (`preset_config`'s FNO is the plain `fno`)."""
    return dataclasses.replace(preset_config(size, seed, steps), model=OPERATOR)


def preset_config(size: Sizes, seed: int, steps: int = REFINEMENT_STEPS) -> Config:
    return load_config(
        CONFIG,
        [
            f"dataset.n_train={size.n_train}",
            f"dataset.n_val={size.n_val}",
            f"dataset.n_test={size.n_test}",
            "dataset.shard_size=32",
            "dataset.batch_size=32",
            f"system.steps={size.solver_steps}",
            f"train.time_budget={size.budget}",
            f"train.seed={seed}",
            "train.device=cpu",
            "train.log_every=100",
            f"stages.refiner.steps={steps}",
            f"stages.refiner.balance={str(BALANCE).lower()}",
            "stages.refiner.val_rollout=10",
            f"stages.val_windows={size.val_windows}",
            f"stages.seed={seed}",
        ],
    )


def train_models(size: Sizes, seed: int, data: Path, work: Path) -> dict[str, tuple[nn.Module, float]]:
    """The six models of one seed with their training seconds (finished runs in `work` are reused)."""
    models: dict[str, tuple[nn.Module, float]] = {}
    refiner_status = run_refiner_stages(base_config(size, seed), data, work / "refiner", progress=False)
    for name, stage in (("refiner", "refiner"), ("student", "refiner_distill")):
        state = load_checkpoint(work / "refiner" / stage / "checkpoints" / "best.pt")
        models[name] = (model_from_checkpoint(state).eval(), refiner_status["stages"][stage]["seconds"])
    trained = models["refiner"][0]
    assert isinstance(trained, Refiner)
    first = Refiner(trained.network, trained.shape, 0, trained.min_noise_std, trained.change_scale)
    models["refiner_first"] = (first.eval(), models["refiner"][1])
    mse_status = run_refiner_stages(base_config(size, seed, 0), data, work / "mse", "refiner", progress=False)
    state = load_checkpoint(work / "mse" / "refiner" / "checkpoints" / "best.pt")
    models["mse_operator"] = (model_from_checkpoint(state).eval(), mse_status["stages"]["refiner"]["seconds"])
    for name, config in (("fno", preset_config(size, seed)), ("unet", base_config(size, seed))):
        assert name != "fno" or isinstance(config.model, FNOConfig)
        folder = work / name
        if (
            not (folder / "checkpoints" / "last.pt").exists()
            or not load_checkpoint(folder / "checkpoints" / "last.pt")["complete"]
        ):
            window_engine(config, data, folder, progress=False, resume=True).fit()
        state = load_checkpoint(folder / "checkpoints" / "best.pt")
        seconds = float(load_checkpoint(folder / "checkpoints" / "last.pt").get("elapsed", math.nan))
        models[name] = (model_from_checkpoint(state).eval(), seconds)
    return models


def test_frames(data: Path, size: Sizes) -> tuple[torch.Tensor, torch.Tensor]:
    """Normalised (N, 1, C, X) input frames at `start_frame` and the next `rollout` true frames."""
    folder = DatasetFolder(data)
    frames = fields_from_disk(folder.read_split("test").fields)
    frames = Normalizer.from_stats(folder.stats).physical_to_normalized(frames, 1)
    start = size.start_frame
    return frames[:, start : start + 1], frames[:, start + 1 : start + 1 + size.rollout]


def rollout(model: nn.Module, inputs: torch.Tensor, steps: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        return refined_rollout(model, inputs, steps, generator)


def calls_per_step(model: nn.Module, inputs: torch.Tensor) -> int:
    """Network calls of one rollout step, counted with a forward hook on the network."""
    network = model.network if isinstance(model, Refiner) else model
    count = [0]
    handle = network.register_forward_hook(lambda *_: count.__setitem__(0, count[0] + 1))
    try:
        rollout(model, inputs, 1, 0)
    finally:
        handle.remove()
    return count[0]


def ms_per_step(model: nn.Module, inputs: torch.Tensor, steps: int = 10, repeats: int = 3) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        rollout(model, inputs, steps, 0)
        times.append((time.perf_counter() - started) / steps * 1e3)
    return min(times)


def spread_skill(members: torch.Tensor, truth: torch.Tensor, frames: int | None = None) -> dict[str, float]:
    """Spread-skill ratio and spread-error correlation of ensemble `members` (M, N, T, C, X) over the
    first `frames` frames (all when None)."""
    m, t = members[:, :, :frames], truth[:, :frames]
    spread, mean = m.std(dim=0), m.mean(dim=0)
    ratio = float(spread.square().mean().sqrt() / (mean - t).square().mean().sqrt())
    return {
        "spread_skill_ratio": ratio,
        "spread_error_correlation": spread_error_correlation(spread, mean, t),
    }


def one_step_after_each_call(
    model: Refiner, inputs: torch.Tensor, truth: torch.Tensor, seed: int
) -> list[float]:
    """One-step nRMSE of the refiner's estimate after its k = 0 call and after each denoising call (one
    noise draw, `seed`)."""
    generator = torch.Generator().manual_seed(seed)
    errors = []
    with torch.inference_mode():
        estimate = model.first_estimate(inputs)
        for k in range(model.steps + 1):
            if k > 0:
                noise = torch.randn(estimate.shape, generator=generator, dtype=estimate.dtype)
                estimate = model.refine(inputs, estimate, k, noise)
            frame = inputs[:, -1:] + model.change_scale * estimate
            errors.append(float(nrmse_per_sample(frame, truth[:, :1]).mean()))
    return errors


def score_seed(size: Sizes, seed: int, data: Path, work: Path) -> dict[str, Any]:
    torch.set_num_threads(1)
    models = train_models(size, seed, data, work)
    inputs, truth = test_frames(data, size)
    frame_dt = 0.05 * 4
    result: dict[str, Any] = {"seed": seed, "models": {}, "load": load_note()}
    for name, (model, seconds) in models.items():
        if name == "refiner":  # the ensemble: MEMBERS draws in one batch; member 0 is the scored one
            batch = inputs.repeat(size.members, 1, 1, 1)
            members = rollout(model, batch, size.rollout, seed).unflatten(0, (size.members, inputs.shape[0]))
            predicted = members[0]
            result["ensemble"] = {
                "members": size.members,
                "all_frames": spread_skill(members, truth),
                "first_50_frames": spread_skill(members, truth, 50),
            }
            assert isinstance(model, Refiner)
            result["refiner_one_step_after_call"] = one_step_after_each_call(model, inputs, truth, seed)
        else:
            predicted = rollout(model, inputs, size.rollout, seed)
        correlation = pearson_per_sample_frame(predicted, truth)
        summary = high_correlation_summary(correlation, frame_dt=frame_dt)
        result["models"][name] = {
            "train_seconds": seconds,
            "high_correlation": summary,
            "one_step_nrmse": float(nrmse_per_sample(predicted[:, :1], truth[:, :1]).mean()),
            "calls_per_step": calls_per_step(model, inputs),
            "ms_per_step": ms_per_step(model, inputs),
        }
    return result


def seed_file(work: Path, seed: int) -> Path:
    return work / f"seed{seed}.json"


def run_seed(size: Sizes, seed: int, work: Path) -> None:
    data = work / "data"
    generate(preset_config(size, 0), data, progress=False)  # skipped when complete
    atomic_write_json(seed_file(work, seed), score_seed(size, seed, data, work / f"seed{seed}"))


def hct(result: dict[str, Any], name: str) -> float:
    return float(result["models"][name]["high_correlation"]["mean_time"])


def aggregate(results: list[dict[str, Any]], size: Sizes, command: str) -> list[dict[str, Any]]:
    names = ["mse_operator", "refiner", "refiner_first", "student", "fno", "unet"]
    per_seed = {name: [hct(r, name) for r in results] for name in names}
    mean = {name: mean_and_stderr(values) for name, values in per_seed.items()}
    censored = {
        name: sum(r["models"][name]["high_correlation"]["censored_samples"] for r in results)
        for name in names
    }

    def stat(name: str) -> str:
        m, se = mean[name]
        return f"{m:.2f} +- {se if se is not None else math.nan:.2f}"

    def cost(name: str, key: str) -> float:
        return min(r["models"][name][key] for r in results)

    common = (
        f"KS 1D, PDE-Refiner's task scaled down (benchmarks/long_rollouts.py docstring): {size.n_train} train / "
        f"{size.n_test} test trajectories, {size.budget:.0f} s of training per model on one thread, rollouts of "
        f"{size.rollout} frames (0.2 time units each) from frame {size.start_frame}; seeds {[r['seed'] for r in results]}; "
        f"high-correlation time (corr >= 0.8, time units) mean over test trajectories, then over seeds +- s.e. "
        f"over seeds; per seed: "
        + "; ".join(f"{n} {[round(v, 2) for v in per_seed[n]]}" for n in names)
        + f"; censored trajectories (all seeds): {censored}; paper (full protocol, GPU): MSE U-Net about "
        f"{PAPER['mse_unet']:.0f}, PDE-Refiner about {PAPER['pde_refiner']:.0f}; command: {command}; "
        f"{results[-1]['load']}; AMD EPYC, torch {torch.__version__}"
    )
    m_mse, m_ref, m_stu = mean["mse_operator"][0], mean["refiner"][0], mean["student"][0]
    gain = m_ref - m_mse
    share = (m_stu - m_mse) / gain if gain != 0 else math.nan
    records = [
        record(
            "high_correlation_time/refiner_vs_mse_operator",
            "mse_operator",
            m_ref,
            m_mse,
            f"item 2: target ratio >= 1.3; refiner {stat('refiner')}, MSE operator {stat('mse_operator')}. "
            + common,
        ),
        record(
            "high_correlation_time/student_vs_mse_operator",
            "mse_operator",
            m_stu,
            m_mse,
            f"student's share of the refiner's gain (student - MSE) / (refiner - MSE) = {share:.2f} (target >= 0.8; "
            f"meaningless when the gain is near 0 or negative); the student trained another {size.budget:.0f} s "
            f"after the refiner; student {stat('student')}. " + common,
            share=share,
        ),
    ]
    for stack in ("refiner", "student"):
        for plain in ("fno", "unet"):
            records.append(
                record(
                    f"high_correlation_time/{stack}_vs_{plain}",
                    plain,
                    mean[stack][0],
                    mean[plain][0],
                    f"item 3; {stack} {stat(stack)}, {plain} {stat(plain)}. " + common,
                )
            )
    records.append(
        record(
            "high_correlation_time/refiner_first_vs_mse_operator",
            "mse_operator",
            mean["refiner_first"][0],
            m_mse,
            "diagnostic: the refiner's k = 0 prediction alone (one call per step, no denoising) against the "
            f"MSE operator; refiner_first {stat('refiner_first')}. " + common,
        )
    )
    records.append(
        record(
            "high_correlation_time/unet_vs_mse_operator",
            "mse_operator",
            mean["unet"][0],
            m_mse,
            "check: the same U-Net through the plain windows trainer against the K = 0 refiner stage "
            f"(ratio near 1 when the two paths train alike); unet {stat('unet')}. " + common,
        )
    )
    after = [r["refiner_one_step_after_call"] for r in results]
    for call in range(len(after[0])):
        values = [a[call] for a in after]
        records.append({
            "case": f"refiner_one_step_nrmse/after_call_{call}", "baseline": None, "metric": "one_step_nrmse",
            "dynaforge": sum(values) / len(values), "baseline_value": None, "ratio": None,
            "notes": f"one-step nRMSE of the refiner's estimate after its call {call} (0: the k = 0 "
                     f"prediction; then each denoising step, one noise draw), mean over seeds, per seed "
                     f"{[round(v, 5) for v in values]}. " + common,
        })  # fmt: skip
    for name in ("refiner", "refiner_first", "student", "fno", "unet"):
        one = [r["models"][name]["one_step_nrmse"] for r in results]
        base = [r["models"]["mse_operator"]["one_step_nrmse"] for r in results]
        records.append(
            record(
                f"one_step_nrmse/{name}_vs_mse_operator",
                "mse_operator",
                sum(one) / len(one),
                sum(base) / len(base),
                "lower is better (ratio = baseline / dynaforge); " + common,
                lower_better=True,
            )
        )
    for name in ("refiner", "student", "fno", "unet"):
        records.append(
            record(
                f"ms_per_step/{name}_vs_mse_operator",
                "mse_operator",
                cost(name, "ms_per_step"),
                cost("mse_operator", "ms_per_step"),
                f"rollout cost per step for the batch of {size.n_test} test trajectories, one thread, "
                f"fastest over seeds; network calls per step: {name} "
                f"{results[0]['models'][name]['calls_per_step']}, mse_operator "
                f"{results[0]['models']['mse_operator']['calls_per_step']}; lower is better "
                f"(ratio = baseline / dynaforge). " + common,
                lower_better=True,
            )
        )
    for window in ("all_frames", "first_50_frames"):
        for key in ("spread_skill_ratio", "spread_error_correlation"):
            values = [r["ensemble"][window][key] for r in results]
            finite = [v for v in values if math.isfinite(v)]  # NaN: a member's rollout diverged
            m, se = mean_and_stderr(finite) if finite else (None, None)
            records.append({
                "case": f"refiner_ensemble/{key}/{window}", "baseline": None, "metric": key,
                "dynaforge": m, "baseline_value": None, "ratio": None,
                "notes": f"{results[0]['ensemble']['members']} refiner draws per test trajectory; per seed "
                         f"{[round(v, 3) for v in values]} (nan: a member diverged; mean over the finite ones), "
                         f"s.e. {se}; a calibrated ensemble has ratio 1 and a "
                         f"positive correlation. " + common,
            })  # fmt: skip
    return records


def record(
    case: str, baseline: str, ours: float, theirs: float, notes: str, lower_better: bool = False,
    share: float | None = None,
) -> dict[str, Any]:  # fmt: skip
    if lower_better:
        ratio = theirs / ours if ours > 0 else math.nan
    else:
        ratio = ours / theirs if theirs > 0 else math.nan
    out = {"case": case, "baseline": baseline, "metric": case.split("/")[0], "dynaforge": ours,
           "baseline_value": theirs, "ratio": ratio, "notes": notes}  # fmt: skip
    if share is not None:
        out["student_share_of_gain"] = share
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--quick", action="store_true", help="the smoke run: tiny sizes, temporary output")
    parser.add_argument("--seed", type=int, default=None, help="run one seed into the work folder and stop")
    parser.add_argument("--aggregate", action="store_true", help="write the JSON from the seeds in --work")
    parser.add_argument("--work", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    torch.set_num_threads(1)
    size = SIZES["quick" if args.quick else "full"]
    work = args.work or quick_path("long_rollouts-work" if args.quick else "long_rollouts-full-work")
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    seeds = SEEDS[:1] if args.quick else SEEDS
    if args.quick and args.work is None:  # a smoke run starts afresh (an older smoke's runs may not match)
        shutil.rmtree(work, ignore_errors=True)
    if args.seed is not None:
        run_seed(size, args.seed, work)
        return
    if not args.aggregate:
        for seed in seeds:
            run_seed(size, seed, work)
    results = [json.loads(seed_file(work, s).read_text()) for s in seeds if seed_file(work, s).exists()]
    command = "python benchmarks/long_rollouts.py" + (" --quick" if args.quick else "")
    if args.aggregate:
        found = ", ".join(str(r["seed"]) for r in results)
        command = (
            f"python benchmarks/long_rollouts.py --seed S --work W for S = {found} (one thread each, under "
            "the machine's two-slot semaphore), then --aggregate --work W"
        )
    atomic_write_json(out, aggregate(results, size, command))
    print(f"wrote {out}")
    for row in json.loads(out.read_text()):
        ratio = row["ratio"]
        print(f"{row['case']}: {row['dynaforge']:.4g} vs {row['baseline_value']}, ratio {ratio}")


if __name__ == "__main__":
    main()
