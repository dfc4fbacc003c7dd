"""Tasks from the literature, trained by dynaforge and by neuraloperator for the same wall-clock budget.

Task `burgers` (Li et al., "Fourier Neural Operator for Parametric PDEs", ICLR 2021, section 5.1): learn the
map u(x, 0) -> u(x, 1) of viscous Burgers u_t + u u_x = nu u_xx, nu = 0.1, on the periodic unit interval,
N = 1024 points. Initial fields come from the Gaussian random field N(0, 625 (-Laplacian + 25 I)^-2): on the
real Fourier basis {sqrt(2) cos(2 pi k x), sqrt(2) sin(2 pi k x)}, k = 1..N/2 - 1, independent N(0, 1)
coefficients times sqrt(625) / (4 pi^2 k^2 + 25); the k = 0 mode (the mean, which Burgers conserves) is left
out, as in the paper's data generator (so u(1) is ~50 times smaller than u(0)). 1000 training, 100
validation and 200 test pairs, one numpy generator per sample (seed = the sample index).

Data are made by dynaforge's Burgers solver (`dynaforge.systems.pde.burgers`, ETDRK4, 2/3 dealiasing,
float64), dt = `Setup.dt`, and written as a PDEBench-layout file converted with `dynaforge convert --splits
1000,100,200` (counts, in PDEBench's order: test first). Accuracy check, stated in the record's notes: the
first 16 samples solved again at twice the resolution (N = 2048, the same Fourier modes) with a quarter of
the time step; the largest relative L2 difference of u(1) between the two solutions on the N = 1024 points.

Models, the same size: the paper's FNO, 16 Fourier modes kept, width 64, 4 layers, linear lifting of (u, x),
projection 64 -> 128 -> 1 with GELU, linear skips. dynaforge: `configs/fno_paper_burgers.yaml` (its
defaults otherwise: AdamW lr 1e-3, weight decay 1e-4, 5 % warmup then cosine to 0 per step, gradient
clipping at 1, MSE on fields normalised with the train mean and std), trained with `train.time_budget`.
neuraloperator 2.0.0: `neuralop.models.FNO` with n_modes = (30,) (it keeps n // 2 + 1 = 16 rfft modes),
positional embedding `grid`, `lifting_channel_ratio=0`, `projection_channel_ratio=2`, no channel MLP,
linear skips; its `Trainer` with its relative L2 loss (`LpLoss`), AdamW lr 1e-3, weight decay 1e-4 on weights
of 2 or more dimensions, on physical fields (as its users train this task), and a cosine schedule fitted to
the budget: a few steps and one validation are timed on a copy of the model first, the epochs that fit in
the rest of the budget are run, and the cosine goes from the peak to 0 over their optimiser steps. Both
validate on the 100 validation pairs every epoch (inside their clocks) and run on one thread.

The figure: test relative L2 error ||pred - u(1)|| / ||u(1)|| per sample, mean over the 200 test pairs, in
physical units, after the budget; `ratio` = neuraloperator's error / dynaforge's (> 1: dynaforge better),
mean of the seeds. Validation error against wall time goes to results/literature.curves.json and
docs/literature_burgers.png.

    python benchmarks/literature.py --budget 720 --seeds 0,1,2      # the issue's protocol (about 75 min)
    python benchmarks/literature.py --budget 180 --seeds 0          # what one session's CPU affords
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn
from torch.utils.data import DataLoader, Dataset

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.config.base import Range
from dynaforge.config.systems import BurgersConfig
from dynaforge.metrics.fields import relative_l2_per_frame
from dynaforge.models import ModelInput
from dynaforge.store.convert import convert
from dynaforge.store.pdebench import write_tensor_file
from dynaforge.systems.pde.burgers import Burgers
from dynaforge.train import window_engine
from dynaforge.train.log import read_metrics
from machine import load_note

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
RESULTS = HERE / "results" / "literature.json"
CONFIG = ROOT / "configs" / "fno_paper_burgers.yaml"
FIGURE = ROOT / "docs" / "literature_burgers.png"


@dataclass
class Setup:
    budget: float = 180.0
    seeds: tuple[int, ...] = (0,)
    points: int = 1024
    viscosity: float = 0.1
    dt: float = 1e-3
    n_train: int = 1000
    n_val: int = 100
    n_test: int = 200
    batch_size: int = 20
    lr: float = 1e-3
    weight_decay: float = 1e-4
    width: int = 64
    modes: int = 16
    layers: int = 4


# ---- data ----------------------------------------------------------------------------------------------


def paper_grf(points: int, rng: np.random.Generator) -> np.ndarray:
    """One zero-mean draw of N(0, 625 (-Laplacian + 25 I)^-2) on the periodic unit interval (module docstring)."""
    k = np.arange(1, points // 2)
    scale = math.sqrt(2.0) * 25.0 / (4.0 * math.pi**2 * k**2 + 25.0)
    a, b = rng.standard_normal(k.size), rng.standard_normal(k.size)
    x = np.arange(points) / points
    phase = 2.0 * math.pi * np.outer(k, x)
    return (scale * a) @ np.cos(phase) + (scale * b) @ np.sin(phase)


def solve(initial: np.ndarray, setup: Setup, refine: int = 1) -> np.ndarray:
    """u(1) from u(0) (n, N) with dynaforge's Burgers solver; `refine` doubles the grid and quarters dt."""
    points = initial.shape[1] * (2 if refine > 1 else 1)
    dt = setup.dt / (4 if refine > 1 else 1)
    steps = round(1.0 / dt)
    config = BurgersConfig(
        resolution=points,
        viscosity=Range(setup.viscosity, setup.viscosity),
        dt=dt,
        steps=steps,
        save_every=steps,
        dtype="float64",
    )
    if refine > 1:  # the same Fourier modes on twice the points
        spectrum = np.fft.rfft(initial, axis=1)
        padded = np.zeros((initial.shape[0], points // 2 + 1), dtype=complex)
        padded[:, : spectrum.shape[1] - 1] = spectrum[:, :-1] * 2
        initial = np.fft.irfft(padded, n=points, axis=1)
    u0 = torch.from_numpy(initial)[:, None, :]
    params = torch.tensor([[1.0, setup.viscosity]], dtype=torch.float64).expand(initial.shape[0], 2)  # L, nu
    return Burgers(config).rollout(u0, params).fields[:, -1, 0].numpy()


def burgers_data(setup: Setup, cache: Path) -> dict[str, Any]:
    """u0, u1 of every sample (test, val, train, PDEBench's order) and the accuracy check, cached."""
    arrays = cache / "burgers_pairs.npz"
    if arrays.exists():
        saved = np.load(arrays)
        return {"u0": saved["u0"], "u1": saved["u1"], "check": float(saved["check"])}
    n = setup.n_test + setup.n_val + setup.n_train
    u0 = np.stack([paper_grf(setup.points, np.random.default_rng(i)) for i in range(n)])
    began = time.perf_counter()
    u1 = solve(u0, setup)
    print(f"solved {n} samples in {time.perf_counter() - began:.0f} s")
    fine = solve(u0[:16], setup, refine=2)[:, ::2]
    check = float(np.max(np.linalg.norm(u1[:16] - fine, axis=1) / np.linalg.norm(fine, axis=1)))
    print(f"accuracy check: largest rel. L2 difference from N=2048, dt/4: {check:.2e}")
    cache.mkdir(parents=True, exist_ok=True)
    np.savez(arrays, u0=u0.astype(np.float32), u1=u1.astype(np.float32), check=check)
    return {"u0": u0.astype(np.float32), "u1": u1.astype(np.float32), "check": check}


def dataset_folder(setup: Setup, data: dict[str, Any], cache: Path) -> Path:
    """The pairs as a PDEBench-layout file, converted into a dataset folder with split counts."""
    folder = cache / "burgers_folder"
    if (folder / "manifest.json").exists():
        return folder
    file = cache / "1D_Burgers_fno_paper.hdf5"
    fields = np.stack([data["u0"], data["u1"]], axis=1)  # (n, 2 frames, N)
    write_tensor_file(file, fields, np.arange(setup.points) / setup.points, np.array([0.0, 1.0, 2.0]))
    convert(file, folder, fractions=(setup.n_train, setup.n_val, setup.n_test))
    return folder


def split(data: dict[str, Any], setup: Setup, name: str) -> tuple[Tensor, Tensor]:
    """(u0, u1) of a split as (n, 1, N) float32 tensors (test first, then val, then train)."""
    starts = {"test": 0, "val": setup.n_test, "train": setup.n_test + setup.n_val}
    sizes = {"test": setup.n_test, "val": setup.n_val, "train": setup.n_train}
    rows = slice(starts[name], starts[name] + sizes[name])
    return torch.from_numpy(data["u0"][rows])[:, None], torch.from_numpy(data["u1"][rows])[:, None]


def test_error(predict: Any, data: dict[str, Any], setup: Setup) -> float:
    """Mean over the test pairs of ||pred - u(1)|| / ||u(1)|| in physical units."""
    u0, u1 = split(data, setup, "test")
    with torch.inference_mode():
        predicted = torch.cat([predict(u0[i : i + 50]) for i in range(0, len(u0), 50)])
    return float(relative_l2_per_frame(predicted[:, None], u1[:, None]).mean())


# ---- dynaforge -----------------------------------------------------------------------------------------


ABLATIONS: dict[str, list[str]] = {
    "config as given": [],
    "relative L2 loss": ["train.loss=relative_l2"],
    "relative L2, no clipping": ["train.loss=relative_l2", "train.grad_clip=null"],
    "relative L2, no warmup": ["train.loss=relative_l2", "train.schedule.warmup_fraction=0"],
    "relative L2, no coordinates": ["train.loss=relative_l2", "model.coordinates=false"],
    "relative L2, residual": ["train.loss=relative_l2", "model.residual=true"],
    "no weight decay": ["train.weight_decay=0"],
    "no clipping": ["train.grad_clip=null"],
    "no warmup": ["train.schedule.warmup_fraction=0"],
    "lr 3e-3": ["train.lr=0.003"],
    "batch 10": ["data.batch_size=10"],
    "projection 256": ["model.projection=256"],
    "normal spectral init": ["model.spectral_init=normal"],
    "batch 5": ["data.batch_size=5"],
    "batch 10 no clipping": ["data.batch_size=10", "train.grad_clip=null"],
    "batch 5 no clipping": ["data.batch_size=5", "train.grad_clip=null"],
    "physical units (no normalisation)": ["data.normalize=none"],
}
"""`--ablate`: one switch changed from configs/fno_paper_burgers.yaml at a time (dynaforge only)."""


def run_dynaforge(
    setup: Setup, data: dict[str, Any], folder: Path, seed: int, out: Path, extra: tuple[str, ...] = ()
) -> dict[str, Any]:
    overrides = [f"train.time_budget={setup.budget}", f"train.seed={seed}", *extra]
    engine = window_engine(load_config(CONFIG, overrides), folder, out, progress=False, overwrite=True)
    summary = engine.fit()
    model, normalizer = engine.model.eval(), engine.task.normalizer

    def predict(u0: Tensor) -> Tensor:
        frames = normalizer.physical_to_normalized(u0[:, None], spatial_dims=1)
        return normalizer.normalized_to_physical(model(ModelInput(frames=frames)).frames, 1)[:, 0]

    records = read_metrics(out / "metrics.jsonl")
    epochs = [r for r in records if r["kind"] == "epoch"]
    return {
        "library": "dynaforge",
        "seed": seed,
        "seconds": summary.seconds,
        "epochs": len(epochs),
        "parameters": real_parameters(model),
        "test_rel_l2": test_error(predict, data, setup),
        "curve": [[r["elapsed"], r["val_loss"]] for r in epochs],
        "curve_metric": "validation loss (MSE of normalised fields)",
    }


def real_parameters(model: nn.Module) -> int:
    """Real numbers in the weights (neuraloperator stores spectral weights complex: two reals each)."""
    return sum(p.numel() * (2 if p.is_complex() else 1) for p in model.parameters())


# ---- neuraloperator ------------------------------------------------------------------------------------


class Pairs(Dataset[dict[str, Tensor]]):
    def __init__(self, u0: Tensor, u1: Tensor) -> None:
        self.u0, self.u1 = u0, u1

    def __len__(self) -> int:
        return len(self.u0)

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"x": self.u0[i], "y": self.u1[i]}


def neuraloperator_fno(setup: Setup) -> nn.Module:
    from neuralop.models import FNO

    return FNO(
        n_modes=(2 * setup.modes - 2,),  # neuraloperator keeps n_modes // 2 + 1 rfft modes on the last axis
        in_channels=1,
        out_channels=1,
        hidden_channels=setup.width,
        n_layers=setup.layers,
        lifting_channel_ratio=0,
        projection_channel_ratio=2,
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


def relative_l2_sum(predicted: Tensor, target: Tensor) -> Tensor:
    return relative_l2_per_frame(predicted[:, None], target[:, None]).sum()


def probe_seconds(model: nn.Module, setup: Setup, train: DataLoader, val: DataLoader) -> tuple[float, float]:
    """Seconds per optimiser step (median of 5 after one) and per validation, on a throwaway copy."""
    model, times = copy.deepcopy(model), []
    optimizer = adamw(model, setup)
    for _, batch in zip(range(6), train, strict=False):
        began = time.perf_counter()
        optimizer.zero_grad()
        relative_l2_sum(model(batch["x"]), batch["y"]).backward()
        optimizer.step()
        times.append(time.perf_counter() - began)
    began = time.perf_counter()
    with torch.inference_mode():
        for batch in val:
            model(batch["x"])
    return statistics.median(times[1:]), time.perf_counter() - began


class EpochSchedulerStandIn:
    """Takes the Trainer's per-epoch `scheduler.step()`; the cosine moves per optimiser step instead."""

    def step(self, *args: Any) -> None:
        pass


def run_neuraloperator(setup: Setup, data: dict[str, Any], seed: int) -> dict[str, Any]:
    from neuralop.losses import LpLoss
    from neuralop.training import Trainer

    started = time.perf_counter()
    curve: list[list[float]] = []

    class CurveTrainer(Trainer):
        def evaluate_all(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            metrics = super().evaluate_all(*args, **kwargs)
            value = next(v for k, v in metrics.items() if k.endswith("l2"))
            curve.append([time.perf_counter() - started, float(value)])  # the Trainer averages over samples
            return metrics

    torch.manual_seed(seed)
    model = neuraloperator_fno(setup)
    generator = torch.Generator().manual_seed(seed)
    train = DataLoader(
        Pairs(*split(data, setup, "train")), setup.batch_size, shuffle=True, generator=generator
    )
    val = DataLoader(Pairs(*split(data, setup, "val")), setup.batch_size)
    step, validation = probe_seconds(model, setup, train, val)
    left = setup.budget - (time.perf_counter() - started)
    epochs = max(1, math.floor(left / (len(train) * step + validation)))
    optimizer = adamw(model, setup)
    total = epochs * len(train)
    cosine = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: 0.5 * (1.0 + math.cos(math.pi * min(s / total, 1.0)))
    )
    optimizer.register_step_post_hook(lambda *_: cosine.step())
    trainer = CurveTrainer(model=model, n_epochs=epochs, device="cpu", eval_interval=1, verbose=False)
    loss = LpLoss(d=1, p=2)
    trainer.train(
        train, {"val": val}, optimizer, EpochSchedulerStandIn(), training_loss=loss, eval_losses={"l2": loss}
    )
    seconds = time.perf_counter() - started
    model.eval()
    return {
        "library": "neuraloperator",
        "seed": seed,
        "seconds": seconds,
        "epochs": epochs,
        "parameters": real_parameters(model),
        "test_rel_l2": test_error(lambda u0: model(u0), data, setup),
        "curve": curve,
        "curve_metric": "validation relative L2 (physical units)",
    }


# ---- the record -----------------------------------------------------------------------------------------


def spread(values: list[float]) -> str:
    if len(values) == 1:
        return f"{values[0]:.4g} (1 seed)"
    return f"mean {statistics.mean(values):.4g}, min {min(values):.4g}, max {max(values):.4g}"


def record(setup: Setup, runs: list[dict[str, Any]], check: float) -> dict[str, Any]:
    mine = [r["test_rel_l2"] for r in runs if r["library"] == "dynaforge"]
    theirs = [r["test_rel_l2"] for r in runs if r["library"] == "neuraloperator"]
    seeds = len(setup.seeds)
    params = {r["library"]: r["parameters"] for r in runs}
    epochs = {lib: [r["epochs"] for r in runs if r["library"] == lib] for lib in params}
    return {
        "case": f"FNO paper 1D Burgers (nu=0.1, N=1024, 1000/200 pairs), {setup.budget:g} s budget, "
        f"one thread, {seeds} seed(s)",
        "baseline": f"neuraloperator 2.0.0 (Trainer, AdamW, batch {setup.batch_size}, cosine fitted to the budget)",
        "metric": "test relative L2 error at the budget (mean over 200 test pairs; mean of seeds)",
        "dynaforge": statistics.mean(mine),
        "baseline_value": statistics.mean(theirs),
        "ratio": statistics.mean(theirs) / statistics.mean(mine),
        "notes": (
            f"dynaforge {spread(mine)}; neuraloperator {spread(theirs)}; parameters {params}; epochs run "
            f"{epochs}; data by dynaforge's Burgers solver (ETDRK4, float64, dt={setup.dt:g}, N=1024), accuracy "
            f"check: largest rel. L2 difference of u(1) from a solve at N=2048 with dt/4, over 16 samples, "
            f"{check:.1e}. Fewer seeds and a shorter budget than the issue's protocol (12 min x 3 seeds) when "
            f"seeds < 3 or budget < 720 s: what one session's CPU allowed. Timings on a machine shared with "
            f"other jobs: {load_note()}."
        ),
    }


def draw(runs: list[dict[str, Any]], path: Path) -> None:
    import matplotlib  # lazy: only for the figure

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(6, 4))
    for run in runs:
        times, values = zip(*run["curve"], strict=True) if run["curve"] else ((), ())
        axes.plot(times, values, label=f"{run['library']} (seed {run['seed']}): {run['curve_metric']}")
    axes.set(xlabel="wall time (s), one thread", ylabel="validation error", yscale="log")
    axes.set_title("FNO paper Burgers: validation error against wall time")
    axes.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=120)


def ablate(setup: Setup, data: dict[str, Any], folder: Path, cache: Path, variants: list[str]) -> None:
    """Runs the chosen variants and merges them into the record (a variant measured again at the same
    budget and seed replaces its old row; the rest are kept, each row with its own budget and load)."""
    path = RESULTS.with_name("literature_ablation.json")
    old = json.loads(path.read_text())["runs"] if path.exists() else []
    rows = []
    for seed in setup.seeds:
        for name, overrides in ABLATIONS.items():
            if variants and name not in variants:
                continue
            run = run_dynaforge(setup, data, folder, seed, cache / "ablation", tuple(overrides))
            row = {"variant": name, "overrides": overrides, "budget": setup.budget, "load": load_note()}
            rows.append(row | {k: v for k, v in run.items() if k != "curve"})
            print(f"{name:>24} seed {seed}: test rel. L2 {run['test_rel_l2']:.4g}, {run['epochs']} epochs")
            key = (name, seed, setup.budget)
            old = [r for r in old if (r["variant"], r["seed"], r.get("budget", 45.0)) != key]
            notes = (
                "dynaforge only, one switch of configs/fno_paper_burgers.yaml changed per row, one thread; each row "
                "names its budget (s) and the machine's load when it ended: the machine is shared with other jobs, "
                "so epochs and errors are noisy (one seed: differences under ~15 % are within seed noise)"
            )
            atomic_write_json(path, {"notes": notes, "runs": old + rows})


def baseline_rows(setup: Setup, data: dict[str, Any]) -> None:
    """neuraloperator alone at `setup.batch_size`: is a switch that helps dynaforge as good for it?"""
    path = RESULTS.with_name("literature_ablation.json")
    record = json.loads(path.read_text()) if path.exists() else {"notes": "", "runs": []}
    for seed in setup.seeds:
        run = run_neuraloperator(setup, data, seed)
        name = f"neuraloperator, batch {setup.batch_size}"
        print(f"{name:>24} seed {seed}: test rel. L2 {run['test_rel_l2']:.4g}, {run['epochs']} epochs")
        key = (name, seed, setup.budget)
        record["runs"] = [
            r for r in record["runs"] if (r["variant"], r["seed"], r.get("budget", 45.0)) != key
        ]
        row = {"variant": name, "overrides": [], "budget": setup.budget, "load": load_note()}
        record["runs"].append(row | {k: v for k, v in run.items() if k != "curve"})
        atomic_write_json(path, record)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget", type=float, default=180.0, help="seconds of training per run")
    parser.add_argument("--seeds", default="0", help="comma-separated seeds (the issue asks for 0,1,2)")
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "dynaforge-literature")
    parser.add_argument("--data-only", action="store_true", help="make the data and stop")
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument(
        "--variants", default="", help="--ablate: ABLATIONS names separated by semicolons (default all)"
    )
    parser.add_argument("--baseline-batch", type=int, default=20, help="neuraloperator's batch size")
    parser.add_argument(
        "--baseline-only",
        action="store_true",
        help="neuraloperator only (at --baseline-batch), its rows added to results/literature_ablation.json",
    )
    parser.add_argument(
        "--ablate",
        action="store_true",
        help="dynaforge only: the ABLATIONS, to results/literature_ablation.json",
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    setup = Setup(
        budget=args.budget, seeds=tuple(int(s) for s in args.seeds.split(",")), batch_size=args.baseline_batch
    )
    data = burgers_data(setup, args.cache)
    folder = dataset_folder(setup, data, args.cache)
    print(f"dataset folder {folder}; accuracy check {data['check']:.2e}")
    if args.data_only:
        return
    if args.baseline_only:
        baseline_rows(setup, data)
        return
    if args.ablate:
        ablate(setup, data, folder, args.cache, [v.strip() for v in args.variants.split(";") if v.strip()])
        return
    runs = []
    for seed in setup.seeds:  # the libraries take turns, so that both see the same machine load
        runs.append(run_dynaforge(setup, data, folder, seed, args.cache / f"run-{seed}"))
        runs.append(run_neuraloperator(setup, data, seed))
        for run in runs[-2:]:
            print(
                f"{run['library']:>15} seed {seed}: test rel. L2 {run['test_rel_l2']:.4g} after "
                f"{run['seconds']:.0f} s, {run['epochs']} epochs, {run['parameters']} parameters"
            )
    atomic_write_json(args.out, [record(setup, runs, data["check"])])
    curves = {"setup": asdict(setup), "runs": runs}
    atomic_write_json(args.out.with_name(args.out.stem + ".curves.json"), curves)
    draw(runs, FIGURE)
    print(json.dumps(record(setup, runs, data["check"]), indent=2))


if __name__ == "__main__":
    main()
