"""The staged latent stack on chaotic 1D Kuramoto-Sivashinsky: does the corrector help, does the distilled
corrector keep the help at a fraction of the cost, does the ensemble spread track the error, and how does
the stack compare with the quickstart FNO trained for the same wall time?

Data (dynaforge's generator, configs/ks1d.yaml): u_t + u u_x + u_xx + u_xxxx = 0 on [0, 100), N = 200,
ETDRK4 with dt = 0.1, 1500 steps saved every 5th (301 frames, t in [0, 150]); smooth Fourier initial
fields (wavenumbers <= 10, max |u0| = 1). The transient ends by t ~ 20. Models step every 2nd stored frame
(model dt = 1.0) from 2 input frames.

Trained here, in the same process, on the same train split:
- the stack: `dynaforge train ... stage=all` (dynaforge.train.stages): latent operator (width 64, patch 4,
  4 blocks alternating token and channel attention, one U-merge level), residual corrector (flow matching,
  S = 8 Euler steps, trained on k-step rollout residuals), its 2-step distilled student (S / 4 network
  calls, distilled at the scoring temperature from the same noise as the teacher), and the steady-state
  prior;
- the quickstart FNO (configs/quickstart.yaml's model and optimiser: width 32, 16 modes, 4 layers, lr 3e-3,
  cosine schedule, one-step MSE) with the shared trainer, for as many epochs as fit in the wall time the
  stack's operator + corrector + distillation stages took (one timing epoch first, not counted).

Scored on the test split, in physical units, from the true frames at t = 30 (stored frames 60 and 62),
rolled out 100 model steps (100 time units, several Lyapunov times):
- rollout nRMSE (dynaforge.metrics.fields.nrmse_per_frame), averaged over steps 1-20 and 1-100;
- long-horizon energy-spectrum error: mean over shells k >= 1 whose true energy exceeds 1e-6 of the peak of
  |log10 E_pred(k) - log10 E_true(k)|, with E (dynaforge.metrics.spectra.energy_spectrum) averaged over
  the test trajectories and steps 51-100 (statistics of the attractor, not pointwise agreement);
- cost: wall time per rollout step (batch of all test trajectories, one thread);
- ensembles of 8 corrected rollouts: the Pearson correlation between the members' spread and the error of
  their mean over (trajectory, step), for steps 1-40 (before the error saturates) and all steps;
- the steady prior: for each test trajectory, 50 prior samples given its parameters against its last 50
  stored frames (t in [125, 150]): mean |log10 E_prior(k) - log10 E_true(k)| over energetic shells, against
  the training split's mean long-time spectrum as a baseline (dynaforge.evaluate.stack_report).
Every stochastic variant is rolled out with SEEDS noise seeds and scored by the mean over them (one draw
moves the spectrum error by about half the corrector's gain); the notes give each seed's value and the
standard error. The distillation criterion: the student keeps >= 80% of the S-step corrector's improvement
(spectrum error and nRMSE 1-20, each reported) at <= 1/4 of its cost, the cost measured as the wall time of
one correction (the sampler alone; fastest of 20 calls, student and teacher taking turns) and, in the
notes, as the rollout time per step beyond the operator alone.
The corrector learns truth(t + k) - the operator's k-step rollout from the true frames at t and runs every
k steps (--interval k, default INTERVAL); the other interval (every 4 steps for k = 1, every step
otherwise) is reported in the notes. Each corrector is scored with one draw of the residual per correction
(a sample, temperature 1), with the mean of 4 draws (an estimate of the residual's conditional mean), and
with one draw at temperature TEMPERATURE (the noise scaled down before sampling: draws nearer the flow's
image of the noise mean, less injected spread). The distilled student's share of the S-step corrector's
improvement is reported for each, with the cost per rollout step. An ABLATION (not a diffusion model, not
a claim): the same network regressing the residual's conditional mean with MSE, no noise.

Sizes (full): 16 train / 8 val / 16 test trajectories; operator 4 epochs (lr 3e-3, 2 unrolled calls, spectral
weight 0.1), corrector 2 epochs, distillation 6 epochs, ablation 2 epochs, steady prior 30 epochs; about 15
minutes on one core.

The student's settings were chosen on the validation split (8 trajectories, the same protocol from t = 30,
noise seeds 0-7, on a kept operator and corrector), never on the test split: share of the S-step
corrector's spectrum / nRMSE 1-20 gain kept at temperature 0.25 by a 2-step student distilled 2 epochs
48% / 95%, 6 epochs 91% / 96% (chosen), 6 epochs with a spectrum term (stages.consistency_distill.
spectral_weight = 0.1) 45% / 88%; a 1-step student, 2 epochs 1% / 75%, 6 epochs -2% / 91% (it keeps the
nRMSE gain but smooths the residual and loses the spectrum gain). One seed moves the spectrum error by about
half the gain, so these shares carry about +-30% (standard error over 8 seeds). The teacher keeps S = 8, the
documented default of stages.diffusion_residual.sampler_steps.
The steady prior's epochs were chosen on validation too (per-trajectory spectrum distance on the val split,
training-set baseline 0.155): 3 epochs 0.61, 10 epochs 0.28, 30 epochs 0.19 (chosen), 60 epochs 0.21.

Run: `.venv/bin/python benchmarks/latent_stack.py [--quick] [--work DIR] [--interval K]
[--retrain-corrector]` (`--work` keeps the data, the stack and the FNO; a rerun with the same folder only
rescores; `--retrain-corrector` retrains the corrector, student and ablation on the kept operator). Writes
benchmarks/results/latent_stack.json (ratio > 1: the first-named method is better). Timings on a shared
machine are provisional. `--quick` is the smoke run (`make bench-smoke`, SIZES["quick"]: 2 trajectories
per split, one epoch per stage, 8-step rollouts, 2 seeds): every stage and score runs, nothing it writes is a
figure, and it writes to a temporary folder (smoke.quick_path) unless --out is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import platform
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dynaforge.atomic import atomic_write_json
from dynaforge.config import Config, load_config, save_config
from dynaforge.evaluate.rollout import predict_physical
from dynaforge.evaluate.stack_report import long_horizon_spectrum_error, steady_prior_score
from dynaforge.generate import generate
from dynaforge.metrics.ensemble import spread_error_correlation
from dynaforge.metrics.fields import nrmse_per_frame
from dynaforge.models.flow import FlowInput, FlowOutput
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import (
    Corrector,
    LatentStack,
    ensemble_rollout,
    load_stack,
    operator_step,
    predictor_corrector_rollout,
)
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.runs import load_checkpoint
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train import window_engine
from dynaforge.train.losses import mse_loss
from dynaforge.train.stages import (
    CorrectorTask,
    StageContext,
    collate,
    fit,
    load_operator,
    model_scale,
    run_stages,
)
from dynaforge.train.task import StepLoss
from machine import load_note
from smoke import quick_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "latent_stack.json"
START_FRAME = 60
"""Stored frame where the test rollouts' input frames begin (t = 30, past the transient)."""
SPECTRUM_RANGE = 1e-6
"""Shells whose true energy is below this fraction of the peak are left out of the spectrum error."""

INTERVAL = 4
"""k: the corrector is trained on k-step rollout residuals and applied every k steps (--interval)."""
DISTILL_TEMPERATURE = 0.25
"""Noise scale the student is distilled at (= TEMPERATURE: the temperature it is scored at)."""
ABLATION = "mean_regression_ablation"
"""Folder (under the stack) of the deterministic conditional-mean regressor, an ablation (see MeanResidualTask)."""
STUDENT_STEPS = 2
"""Sampler steps of the distilled student (S / 4 = 2: a quarter of the teacher's network evaluations)."""
TEMPERATURE = 0.25
"""Noise scale of the reduced-temperature variants (Corrector.temperature)."""
SEEDS = 4
"""Noise seeds each stochastic variant is rolled out with; its scores are the mean over them (one draw of a
chaotic rollout moves the long-horizon spectrum error by about half the corrector's gain)."""


class Sizes(NamedTuple):
    """The sizes of a run: the figures, or the --quick smoke run."""

    n_train: int
    n_val: int
    n_test: int
    operator_epochs: int
    corrector_epochs: int
    distill_epochs: int
    steady_epochs: int
    rollout_steps: int
    members: int
    """Ensemble members."""
    seeds: int
    """Noise seeds of each stochastic variant (SEEDS)."""
    solver_steps: int
    """system.steps (saved every 5th: 1500 -> 301 frames)."""
    val_windows: int
    val_rollout: int
    """Operator calls of the operator stage's validation rollouts."""
    last_frames: int
    """The steady prior's long-time frames per trajectory."""
    timing_repeats: int
    """Timed calls of one correction (the fastest is kept)."""


SIZES = {
    "full": Sizes(
        n_train=16, n_val=8, n_test=16, operator_epochs=4, corrector_epochs=2, distill_epochs=6,
        steady_epochs=30, rollout_steps=100, members=8, seeds=SEEDS, solver_steps=1500, val_windows=128,
        val_rollout=20, last_frames=50, timing_repeats=20,
    ),
    # 81 frames: the 2 input frames at START_FRAME and 8 model steps of 2 frames
    "quick": Sizes(
        n_train=2, n_val=2, n_test=2, operator_epochs=1, corrector_epochs=1, distill_epochs=1,
        steady_epochs=1, rollout_steps=8, members=2, seeds=2, solver_steps=400, val_windows=8,
        val_rollout=2, last_frames=5, timing_repeats=2,
    ),
}  # fmt: skip


def stack_config(quick: bool, interval: int = INTERVAL) -> Config:
    size = SIZES["quick" if quick else "full"]
    return load_config(
        ROOT / "configs" / "ks1d.yaml",
        [
            f"system.steps={size.solver_steps}",
            f"dataset.n_train={size.n_train}",
            f"dataset.n_val={size.n_val}",
            f"dataset.n_test={size.n_test}",
            "dataset.shard_size=64",
            "dataset.batch_size=64",
            "data.history=2",
            "data.horizon=1",
            "data.stride=2",
            "data.batch_size=32",
            "model.name=latent",
            "model.width=64",
            "model.stem=32",
            "model.patch=4",
            "model.depth=4",
            "model.heads=4",
            "model.merge_levels=1",
            "train.optimizer.name=adamw",
            "train.schedule.name=cosine",
            "train.schedule.warmup_fraction=0.03",
            "train.grad_clip=1.0",
            "train.log_every=50",
            "train.device=cpu",
            f"stages.val_windows={size.val_windows}",
            f"stages.operator.epochs={size.operator_epochs}",
            "stages.operator.lr=0.003",
            "stages.operator.rollout_steps=2",
            f"stages.operator.val_rollout={size.val_rollout}",
            f"stages.diffusion_residual.epochs={size.corrector_epochs}",
            "stages.diffusion_residual.lr=0.002",
            "stages.diffusion_residual.sampler_steps=8",
            f"stages.diffusion_residual.interval={interval}",
            f"stages.consistency_distill.epochs={size.distill_epochs}",
            "stages.consistency_distill.lr=0.0005",
            f"stages.consistency_distill.student_steps={STUDENT_STEPS}",
            f"stages.consistency_distill.temperature={DISTILL_TEMPERATURE}",
            f"stages.steady_prior.epochs={size.steady_epochs}",
            f"stages.steady_prior.last_frames={size.last_frames}",
        ],
    )


def fno_config(base: Config, epochs: int) -> Config:
    """The quickstart's model and optimiser settings on the benchmark's data and windows."""
    quickstart = load_config(ROOT / "configs" / "quickstart.yaml")
    q = quickstart.train
    train = dataclasses.replace(
        base.train,
        epochs=epochs,
        lr=q.lr,
        weight_decay=q.weight_decay,
        optimizer=q.optimizer,
        schedule=q.schedule,
        grad_clip=q.grad_clip,
        loss=q.loss,
        rollout_steps=1,
    )
    return dataclasses.replace(base, model=quickstart.model, train=train)


def train_fno_for(base: Config, data: Path, work: Path, seconds: float) -> tuple[Any, int, float]:
    """The quickstart FNO trained for about `seconds`: one epoch timed, then a fresh run of that many epochs
    (a finished run already in `work` is reused: `--work` reruns only the scoring)."""
    done = work / "fno" / "checkpoints" / "last.pt"
    if done.exists() and load_checkpoint(done)["complete"]:
        state = load_checkpoint(work / "fno" / "checkpoints" / "best.pt")
        lines = [json.loads(line) for line in (work / "fno" / "metrics.jsonl").read_text().splitlines()]
        took = sum(r["epoch_time"] for r in lines if r.get("kind") == "epoch")
        return model_from_checkpoint(state).eval(), int(state["config"]["train"]["epochs"]), took
    probe = window_engine(fno_config(base, 1), data, work / "fno-probe", progress=False)
    started = time.perf_counter()
    probe.fit()
    epoch_seconds = time.perf_counter() - started
    epochs = max(1, round(seconds / epoch_seconds))
    started = time.perf_counter()
    window_engine(fno_config(base, epochs), data, work / "fno", progress=False).fit()
    took = time.perf_counter() - started
    model = model_from_checkpoint(load_checkpoint(work / "fno" / "checkpoints" / "best.pt")).eval()
    return model, epochs, took


def test_inputs(data: Path, stride: int, steps: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Physical (N, 2, C, X) input frames from START_FRAME, the true next `steps` frames, the parameters."""
    split = DatasetFolder(data).read_split("test")
    frames = fields_from_disk(split.fields)[:, START_FRAME::stride]
    return frames[:, :2], frames[:, 2 : 2 + steps], torch.as_tensor(split.params)


def stack_rollout(
    stack: LatentStack,
    corrector: Corrector | None,
    inputs: torch.Tensor,
    params: torch.Tensor,
    steps: int,
    every: int | None = None,
    seed: int = 0,
) -> torch.Tensor:
    """A (corrected) rollout in physical units."""
    conditions = Conditions(
        dt=torch.full((inputs.shape[0],), stack.dt, dtype=torch.float32),
        params=stack.parameters.normalize(params),
    )
    normalized = stack.normalizer.physical_to_normalized(inputs, 1)
    generator = torch.Generator().manual_seed(seed)
    with torch.inference_mode():
        predicted = predictor_corrector_rollout(
            stack.operator, corrector, normalized, conditions, steps, every, generator=generator
        )
    return stack.normalizer.normalized_to_physical(predicted, 1)


def scores(predicted: torch.Tensor, truth: torch.Tensor) -> dict[str, float]:
    curve = nrmse_per_frame(predicted, truth)
    return {
        "nrmse_20": float(curve[:20].mean()),
        "nrmse_all": float(curve.mean()),
        "spectrum": long_horizon_spectrum_error(predicted, truth, SPECTRUM_RANGE),
    }


def mean_scores(rows: list[dict[str, float]]) -> dict[str, float]:
    """Each score averaged over the noise seeds."""
    return {key: sum(row[key] for row in rows) / len(rows) for key in rows[0]}


def standard_error(values: list[float]) -> float:
    """Standard error of the mean of `values` over the noise seeds (0 for one value)."""
    n = len(values)
    if n < 2:
        return 0.0
    mean = sum(values) / n
    return (sum((v - mean) ** 2 for v in values) / (n - 1) / n) ** 0.5


def correction_seconds(
    correctors: dict[str, Corrector],
    stack: LatentStack,
    inputs: torch.Tensor,
    params: torch.Tensor,
    repeats: int = 20,
) -> dict[str, float]:
    """Wall time of one correction of each corrector (the sampler alone, on the test batch at the rollout's
    first step): the fastest of `repeats` calls, the correctors taking turns (so that a change of machine
    load hits them alike)."""
    conditions = Conditions(
        dt=torch.full((inputs.shape[0],), stack.dt, dtype=torch.float32),
        params=stack.parameters.normalize(params),
    )
    window = stack.normalizer.physical_to_normalized(inputs, 1)
    generator = torch.Generator().manual_seed(0)
    best = dict.fromkeys(correctors, float("inf"))
    with torch.inference_mode():
        prediction = operator_step(stack.operator, window, conditions)[:, 0]
        for repeat in range(repeats + 1):  # the first round warms up and is not counted
            for name, corrector in correctors.items():
                shape = (corrector.draws, *prediction.shape)
                noise = torch.randn(shape, generator=generator, dtype=torch.float32)
                started = time.perf_counter()
                corrector.residual(prediction, window[:, -1], conditions.params, noise)
                if repeat > 0:
                    best[name] = min(best[name], time.perf_counter() - started)
    return best


def seconds_per_step(run: Any, steps: int) -> float:
    started = time.perf_counter()
    run()
    return (time.perf_counter() - started) / steps


def record(
    case: str,
    baseline: str,
    metric: str,
    ours: float | None,
    theirs: float | None,
    lower_is_better: bool,
    notes: str,
) -> dict[str, Any]:
    ratio = None
    if ours is not None and theirs is not None and ours > 0 and theirs > 0:
        ratio = theirs / ours if lower_is_better else ours / theirs
    return {
        "case": case,
        "baseline": baseline,
        "metric": metric,
        "dynaforge": ours,
        "baseline_value": theirs,
        "ratio": ratio,
        "notes": notes,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: tiny sizes, not a figure, written to a temporary folder",
    )
    parser.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--out", default=None, help="results JSON (default results/latent_stack.json)")
    parser.add_argument(
        "--interval", type=int, default=INTERVAL, help=f"corrector interval k (default {INTERVAL})"
    )
    parser.add_argument(
        "--retrain-corrector",
        action="store_true",
        help="with --work: drop the corrector and student stages so they retrain (the operator is kept)",
    )
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work) if args.work else Path(scratch)
        if args.retrain_corrector:
            drop_corrector_stages(work / "stack", stack_config(args.quick, args.interval))
        results = run(work, args.quick, args.interval)
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    atomic_write_json(out, results)
    print(json.dumps(results, indent=1))
    print(f"wrote {out}")


class MeanResidualTask(CorrectorTask):
    """ABLATION, not a diffusion model: the corrector's network (same inputs, same k-step examples) regresses
    the residual's conditional mean with MSE, at flow time 0 and a zero state; no noise anywhere."""

    def loss(self, model: torch.nn.Module, batch: tuple[torch.Tensor, ...]) -> StepLoss:
        example = self.example(batch)
        target = (example.truth - example.prediction) / model_scale(model)
        loss = mse_loss(mean_residual(model, example.condition, batch[2]), target)
        return StepLoss(loss, loss)

    def validate(self, model: torch.nn.Module) -> float:
        """RMS error of prediction + regressed residual against the truth (normalised units)."""
        device = next(model.parameters()).device
        errors = []
        for lo in range(0, len(self.val_indices), self.config.data.batch_size):
            batch = collate(self.val, self.val_indices[lo : lo + self.config.data.batch_size], device)
            example = self.example(batch)
            residual = mean_residual(model, example.condition, batch[2]) * model_scale(model)
            errors.append((example.prediction + residual - example.truth).square().flatten(1).mean(1).sqrt())
        return float(torch.cat(errors).mean())


def mean_residual(model: torch.nn.Module, condition: torch.Tensor, params: torch.Tensor) -> torch.Tensor:
    state = torch.zeros_like(condition[:, 0])
    time = torch.zeros(state.shape[0], dtype=state.dtype, device=state.device)
    return model(FlowInput(state=state, time=time, condition=condition, params=params)).velocity


class MeanAsOneStepFlow(torch.nn.Module):
    """Wraps the ablation's regressor as a 1-step "flow" whose Euler step lands on the regressed residual
    whatever the noise (velocity = mean - x at t = 0), so the same rollout code runs it."""

    def __init__(self, regressor: torch.nn.Module) -> None:
        super().__init__()
        self.regressor, self.config = regressor, regressor.config

    def forward(self, inputs: FlowInput) -> FlowOutput:
        mean = mean_residual(self.regressor, inputs.condition, inputs.params)
        return FlowOutput(velocity=mean - inputs.state)


def mean_ablation(work: Path, data: Path, interval: int) -> Corrector:
    """Train (or reuse) the deterministic conditional-mean regressor on the kept operator, same budget and
    network as the corrector."""
    stack_root = work / "stack"
    folder = stack_root / ABLATION
    best = folder / "checkpoints" / "best.pt"
    if not best.exists():
        config = load_config(stack_root / "diffusion_residual" / "config.yaml")
        context = StageContext(config, data.resolve(), stack_root, progress=False)
        task = MeanResidualTask(config, context.data(), load_operator(context), 1, "euler", interval=interval)
        fit(context, ABLATION, config, task)
    model = model_from_checkpoint(load_checkpoint(best)).eval()
    return Corrector(MeanAsOneStepFlow(model), steps=1, interval=interval)


def drop_corrector_stages(stack_root: Path, config: Config) -> None:
    """Forget the corrector and student stages of a kept stack (and record the new config), so that a rerun
    retrains only them on the kept operator."""
    status_path = stack_root / "stages.json"
    if not status_path.exists():
        return
    status = json.loads(status_path.read_text())
    for name in ("diffusion_residual", "consistency_distill", ABLATION):
        status["stages"].pop(name, None)
        shutil.rmtree(stack_root / name, ignore_errors=True)
    atomic_write_json(status_path, status)
    save_config(config, stack_root / "config.yaml")


def run(work: Path, quick: bool, interval: int = INTERVAL) -> list[dict[str, Any]]:
    size = SIZES["quick" if quick else "full"]
    steps, members, seeds = size.rollout_steps, size.members, size.seeds
    config = stack_config(quick, interval)
    data, stack_root = work / "data", work / "stack"
    started = time.perf_counter()
    generate(config, data, progress=False)
    generation = time.perf_counter() - started
    run_stages(config, data, stack_root, progress=False)
    # the steady prior is opt-in (not in stage=all): scored here against its baseline
    status = run_stages(config, data, stack_root, stage="steady_prior", progress=False)["stages"]
    stack_seconds = sum(
        status[name]["seconds"] for name in ("operator", "diffusion_residual", "consistency_distill")
    )
    fno, fno_epochs, fno_seconds = train_fno_for(config, data, work, stack_seconds)
    stack = load_stack(stack_root)
    assert stack.corrector is not None and stack.student is not None
    inputs, truth, params = test_inputs(data, config.data.stride, steps)
    steps = truth.shape[1]

    predictions: dict[str, list[torch.Tensor]] = {}
    cost: dict[str, float] = {}
    variants = {
        "operator": None,
        "corrector": stack.corrector,
        "student": dataclasses.replace(stack.student, temperature=1.0),
        "corrector-mean4": dataclasses.replace(stack.corrector, draws=4),
        "student-mean4": dataclasses.replace(stack.student, draws=4, temperature=1.0),
        f"corrector-T{TEMPERATURE}": dataclasses.replace(stack.corrector, temperature=TEMPERATURE),
        f"student-T{TEMPERATURE}": dataclasses.replace(stack.student, temperature=TEMPERATURE),
        "mean-regression-ablation": mean_ablation(work, data, stack.corrector.interval),
    }
    # every variant runs `seeds` times (noise seeds 0, 1, ...; the operator alone is deterministic and reruns
    # only for its timing), the variants taking turns so that a change of machine load hits them alike:
    # scores are averaged over the seeds, the cost is the fastest run
    runs: dict[str, list[torch.Tensor]] = {name: [] for name in variants}
    times: dict[str, list[float]] = {name: [] for name in variants}
    for seed in range(seeds):
        for name, corrector in variants.items():
            started = time.perf_counter()
            runs[name].append(stack_rollout(stack, corrector, inputs, params, steps, seed=seed))
            times[name].append((time.perf_counter() - started) / steps)
    for name, corrector in variants.items():
        predictions[name] = runs[name] if corrector is not None else runs[name][:1]
        cost[name] = min(times[name])
    pair = (f"corrector-T{TEMPERATURE}", f"student-T{TEMPERATURE}")
    correction_cost = correction_seconds(
        {name: variants[name] for name in pair},  # type: ignore[misc]
        stack,
        inputs,
        params,
        size.timing_repeats,
    )
    k = stack.corrector.interval
    other_every = 4 if k == 1 else 1
    every4 = {
        name: stack_rollout(stack, variants[name], inputs, params, steps, every=other_every)
        for name in ("corrector", "student")
    }
    normalizer = stack.normalizer
    with torch.inference_mode():
        fno.eval()
        cost["fno"] = seconds_per_step(
            lambda: predictions.__setitem__("fno", [predict_physical(fno, normalizer, inputs, steps, 1)]),
            steps,
        )
    seed_scores = {name: [scores(p, truth) for p in runs] for name, runs in predictions.items()}
    score = {name: mean_scores(rows) for name, rows in seed_scores.items()}
    score4 = {name: scores(p, truth) for name, p in every4.items()}
    split = DatasetFolder(data)
    test_split = split.read_split("test")
    steady = steady_prior_score(
        stack,
        test_split.fields,
        test_split.params,
        split.read_split("train").fields,
        config.stages.steady_prior.last_frames,
    )

    conditions = Conditions(
        dt=torch.full((inputs.shape[0],), stack.dt, dtype=torch.float32),
        params=stack.parameters.normalize(params),
    )
    spread: dict[str, tuple[float, float, dict[str, float]]] = {}
    for name in ("corrector", "student"):
        with torch.inference_mode():
            ensemble = ensemble_rollout(
                stack.operator,
                variants[name],  # type: ignore[arg-type]
                normalizer.physical_to_normalized(inputs, 1),
                conditions,
                steps,
                members=members,
            )
        mean = normalizer.normalized_to_physical(ensemble.mean, 1)
        spread_physical = ensemble.spread * torch.tensor(normalizer.std, dtype=torch.float32).view(
            1, 1, -1, 1
        )
        early = min(40, steps)
        spread[name] = (
            spread_error_correlation(spread_physical[:, :early], mean[:, :early], truth[:, :early]),
            spread_error_correlation(spread_physical, mean, truth),
            scores(mean, truth),
        )
    return build_records(
        config,
        score,
        score4,
        cost,
        spread,
        steps,
        members,
        quick,
        generation,
        status,
        fno_epochs,
        fno_seconds,
        k,
        other_every,
        seed_scores=seed_scores,
        correction_cost=correction_cost,
        steady=steady,
    )


def build_records(
    config: Config,
    score: dict[str, dict[str, float]],
    score4: dict[str, dict[str, float]],
    cost: dict[str, float],
    spread: dict[str, tuple[float, float, dict[str, float]]],
    steps: int,
    members: int,
    quick: bool,
    generation: float,
    status: dict[str, Any],
    fno_epochs: int,
    fno_seconds: float,
    interval: int = 1,
    other_every: int = 4,
    seed_scores: dict[str, list[dict[str, float]]] | None = None,
    correction_cost: dict[str, float] | None = None,
    steady: dict[str, float] | None = None,
) -> list[dict[str, Any]]:
    size = SIZES["quick" if quick else "full"]
    split = f"{config.dataset.n_train} train / {config.dataset.n_test} test trajectories"
    case = f"KS 1D L=100 N=200, model dt=1, {steps}-step rollouts from t=30, {split}" + (
        " (QUICK smoke run)" if quick else ""
    )
    env = (
        f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), Python {platform.python_version()}; "
        f"stage seconds: "
        + ", ".join(f"{k} {v['seconds']:.0f}" for k, v in status.items())
        + f"; FNO {fno_epochs} epochs in {fno_seconds:.0f} s; generation {generation:.0f} s; {load_note()} "
        "when written"
    )

    def describe(name: str, source: dict[str, dict[str, float]] = score) -> str:
        s = source[name]
        return f"{name}: nRMSE 1-20 {s['nrmse_20']:.4f}, 1-{steps} {s['nrmse_all']:.4f}, spectrum {s['spectrum']:.4f}"

    every4 = f"; applied every {other_every} step(s) instead: " + "; ".join(
        describe(n, score4) for n in score4
    )
    all_scores = "; ".join(describe(n) for n in score) + every4
    records = []
    every = (
        "every step" if interval == 1 else f"every {interval} steps (trained on {interval}-step residuals)"
    )
    t = f"T{TEMPERATURE}"
    labels = {
        "corrector": f"operator + S=8 corrector {every}, one draw",
        "corrector-mean4": f"operator + S=8 corrector {every}, mean of 4 draws",
        f"corrector-{t}": f"operator + S=8 corrector {every}, one draw at temperature {TEMPERATURE}",
        "student": f"operator + {STUDENT_STEPS}-step student {every}, one draw",
        "student-mean4": f"operator + {STUDENT_STEPS}-step student {every}, mean of 4 draws",
        f"student-{t}": f"operator + {STUDENT_STEPS}-step student {every}, one draw at temperature {TEMPERATURE}",
        "mean-regression-ablation": f"ABLATION, not diffusion: deterministic conditional-mean regressor {every}",
    }
    for variant in ("corrector", "corrector-mean4", f"corrector-{t}", "mean-regression-ablation"):
        for metric, key in (
            ("long-horizon log10 energy-spectrum error (steps 51-100)", "spectrum"),
            ("rollout nRMSE, steps 1-20", "nrmse_20"),
            (f"rollout nRMSE, steps 1-{steps}", "nrmse_all"),
        ):
            records.append(
                record(case, "latent operator alone", f"{metric} [{labels[variant]}]",
                       score[variant][key], score["operator"][key], True, f"{all_scores}; {env}")
            )  # fmt: skip
    # distillation: share of the S-step corrector's improvement the few-step student keeps, and its cost
    pairs = (
        ("corrector", "student"),
        ("corrector-mean4", "student-mean4"),
        (f"corrector-{t}", f"student-{t}"),
    )
    seed_scores = seed_scores or {}

    def spread_of(name: str, key: str) -> str:
        rows = seed_scores.get(name, [])
        values = ", ".join(f"{row[key]:.4f}" for row in rows)
        return f"{name} per seed [{values}] (standard error {standard_error([r[key] for r in rows]):.4f})"

    for teacher, student in pairs:
        for key, label in (("spectrum", "spectrum error"), ("nrmse_20", "nRMSE 1-20")):
            gain = score["operator"][key] - score[teacher][key]
            kept = (score["operator"][key] - score[student][key]) / gain if gain > 0 else None
            note = (
                f"means over {size.seeds} noise seeds; improvement of [{labels[teacher]}] over the operator "
                f"{gain:.4g}; {describe(student)}; {spread_of(teacher, key)}; {spread_of(student, key)}"
                + (
                    ""
                    if gain > 0
                    else "; the S-step corrector does not improve this metric, so nothing is kept"
                )
            )
            records.append(
                record(case, "target: 80% kept",
                       f"fraction of the {label} improvement of [{labels[teacher]}] kept by [{labels[student]}]",
                       kept, 0.8, False, f"{note}; {env}")
            )  # fmt: skip
    for teacher, student in pairs:
        records.append(
            record(case, labels[teacher], f"seconds per rollout step (all test trajectories), {labels[student]}",
                   cost[student], cost[teacher], True,
                   f"fastest of {size.seeds} runs; operator alone {cost['operator']:.4g} s; cost relative to the "
                   "operator alone: " + ", ".join(f"{n} {cost[n] / cost['operator']:.2f}x" for n in labels)
                   + f"; FNO {cost['fno']:.4g} s; {env}")
        )  # fmt: skip
    # the done-when's cost: the correction's overhead (rollout time beyond the operator's), student / teacher
    teacher, student = f"corrector-{t}", f"student-{t}"
    overhead = {n: cost[n] - cost["operator"] for n in (teacher, student)}
    calls = STUDENT_STEPS / 8
    if correction_cost:
        per_call = correction_cost[student] / correction_cost[teacher]
        records.append(
            record(case, "target: at most 1/4 of the S-step sampler's cost",
                   f"cost of one correction, [{labels[student]}] / [{labels[teacher]}]",
                   per_call, 0.25, True,
                   f"the sampler alone on the test batch, fastest of {size.timing_repeats} calls: student "
                   f"{correction_cost[student] * 1e3:.3f} ms, S-step {correction_cost[teacher] * 1e3:.3f} ms; "
                   f"network calls {STUDENT_STEPS} / 8 = {calls:.3f}; rollout overhead per step beyond the "
                   f"operator alone (fastest of {size.seeds} runs): student {overhead[student] * 1e3:.3f} ms, S-step "
                   f"{overhead[teacher] * 1e3:.3f} ms, ratio "
                   + (f"{overhead[student] / overhead[teacher]:.3f}" if overhead[teacher] > 0 else "n/a")
                   + f" (on a loaded machine the operator's own time varies as much); {env}")
        )  # fmt: skip
    if steady is not None:
        val = status.get("steady_prior", {}).get("best_val")
        records.append(
            record(case, "training split's mean long-time spectrum (same for every test trajectory)",
                   "steady prior: log10 energy-spectrum distance to each test trajectory's long-time states",
                   steady["prior"], steady["baseline"], True,
                   f"{steady['samples']} prior samples ({steady['sampler_steps']} Euler steps) for the test "
                   f"parameters against the last {config.stages.steady_prior.last_frames} stored frames of each "
                   "test trajectory: mean over trajectories of the mean |log10 E_prior(k) - log10 E_true(k)| "
                   f"over energetic shells k >= 1; energy of samples / truth {steady['energy_ratio']:.3f}; "
                   "validation metric that chose the checkpoint (the same distance, spectra pooled over the "
                   "validation states): "
                   + (f"{val:.3f}" if val is not None else "n/a") + f"; {env}")
        )  # fmt: skip
    for name in ("corrector", "student"):
        early, overall, mean_scores = spread[name]
        records.append(
            record(case, "none (0 = spread says nothing about the error)",
                   f"spread-error correlation of {members}-member ensembles ({name}), steps 1-{min(40, steps)}",
                   early, None, False,
                   f"Pearson r over (trajectory, step) of the RMS spread and the RMS error of the ensemble mean; all "
                   f"{steps} steps: r = {overall:.3f}; ensemble mean nRMSE 1-20 {mean_scores['nrmse_20']:.4f}, "
                   f"1-{steps} {mean_scores['nrmse_all']:.4f}, spectrum {mean_scores['spectrum']:.4f}; {env}")
        )  # fmt: skip
    for name, label in [*labels.items(), ("operator", "latent operator alone")]:
        for metric, key in (
            ("long-horizon log10 energy-spectrum error", "spectrum"),
            ("rollout nRMSE, steps 1-20", "nrmse_20"),
        ):
            records.append(
                record(case, f"quickstart FNO, same training wall time ({fno_epochs} epochs)", f"{metric} [{label}]",
                       score[name][key], score["fno"][key], True, f"{describe('fno')}; {env}")
            )  # fmt: skip
    return records


if __name__ == "__main__":
    main()
