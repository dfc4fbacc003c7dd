"""Tasks from the literature, trained by dynaforge and by neuraloperator for the same wall-clock budget.

Tasks (their data and accuracy checks: `literature_data.py`):
- `burgers`: the FNO paper's 1D Burgers operator u(0) -> u(1) (Li et al., ICLR 2021, section 5.1; nu = 0.1,
  N = 1024, 1000 training / 100 validation / 200 test pairs). Models: the paper's FNO, 16 modes, width 64,
  4 layers, projection 128, the grid coordinate as an input channel.
- `darcy`: the same paper's 2D Darcy flow a -> u (section 5.2; piecewise-constant coefficients 12 / 3, f = 1,
  u = 0 on the boundary) at 49 x 49 points, 1000 / 100 / 200 pairs. Models: the paper's 2D FNO, 12 modes
  per axis, width 32, 4 layers, projection 128, both coordinates as input channels.
- `pdebench_burgers`: PDEBench's 1D Burgers (nu = 0.01) with its FNO protocol (`config_Bgs.yaml`): 256
  points, 41 frames, the first 10 given, the model called autoregressively on its own predictions for the
  other 31 at test. Trained one step per window (PDEBench's loop trains through the whole rollout: at these
  budgets that diverges in both libraries; `--full-rollout`). 1000 / 100 / 100 trajectories (PDEBench 9000 / 1000). Models: PDEBench's FNO, 12 modes, width 20, 4
  layers, projection 128, the 10 frames and the grid coordinate as input channels.

Models have the same size in both libraries (real parameters counted in each record). dynaforge: the task's
config in `configs/` trained by the window engine with `train.time_budget` (the schedule spans the budget).
neuraloperator 2.0.0: `neuralop.models.FNO` (n_modes given so that it keeps the same Fourier modes; it
keeps n // 2 + 1 rfft modes on the last axis), positional embedding `grid`, `lifting_channel_ratio=0`,
`projection_channel_ratio` for the same projection width, no channel MLP, linear skips; AdamW lr 1e-3,
weight decay 1e-4 on weights of 2 or more dimensions, on physical fields (as its users train these tasks),
a cosine schedule fitted to the budget: a few steps and one validation are timed on a copy of the model
first and the cosine spans the epochs that fit in the rest of the budget; after the first epoch the
schedule is fitted again to the epochs that its measured time leaves room for (a few steps overestimated
the epoch by up to 1.5x), and the cosine goes from the peak to 0 over their optimiser steps. It runs its `Trainer` with its relative L2 loss (`LpLoss`), one step per window (the
autoregressive task: every window of 10 frames and the next), at the batch of the dynaforge config (10,
10, 25; `--baseline-batch` changes it). With `--full-rollout` both libraries train the autoregressive task
through the whole 31-step rollout instead, neuraloperator in the training loop of PDEBench's FNO script (MSE
per step, summed over the unrolled steps), dynaforge with `train.rollout_steps=31`. Both libraries validate on the
validation split every epoch (inside their clocks) and run on one thread.

The figure: test relative L2 error ||pred - truth|| / ||truth|| per sample and predicted frame, mean over
the test split, in physical units, after the budget (for the autoregressive task PDEBench's nRMSE, which on
a uniform grid is the same quantity, averaged over the 31 predicted frames); `ratio` = neuraloperator's
error / dynaforge's (> 1: dynaforge better), mean of the seeds. Validation error against wall time goes to
results/literature.curves.json and docs/literature.png.

    python benchmarks/literature.py --tasks burgers,darcy,pdebench_burgers --budget 720 --seeds 0,1,2
                                                 # the issue's protocol (3.6 h of training)
    python benchmarks/literature.py --budget 120 --seeds 0,1,2   # what one session's CPU affords (37 min)
    python benchmarks/literature.py --quick      # the smoke run (`make bench-smoke`): not a figure

`--quick` runs every task for both libraries on tiny splits (literature_data.QUICK_SPLITS, cached in a
temporary folder) with a 1 s budget, seed 0, and writes the records, curves and figure to a temporary
folder (smoke.quick_path) unless --out is given.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import tempfile
import textwrap
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset, TensorDataset

from dynaforge.allocator import keep_freed_memory
from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.metrics.fields import relative_l2_per_frame
from dynaforge.models import ModelInput
from dynaforge.train import window_engine
from dynaforge.train.log import read_metrics
from literature_data import FRAMES, dataset_folder, task_data, task_splits
from machine import load_note
from smoke import quick_path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "literature.json"
FIGURE = ROOT / "docs" / "literature.png"


@dataclass(frozen=True)
class Task:
    name: str
    title: str
    config: Path
    history: int
    """Frames given; the rest of each sample's frames are predicted one call at a time."""
    spatial_dims: int
    modes: int
    width: int
    projection: int
    batch_size: int
    """neuraloperator's batch: the same as the dynaforge config's (smaller than the paper's 20 and PDEBench's 50:
    at budgets of minutes more optimiser steps win; on Burgers batch 10 gave neuraloperator 0.0020-0.0024
    against 0.0032 at batch 20 in 120 s)."""
    autoregressive: bool


TASKS = {
    "burgers": Task(
        "burgers",
        "FNO paper 1D Burgers (nu=0.1, N=1024, 1000/200 pairs)",
        ROOT / "configs" / "fno_paper_burgers.yaml",
        history=1,
        spatial_dims=1,
        modes=16,
        width=64,
        projection=128,
        batch_size=10,
        autoregressive=False,
    ),
    "darcy": Task(
        "darcy",
        "FNO paper 2D Darcy flow (49x49, 1000/200 pairs)",
        ROOT / "configs" / "fno_paper_darcy.yaml",
        history=1,
        spatial_dims=2,
        modes=12,
        width=32,
        projection=128,
        batch_size=10,
        autoregressive=False,
    ),
    "pdebench_burgers": Task(
        "pdebench_burgers",
        "PDEBench 1D Burgers (nu=0.01, 256 points, 10 frames -> 31 autoregressive, 1000/100 trajectories)",
        ROOT / "configs" / "pdebench_burgers.yaml",
        history=10,
        spatial_dims=1,
        modes=12,
        width=20,
        projection=128,
        batch_size=25,
        autoregressive=True,
    ),
}


@dataclass
class Setup:
    budget: float = 180.0
    seeds: tuple[int, ...] = (0,)
    lr: float = 1e-3
    weight_decay: float = 1e-4
    layers: int = 4
    baseline_batch: int | None = None
    """neuraloperator's batch instead of the task's."""
    full_rollout: bool = False
    """Autoregressive task: train both libraries through the whole rollout (PDEBench's FNO loop) instead of
    one step at a time."""
    quick: bool = False
    """The smoke run's data (literature_data.QUICK_SPLITS)."""


def through_rollout(task: Task, setup: Setup) -> bool:
    """Both libraries train the whole rollout (`--full-rollout`, autoregressive task only)."""
    return task.autoregressive and setup.full_rollout


# ---- data ----------------------------------------------------------------------------------------------


def split(fields: np.ndarray, task: Task, setup: Setup, name: str) -> Tensor:
    """A split's samples (n, frames, *space) as float32 (test first, then val, then train)."""
    _, val, test = task_splits(task.name, setup.quick)
    rows = {"test": slice(0, test), "val": slice(test, test + val), "train": slice(test + val, None)}[name]
    return torch.from_numpy(fields[rows])


Step = Callable[[Tensor], Tensor]
"""The last `history` physical frames (B, history, *space) -> the next frame (B, 1, *space)."""


def rollout(step: Step, samples: Tensor, history: int) -> Tensor:
    """Every frame after the first `history`, each predicted from the model's own earlier predictions."""
    frames, predicted = samples[:, :history], []
    for _ in range(samples.shape[1] - history):
        predicted.append(step(frames))
        frames = torch.cat([frames[:, 1:], predicted[-1]], dim=1)
    return torch.cat(predicted, dim=1)


def test_error(step: Step, fields: np.ndarray, task: Task, setup: Setup) -> float:
    """Mean over the test samples and predicted frames of ||pred - truth|| / ||truth||, physical units."""
    samples, errors = split(fields, task, setup, "test"), []
    with torch.inference_mode():
        for chunk in samples.split(50):
            predicted = rollout(step, chunk, task.history)
            errors.append(relative_l2_per_frame(predicted[:, :, None], chunk[:, task.history :, None]))
    return float(torch.cat(errors).mean())


# ---- dynaforge -----------------------------------------------------------------------------------------


ABLATIONS: dict[str, list[str]] = {
    "config as given": [],
    "relative L2 loss": ["train.loss=relative_l2"],
    "relative L2, no clipping": [
        "train.loss=relative_l2",
        "train.grad_clip=null",
        "train.grad_clip_relative=null",
    ],
    "relative L2, no warmup": ["train.loss=relative_l2", "train.schedule.warmup_fraction=0"],
    "relative L2, no coordinates": ["train.loss=relative_l2", "model.coordinates=false"],
    "relative L2, residual": ["train.loss=relative_l2", "model.residual=true"],
    "no weight decay": ["train.weight_decay=0"],
    "no clipping": ["train.grad_clip=null", "train.grad_clip_relative=null"],
    "clipping at 1": ["train.grad_clip=1", "train.grad_clip_relative=null"],
    "relative clipping 2": ["train.grad_clip_relative=2"],
    "relative clipping 1.5": ["train.grad_clip_relative=1.5"],
    "relative clipping 3": ["train.grad_clip_relative=3"],
    "no warmup": ["train.schedule.warmup_fraction=0"],
    "muon": ["train.optimizer.name=muon"],
    "muon, spectral weights too": ["train.optimizer.name=muon", "train.optimizer.muon_spectral=true"],
    "lr 3e-3": ["train.lr=0.003"],
    "lr 2e-3": ["train.lr=0.002"],
    "lr 5e-4": ["train.lr=0.0005"],
    "EMA 0.995": ["train.ema.decay=0.995"],
    "EMA 0.999": ["train.ema.decay=0.999"],
    "compiled": ["train.compile.enabled=true"],
    "batch 10": ["data.batch_size=10"],
    "batch 20": ["data.batch_size=20"],
    "projection 256": ["model.projection=256"],
    "normal spectral init": ["model.spectral_init=normal"],
    "batch 5": ["data.batch_size=5"],
    "batch 10 no clipping": ["data.batch_size=10", "train.grad_clip=null", "train.grad_clip_relative=null"],
    "batch 5 no clipping": ["data.batch_size=5", "train.grad_clip=null", "train.grad_clip_relative=null"],
    "physical units (no normalisation)": ["data.normalize=none"],
    "normalised, MSE": ["data.normalize=train_stats", "train.loss=mse"],
    "defaults, relative L2": [  # the global defaults since 2026-11-27: only model, batch and budget set
        "data.normalize=train_stats",
        "train.schedule.warmup_fraction=0.05",
    ],
    "defaults, no warmup": [  # the defaults since 2026-11-27 with warmup_fraction 0 (the candidate default)
        "data.normalize=train_stats",
        "train.schedule.warmup_fraction=0",
    ],
    "global defaults": [  # the global defaults before 2026-11-27 (MSE loss); the name its rows ran under
        "data.normalize=train_stats",
        "train.loss=mse",
        "train.schedule.warmup_fraction=0.05",
    ],
    "no coordinates": ["model.coordinates=false"],
    "residual": ["model.residual=true"],
    "no residual": ["model.residual=false"],
    "rollout 2": ["train.rollout_steps=2"],
    "rollout 4": ["train.rollout_steps=4"],
    "neuraloperator's units and loss": ["data.normalize=none", "train.loss=relative_l2"],
    "neuraloperator's units and loss, no clipping": [
        "data.normalize=none",
        "train.loss=relative_l2",
        "train.grad_clip=null",
        "train.grad_clip_relative=null",
    ],
}
"""`--ablate`: one switch changed from a task's config at a time (dynaforge only). Rows already in the
ablation file keep the overrides they ran with: before 2026-11-27 the default clipping was absolute at 1,
so `train.grad_clip=null` alone meant no clipping then."""


def run_dynaforge(
    task: Task,
    setup: Setup,
    fields: np.ndarray,
    folder: Path,
    seed: int,
    out: Path,
    extra: tuple[str, ...] = (),
) -> dict[str, Any]:
    overrides = [f"train.time_budget={setup.budget}", f"train.seed={seed}", *extra]
    if through_rollout(task, setup):
        overrides.append(f"train.rollout_steps={FRAMES[task.name] - task.history}")
    engine = window_engine(load_config(task.config, overrides), folder, out, progress=False, overwrite=True)
    summary = engine.fit()
    model, normalizer, dims = engine.model.eval(), engine.task.normalizer, task.spatial_dims

    def step(frames: Tensor) -> Tensor:
        normalized = normalizer.physical_to_normalized(frames[:, :, None], spatial_dims=dims)
        return normalizer.normalized_to_physical(model(ModelInput(frames=normalized)).frames, dims)[:, :1, 0]

    records = read_metrics(out / "metrics.jsonl")
    epochs = [r for r in records if r["kind"] == "epoch"]
    return {
        "library": "dynaforge",
        "task": task.name,
        "seed": seed,
        "seconds": summary.seconds,
        "epochs": len(epochs),
        "parameters": real_parameters(model),
        "test_rel_l2": test_error(step, fields, task, setup),
        "curve": [[r["elapsed"], r["val_loss"]] for r in epochs],
        "curve_metric": "validation loss (the config's loss)",
    }


def real_parameters(model: nn.Module) -> int:
    """Real numbers in the weights (neuraloperator stores spectral weights complex: two reals each)."""
    return sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters())


# ---- neuraloperator ------------------------------------------------------------------------------------


class Windows(Dataset[dict[str, Tensor]]):
    """Every (history frames, next frame) window of the samples, as neuraloperator's Trainer reads them (an
    operator task's sample is one window: its input frame and its output frame)."""

    def __init__(self, samples: Tensor, history: int) -> None:
        self.samples, self.history = samples, history
        self.per_sample = samples.shape[1] - history

    def __len__(self) -> int:
        return len(self.samples) * self.per_sample

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        sample, start = divmod(i, self.per_sample)
        frames = self.samples[sample, start : start + self.history + 1]
        return {"x": frames[: self.history], "y": frames[self.history :]}


def neuraloperator_fno(task: Task, setup: Setup) -> nn.Module:
    from neuralop.models import FNO

    # neuraloperator keeps n_modes // 2 + 1 rfft modes on the last axis and n_modes (both signs) on the others
    n_modes = (*(2 * task.modes for _ in range(task.spatial_dims - 1)), 2 * task.modes - 2)
    return FNO(
        n_modes=n_modes,
        in_channels=task.history,
        out_channels=1,
        hidden_channels=task.width,
        n_layers=setup.layers,
        lifting_channel_ratio=0,
        projection_channel_ratio=task.projection / task.width,
        positional_embedding="grid",
        non_linearity=nn.functional.gelu,
        use_channel_mlp=False,
        fno_skip="linear",
    )


def adamw(model: nn.Module, setup: Setup) -> torch.optim.AdamW:
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and not n.endswith("bias")]
    rest = [p for n, p in model.named_parameters() if not (p.ndim >= 2 and not n.endswith("bias"))]
    groups = [{"params": decay, "weight_decay": setup.weight_decay}, {"params": rest, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=setup.lr)


def rollout_loss(model: nn.Module, samples: Tensor, history: int) -> Tensor:
    """PDEBench's autoregressive training loss: the MSE of each predicted frame, summed over the rollout."""
    error = rollout(model, samples, history) - samples[:, history:]
    return error.square().flatten(2).mean(dim=(0, 2)).sum()


def operator_loss(task: Task, setup: Setup) -> Callable[[nn.Module, Any], Tensor]:
    """The training loss of a batch: neuraloperator's LpLoss of one step, or PDEBench's rollout MSE."""
    if through_rollout(task, setup):
        return lambda model, batch: rollout_loss(model, batch[0], task.history)
    from neuralop.losses import LpLoss

    lp = LpLoss(d=task.spatial_dims, p=2)
    return lambda model, batch: lp(model(batch["x"]), batch["y"])


def probe_seconds(
    model: nn.Module, setup: Setup, task: Task, train: DataLoader, validate: Callable[[nn.Module], float]
) -> tuple[float, float]:
    """Seconds per optimiser step (median of 5 after one) and per validation, on a throwaway copy."""
    model, times, loss = copy.deepcopy(model), [], operator_loss(task, setup)
    optimizer = adamw(model, setup)
    for _, batch in zip(range(6), train, strict=False):
        began = time.perf_counter()
        optimizer.zero_grad()
        loss(model, batch).backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    validate(model)
    return statistics.median(times[1:]), time.perf_counter() - began


class EpochSchedulerStandIn:
    """Takes the Trainer's per-epoch `scheduler.step()`; the cosine moves per optimiser step instead."""

    def step(self, *args: Any) -> None:
        pass


def run_neuraloperator(
    task: Task,
    setup: Setup,
    fields: np.ndarray,
    seed: int,
    build: Callable[[Task, Setup], nn.Module] | None = None,
) -> dict[str, Any]:
    """neuraloperator's training of its FNO (or of the model `build` makes) for the budget (module docstring)."""
    started = time.perf_counter()
    curve: list[list[float]] = []
    torch.manual_seed(seed)
    model = (build or neuraloperator_fno)(task, setup)
    generator = torch.Generator().manual_seed(seed)
    batch = setup.baseline_batch or task.batch_size
    train_samples, val_samples = split(fields, task, setup, "train"), split(fields, task, setup, "val")
    if through_rollout(task, setup):
        train = DataLoader(TensorDataset(train_samples), batch, shuffle=True, generator=generator)
    else:
        train = DataLoader(Windows(train_samples, task.history), batch, shuffle=True, generator=generator)

    def validate(model: nn.Module) -> float:
        """Mean validation relative L2 (physical units), as the error against wall time."""
        with torch.inference_mode():
            predicted = rollout(model, val_samples, task.history)
            error = relative_l2_per_frame(predicted[:, :, None], val_samples[:, task.history :, None]).mean()
        return float(error)

    step, validation = probe_seconds(model, setup, task, train, validate)
    left = setup.budget - (time.perf_counter() - started)
    epochs = max(1, math.floor(left / (len(train) * step + validation)))
    optimizer = adamw(model, setup)
    total = [epochs * len(train)]  # refitted after the first epoch, which times the real thing
    cosine = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s / total[0], 1.0)))
    )
    optimizer.register_step_post_hook(lambda *_: cosine.step())
    began = time.perf_counter()
    run_epochs(model, task, setup, train, optimizer, 1, val_samples, validate, curve, started)
    epoch = time.perf_counter() - began
    more = max(0, math.floor((setup.budget - (time.perf_counter() - started)) / epoch))
    total[0] = (1 + more) * len(train)
    if more:
        run_epochs(model, task, setup, train, optimizer, more, val_samples, validate, curve, started)
    epochs = 1 + more
    seconds = time.perf_counter() - started
    model.eval()
    return {
        "library": "neuraloperator",
        "task": task.name,
        "seed": seed,
        "seconds": seconds,
        "epochs": epochs,
        "batch": batch,
        "parameters": real_parameters(model),
        "test_rel_l2": test_error(model, fields, task, setup),
        "curve": curve,
        "curve_metric": "validation relative L2 (physical units)",
    }


def run_epochs(
    model: nn.Module,
    task: Task,
    setup: Setup,
    train: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    val_samples: Tensor,
    validate: Callable[[nn.Module], float],
    curve: list[list[float]],
    started: float,
) -> None:
    """`epochs` passes of neuraloperator's Trainer, or of PDEBench's loop with `--full-rollout`."""
    if not through_rollout(task, setup):
        train_with_trainer(model, task, train, optimizer, epochs, val_samples, curve, started)
        return
    loss = operator_loss(task, setup)
    for _ in range(epochs):  # PDEBench's FNO training loop
        model.train()
        for batch in train:
            optimizer.zero_grad()
            loss(model, batch).backward()
            optimizer.step()
        model.eval()
        curve.append([time.perf_counter() - started, validate(model)])


def train_with_trainer(
    model: nn.Module,
    task: Task,
    train: DataLoader,
    optimizer: torch.optim.Optimizer,
    epochs: int,
    val_samples: Tensor,
    curve: list[list[float]],
    started: float,
) -> None:
    """neuraloperator's own Trainer with its LpLoss; the curve is its own validation of one-step windows."""
    from neuralop.losses import LpLoss
    from neuralop.training import Trainer

    class CurveTrainer(Trainer):
        def evaluate_all(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            metrics = super().evaluate_all(*args, **kwargs)
            value = next(v for k, v in metrics.items() if k.endswith("l2"))
            curve.append([time.perf_counter() - started, float(value)])  # the Trainer averages over samples
            return metrics

    val = DataLoader(Windows(val_samples, task.history), train.batch_size)
    trainer = CurveTrainer(model=model, n_epochs=epochs, device="cpu", eval_interval=1, verbose=False)
    loss = LpLoss(d=task.spatial_dims, p=2)
    trainer.train(
        train, {"val": val}, optimizer, EpochSchedulerStandIn(), training_loss=loss, eval_losses={"l2": loss}
    )


# ---- the record -----------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4g} (1 seed)"
    return f"mean {statistics.mean(values):.4g}, min {min(values):.4g}, max {max(values):.4g}"


def record(
    task: Task, setup: Setup, runs: list[dict[str, Any]], check: float, load: str | None = None
) -> dict[str, Any]:
    mine = [r["test_rel_l2"] for r in runs if r["library"] == "dynaforge"]
    theirs = [r["test_rel_l2"] for r in runs if r["library"] == "neuraloperator"]
    seeds = len(setup.seeds)
    params = {r["library"]: r["parameters"] for r in runs}
    epochs = {lib: [r["epochs"] for r in runs if r["library"] == lib] for lib in params}
    seconds = {lib: [round(r["seconds"]) for r in runs if r["library"] == lib] for lib in params}
    batch = setup.baseline_batch or task.batch_size
    how = "PDEBench's training loop" if through_rollout(task, setup) else "Trainer"
    return {
        "case": f"{task.title}, {setup.budget:g} s budget, one thread, {seeds} seed(s)",
        "baseline": f"neuraloperator 2.0.0 ({how}, AdamW, batch {batch}, cosine fitted to the budget)",
        "metric": "test relative L2 error at the budget (mean over test samples and predicted frames; mean of "
        "seeds)",
        "dynaforge": statistics.mean(mine),
        "baseline_value": statistics.mean(theirs),
        "ratio": statistics.mean(theirs) / statistics.mean(mine),
        "notes": (
            f"dynaforge {spread(mine)} ({task.config.relative_to(ROOT)}); neuraloperator {spread(theirs)}; "
            f"parameters {params}; epochs run {epochs}; wall seconds of each run {seconds} (each library plans its "
            f"epochs from timed steps and again from its first epoch's time, so a run can end a little before or after "
            f"the budget); data and its accuracy check: literature_data.py, "
            f"largest relative L2 difference from a finer solve {check:.1e}. Fewer seeds and a shorter budget "
            f"than the issue's protocol (12 min x 3 seeds) when seeds < 3 or budget < 720 s: what one session's "
            f"CPU allowed. Machine and load: {load or load_note() + '.'}"
        ),
    }


def draw(curves: dict[str, list[dict[str, Any]]], path: Path) -> None:
    import matplotlib  # lazy: only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, len(curves), figsize=(5 * len(curves), 4), squeeze=False)
    colours = {"dynaforge": "tab:blue", "neuraloperator": "tab:orange"}
    for axis, (name, runs) in zip(axes[0], curves.items(), strict=True):
        for run in runs:
            times, values = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
            label = f"{run['library']} (seed {run['seed']}): {run['curve_metric']}"
            axis.plot(times, values, color=colours[run["library"]], alpha=0.8, label=label)
            axis.plot([run["seconds"]], [run["test_rel_l2"]], "o", color=colours[run["library"]])
        axis.set(
            xlabel="wall time (s), one thread", ylabel="validation error (dots: test rel. L2)", yscale="log"
        )
        axis.set_title(textwrap.fill(TASKS[name].title, 60), fontsize=8)
        axis.legend(fontsize=6)
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def merge_records(path: Path, new: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The records already in `path`, a task measured again replaced by its new record."""
    old = json.loads(path.read_text()) if path.exists() else []
    titles = {r["case"].split(", ")[0] for r in new}
    return [r for r in old if r["case"].split(", ")[0] not in titles] + new


ABLATION_NOTES = (
    "one change per row (dynaforge: one switch of the task's config; neuraloperator alone; dynaforge's FNO in "
    "neuraloperator's loop), one thread; each row names its task (burgers when absent), budget (s) and the "
    "machine's load when it ended: the machine is shared with other jobs, so epochs and errors are noisy (one "
    "seed: differences under ~15 % are within seed noise)"
)


def save_row(
    path: Path, task: Task, setup: Setup, name: str, overrides: list[str], run: dict[str, Any]
) -> None:
    """Adds a run to the ablation file `path` (a row of the same task, name, seed and budget is replaced)."""
    saved = json.loads(path.read_text())["runs"] if path.exists() else []
    key = (task.name, name, run["seed"], setup.budget)
    rows = [
        r for r in saved if (r.get("task", "burgers"), r["variant"], r["seed"], r.get("budget", 45.0)) != key
    ]
    row = {"variant": name, "overrides": overrides, "budget": setup.budget, "load": load_note()}
    rows.append(row | {k: v for k, v in run.items() if k != "curve"})
    atomic_write_json(path, {"notes": ABLATION_NOTES, "runs": rows})
    print(
        f"{task.name} {name} seed {run['seed']}: test rel. L2 {run['test_rel_l2']:.4g}, {run['epochs']} epochs"
    )


def ablate(
    task: Task, setup: Setup, fields: np.ndarray, folder: Path, cache: Path, variants: list[str], path: Path
) -> None:
    """dynaforge with each chosen variant of the task's config, rows to the ablation file `path`."""
    for seed in setup.seeds:
        for name, overrides in ABLATIONS.items():
            if not variants or name in variants:
                run = run_dynaforge(task, setup, fields, folder, seed, cache / "ablation", tuple(overrides))
                save_row(path, task, setup, name, overrides, run)


def baseline_rows(task: Task, setup: Setup, fields: np.ndarray, path: Path) -> None:
    """neuraloperator alone at `--baseline-batch`: is a switch that helps dynaforge as good for it?"""
    for seed in setup.seeds:
        run = run_neuraloperator(task, setup, fields, seed)
        save_row(path, task, setup, f"neuraloperator, batch {run['batch']}", [], run)


class DynaforgeFNO(nn.Module):
    """dynaforge's FNO built from a task's config, taking and returning (B, frames, *space) physical fields
    like neuraloperator's (for `--cross`: which half, model or training, decides the difference)."""

    def __init__(self, task: Task) -> None:
        from dynaforge.models.base import ModelShape
        from dynaforge.models.registry import build_model

        super().__init__()
        config = load_config(task.config, [])
        self.net = build_model(config.model, ModelShape(1, task.history, 1, task.spatial_dims))

    def forward(self, x: Tensor, **_: Any) -> Tensor:
        return self.net(ModelInput(frames=x[:, :, None])).frames[:, :, 0]


def cross_rows(task: Task, setup: Setup, fields: np.ndarray, path: Path) -> None:
    """dynaforge's FNO (its config's model, no normalisation) trained by neuraloperator's loop."""
    for seed in setup.seeds:
        run = run_neuraloperator(task, setup, fields, seed, build=lambda task, _: DynaforgeFNO(task))
        name = f"dynaforge's FNO in neuraloperator's loop, batch {run['batch']}"
        save_row(path, task, setup, name, [], run | {"library": "cross"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny data, 1 s budget, to a temporary folder"
    )
    parser.add_argument("--tasks", default=",".join(TASKS), help=f"comma-separated, of {', '.join(TASKS)}")
    parser.add_argument("--budget", type=float, default=180.0, help="seconds of training per run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (the issue asks for 0,1,2)")
    parser.add_argument(
        "--cache",
        type=Path,
        default=None,
        help="data cache (default: dynaforge-literature in the temp folder)",
    )
    parser.add_argument("--data-only", action="store_true", help="make the data and stop")
    parser.add_argument("--out", type=Path, default=None, help="records (default results/literature.json)")
    parser.add_argument(
        "--variants", default="", help="--ablate: ABLATIONS names separated by semicolons (default all)"
    )
    parser.add_argument(
        "--baseline-batch", type=int, default=None, help="neuraloperator's batch (default: the task's)"
    )
    parser.add_argument(
        "--baseline-only",
        action="store_true",
        help="neuraloperator only, its rows added to results/literature_ablation.json (beside --out)",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="dynaforge only: the ABLATIONS, to results/literature_ablation.json (beside --out)",
    )
    parser.add_argument(
        "--cross",
        action="store_true",
        help="dynaforge's FNO trained by neuraloperator's loop, rows to results/literature_ablation.json (beside --out)",
    )
    parser.add_argument(
        "--full-rollout",
        action="store_true",
        help="autoregressive task: both libraries train through the whole rollout (PDEBench's FNO loop)",
    )
    parser.add_argument(
        "--rewrite-records",
        action="store_true",
        help="rebuild the records and the figure from results/literature.curves.json (no training)",
    )
    args = parser.parse_args()
    if args.quick:
        args.budget = 1.0
        args.seeds = "0"
    args.out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    args.cache = args.cache or Path(tempfile.gettempdir()) / (
        "dynaforge-literature-quick" if args.quick else "dynaforge-literature"
    )
    # dynaforge's engine lets the C allocator keep freed memory (dynaforge/allocator.py), process-wide: set
    # from the start, so that both libraries run under the same allocator whichever trains first.
    keep_freed_memory()
    torch.set_num_threads(1)
    setup = Setup(
        budget=args.budget,
        seeds=tuple(int(s) for s in args.seeds.split(",")),
        baseline_batch=args.baseline_batch,
        full_rollout=args.full_rollout,
        quick=args.quick,
    )
    unknown = [name for name in args.tasks.split(",") if name.strip() not in TASKS]
    if unknown:
        parser.error(f"--tasks: unknown {', '.join(unknown)}; choose from {', '.join(TASKS)}")
    tasks = [TASKS[name.strip()] for name in args.tasks.split(",")]
    curves_path = args.out.with_name(args.out.stem + ".curves.json")
    ablation_path = args.out.with_name(args.out.stem + "_ablation.json")
    figure = FIGURE if args.out == RESULTS else args.out.with_suffix(".png")  # a trial run keeps docs/ as is
    if args.rewrite_records and not curves_path.exists():
        parser.error(f"--rewrite-records: {curves_path} does not exist; run the benchmark first")
    curves = json.loads(curves_path.read_text()).get("tasks", {}) if curves_path.exists() else {}
    if args.rewrite_records:
        saved = json.loads(curves_path.read_text())
        setup.budget = saved["budget"]
        for name, runs in saved["tasks"].items():
            setup.seeds = tuple(r["seed"] for r in runs if r["library"] == "dynaforge")
            old = [r for r in json.loads(args.out.read_text()) if r["case"].startswith(TASKS[name].title)]
            load = old[0]["notes"].split("Machine and load: ")[-1] if old else None  # when it ran
            new = record(TASKS[name], setup, runs, task_data(name, args.cache, args.quick)["check"], load)
            atomic_write_json(args.out, merge_records(args.out, [new]))
        draw({name: saved["tasks"][name] for name in TASKS if name in saved["tasks"]}, figure)
        return
    for task in tasks:
        data = task_data(task.name, args.cache, args.quick)
        folder = dataset_folder(task.name, data["fields"], args.cache, args.quick)
        print(f"{task.name}: dataset folder {folder}; accuracy check {data['check']:.2e}")
        if args.data_only:
            continue
        if args.baseline_only:
            baseline_rows(task, setup, data["fields"], ablation_path)
            continue
        if args.cross:
            cross_rows(task, setup, data["fields"], ablation_path)
            continue
        if args.ablate:
            variants = [v.strip() for v in args.variants.split(";") if v.strip()]
            ablate(task, setup, data["fields"], folder, args.cache, variants, ablation_path)
            continue
        runs = []
        for seed in setup.seeds:  # the libraries take turns, so that both see the same machine load
            runs.append(
                run_dynaforge(task, setup, data["fields"], folder, seed, args.cache / f"run-{task.name}")
            )
            runs.append(run_neuraloperator(task, setup, data["fields"], seed))
            for run in runs[-2:]:
                print(
                    f"{task.name} {run['library']:>15} seed {seed}: test rel. L2 {run['test_rel_l2']:.4g} after "
                    f"{run['seconds']:.0f} s, {run['epochs']} epochs, {run['parameters']} parameters"
                )
        new = record(task, setup, runs, data["check"])
        atomic_write_json(args.out, merge_records(args.out, [new]))
        curves[task.name] = runs
        atomic_write_json(curves_path, {"budget": setup.budget, "tasks": curves})
        draw({name: curves[name] for name in TASKS if name in curves}, figure)
        print(json.dumps(new, indent=2))


if __name__ == "__main__":
    main()
