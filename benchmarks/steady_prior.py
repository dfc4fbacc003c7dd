"""Does the latent stack's steady prior earn its place? The statistics of long rollouts past the correlation
time on Kuramoto-Sivashinsky with a varying domain length (issue 38, item 6).

The question: a user wants the energy spectrum of the attractor for a parameter (here the domain length L)
from the trained stack. Three answers are compared against the truth, for each test trajectory:
- `prior`: the stack WITH its steady prior (stage `steady_prior`): SAMPLES prior draws given the
  trajectory's parameters, their mean energy spectrum;
- `rollout`: the stack WITHOUT it: the operator + S-step corrector rolled out from true frames past the
  transient, the mean spectrum of rollout steps 200-400 (well past the correlation time: the rollout no
  longer follows the truth, only its statistics can be right); `operator`: the operator alone, the same;
- `baseline`: the mean-spectrum baseline: the training split's mean spectrum over the same frames (one
  spectrum for every test trajectory: it ignores the parameters); `neighbours`: a parameter-aware baseline
  with nothing learned, the mean spectrum of the NEIGHBOURS training trajectories nearest in L.
The truth: each test trajectory's own mean spectrum over the same frames (steps 200-400 of the rollout).
The score: `dynaforge.metrics.spectra.spectrum_distance`, the mean |log10 E_est(k) - log10 E_true(k)| over
energetic shells k >= 1 (shells in cycles per domain, so the spectrum's peak moves with L), per test
trajectory, then the mean over trajectories with its standard error. `floor`: the same distance between the
two halves (steps 200-300 and 300-400) of each true trajectory: how far a finite-time average of the truth
itself lies from another, the best any estimate can be expected to do.

Data (dynaforge's generator): u_t + u u_x + u_xx + u_xxxx = 0, periodic, L ~ U(57.6, 70.4) per trajectory
(configs/ks_long_rollouts.yaml's range, PDE-Refiner's 0.9-1.1 x 64), 128 points (the preset's 256 halved:
dx = 0.5, the energetic shells k <= ~20 are resolved), ETDRK4 with dt 0.05, frames every 0.5 time units
(the preset's 0.2 x 2.5, so that 400 steps span 200 time units at the cost of 400 model calls), 483 frames:
80 frames (t = 40) of burn-in, 2 input frames, 400 rollout steps (the last 201 frames are steps 200-400).
Splits: 32 / 8 / 16 trajectories (train / val / test). The stack: latent operator (width 32, patch 4, 2
blocks), S = 8 corrector (interval 1), steady prior trained on each training trajectory's last 201 frames
(steps 200-400's frames: the prior learns exactly the statistics it is scored on). The distilled student is
not trained (it only speeds the corrector up). One training seed; sizes in SIZES.

Run: `.venv/bin/python benchmarks/steady_prior.py [--quick] [--work DIR]` (`--work` keeps data and stack:
a rerun only rescores). Writes benchmarks/results/steady_prior.json (ratio > 1: the first-named estimate
is closer to the truth). `--quick` is the smoke run (`make bench-smoke`): tiny sizes, every path runs,
written to a temporary folder, not a figure.
"""

from __future__ import annotations

import argparse
import json
import math
import tempfile
import time
from pathlib import Path
from typing import Any, NamedTuple

import torch
import yaml

from dynaforge.atomic import atomic_write_json
from dynaforge.config import Config, config_from_dict, load_config
from dynaforge.generate import generate
from dynaforge.metrics.spectra import energy_spectrum, spectrum_distance
from dynaforge.models.flow import sample
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import LatentStack, load_stack, predictor_corrector_rollout
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train.stages import run_stages
from machine import load_note
from smoke import quick_path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results" / "steady_prior.json"
STAGES = ("operator", "diffusion_residual", "steady_prior")
NEIGHBOURS = 4
"""Training trajectories (nearest in parameters) the parameter-aware baseline averages."""


class Sizes(NamedTuple):
    n_train: int
    n_val: int
    n_test: int
    burn_in: int
    """Stored frames before the rollout's input frames."""
    rollout: int
    """Rollout steps (model steps = stored frames: stride 1)."""
    first: int
    """First scored rollout step (1-based); the scored steps run to the last."""
    operator_epochs: int
    corrector_epochs: int
    prior_epochs: int
    samples: int
    """Prior draws per test trajectory."""
    val_windows: int


SIZES = {
    "full": Sizes(32, 8, 16, 80, 400, 200, 4, 2, 30, 201, 256),
    "quick": Sizes(2, 2, 2, 4, 8, 4, 1, 1, 1, 5, 8),
}


def config_of(size: Sizes, seed: int = 0) -> Config:
    frames = size.burn_in + 2 + size.rollout  # the input frames, then one stored frame per rollout step
    preset = yaml.safe_load((ROOT / "configs" / "ks_long_rollouts.yaml").read_text())
    preset["model"] = {"name": "latent"}  # the preset's FNO section gives way to the stack's operator
    return load_config(
        config_from_dict(preset),
        [
            "system.resolution=128",
            "system.dt=0.05",
            "system.save_every=10",
            f"system.steps={(frames - 1) * 10}",
            f"dataset.seed={seed}",
            f"train.seed={seed}",
            f"dataset.n_train={size.n_train}",
            f"dataset.n_val={size.n_val}",
            f"dataset.n_test={size.n_test}",
            "dataset.shard_size=64",
            "dataset.batch_size=64",
            "data.history=2",
            "data.horizon=1",
            "data.stride=1",
            "data.batch_size=32",
            "model.name=latent",
            "model.width=32",
            "model.stem=16",
            "model.patch=4",
            "model.depth=2",
            "model.heads=2",
            "model.merge_levels=1",
            "train.epochs=1",
            "train.log_every=100",
            "train.device=cpu",
            f"stages.val_windows={size.val_windows}",
            f"stages.operator.epochs={size.operator_epochs}",
            "stages.operator.lr=0.003",
            "stages.operator.rollout_steps=2",
            "stages.operator.val_rollout=10",
            f"stages.diffusion_residual.epochs={size.corrector_epochs}",
            "stages.diffusion_residual.lr=0.002",
            "stages.diffusion_residual.sampler_steps=8",
            f"stages.steady_prior.epochs={size.prior_epochs}",
            "stages.steady_prior.lr=0.002",
            f"stages.steady_prior.last_frames={size.rollout - size.first + 1}",
        ],
    )


def spectra_of(fields: torch.Tensor) -> torch.Tensor:
    """(N, T, C, X) physical fields -> (N, shells): each trajectory's spectrum averaged over frames and
    channels."""
    return energy_spectrum(fields.float()).mean(dim=(1, 2))


def distances(estimate: torch.Tensor, truth: torch.Tensor) -> list[float]:
    """Per trajectory: spectrum_distance of estimate (N, shells) or (shells,) to truth (N, shells)."""
    rows = estimate if estimate.ndim == 2 else estimate.expand_as(truth)
    return [spectrum_distance(rows[n], truth[n]) for n in range(truth.shape[0])]


def mean_and_stderr(values: list[float]) -> tuple[float, float]:
    n = len(values)
    mean = sum(values) / n
    if n < 2:
        return mean, 0.0
    return mean, math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def rollout_spectra(
    stack: LatentStack, corrector: bool, inputs: torch.Tensor, params: torch.Tensor, steps: int, first: int
) -> torch.Tensor:
    conditions = Conditions(
        dt=torch.full((inputs.shape[0],), stack.dt, dtype=torch.float32),
        params=stack.parameters.normalize(params.numpy()),
    )
    normalized = stack.normalizer.physical_to_normalized(inputs, 1)
    generator = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        predicted = predictor_corrector_rollout(
            stack.operator,
            stack.corrector if corrector else None,
            normalized,
            conditions,
            steps,
            generator=generator,
        )
    physical = stack.normalizer.normalized_to_physical(predicted, 1)
    return spectra_of(physical[:, first - 1 :])


def prior_spectra(stack: LatentStack, params: torch.Tensor, like: torch.Tensor, samples: int) -> torch.Tensor:
    """(N, shells): the mean spectrum of `samples` prior draws given each trajectory's parameters."""
    assert stack.steady_prior is not None
    generator = torch.Generator().manual_seed(0)
    rows = []
    normalized = stack.parameters.normalize(params.numpy())
    for n in range(params.shape[0]):
        shape = (samples, *like.shape[2:])  # (samples, C, X)
        noise = torch.randn(shape, generator=generator, dtype=torch.float32)
        empty = torch.zeros((samples, 0, *shape[1:]), dtype=torch.float32)
        condition = normalized[n : n + 1].expand(samples, -1)
        with torch.inference_mode():
            drawn = sample(stack.steady_prior, noise, empty, condition, stack.prior_steps)
        physical = stack.normalizer.normalized_to_physical(drawn[None], 1)  # (1, samples, C, X)
        rows.append(spectra_of(physical)[0])
    return torch.stack(rows)


def nearest_spectra(
    train_spectra: torch.Tensor, train_params: torch.Tensor, params: torch.Tensor
) -> torch.Tensor:
    """(N, shells): for each test trajectory, the mean spectrum of the NEIGHBOURS training trajectories
    nearest in (normalised) parameters: a parameter-aware baseline with nothing learned."""
    scale = train_params.std(dim=0).clamp_min(1e-12)
    distance = torch.cdist(params.double() / scale, train_params.double() / scale)
    nearest = distance.topk(min(NEIGHBOURS, train_params.shape[0]), dim=1, largest=False).indices
    return train_spectra[nearest].mean(dim=1)


def record(
    case: str, baseline: str, ours: list[float], theirs: list[float], steps: str, notes: str
) -> dict[str, Any]:
    mine, mine_se = mean_and_stderr(ours)
    other, other_se = mean_and_stderr(theirs)
    wins = sum(a < b for a, b in zip(ours, theirs))
    return {
        "case": case,
        "baseline": baseline,
        "metric": f"log10 energy-spectrum distance to each test trajectory's rollout steps {steps} (lower is "
        "better)",
        "dynaforge": mine,
        "baseline_value": other,
        "ratio": other / mine if mine > 0 else None,
        "notes": f"{notes}; s.e. {mine_se:.3f} / {other_se:.3f} over {len(ours)} test trajectories; closer "
        f"on {wins} of {len(ours)}",
    }


def run(work: Path, quick: bool, seed: int = 0) -> list[dict[str, Any]]:
    size = SIZES["quick" if quick else "full"]
    config = config_of(size, seed)
    data, stack_root = work / "data", work / "stack"
    started = time.perf_counter()
    generate(config, data, progress=False)
    generation = time.perf_counter() - started
    for stage in STAGES:
        status = run_stages(config, data, stack_root, stage=stage, progress=False)["stages"]
    stack = load_stack(stack_root)
    folder = DatasetFolder(data)
    test, train = folder.read_split("test"), folder.read_split("train")
    frames = fields_from_disk(test.fields)[:, size.burn_in :]  # (N, 2 + rollout, C, X)
    inputs, truth = frames[:, :2], frames[:, 2:]
    params = torch.as_tensor(test.params)
    scored = truth[:, size.first - 1 :]
    e_true = spectra_of(scored)
    half = scored.shape[1] // 2
    started = time.perf_counter()
    train_spectra = spectra_of(fields_from_disk(train.fields)[:, size.burn_in + 2 + size.first - 1 :])
    estimates = {
        "prior": prior_spectra(stack, params, truth, size.samples),
        "baseline": train_spectra.mean(dim=0),
        "neighbours": nearest_spectra(train_spectra, torch.as_tensor(train.params), params),
        "operator": rollout_spectra(stack, False, inputs, params, size.rollout, size.first),
        "rollout": rollout_spectra(stack, True, inputs, params, size.rollout, size.first),
    }
    scoring = time.perf_counter() - started
    d = {name: distances(e, e_true) for name, e in estimates.items()}
    floor = [
        spectrum_distance(a, b)
        for a, b in zip(spectra_of(scored[:, :half]), spectra_of(scored[:, half:]), strict=True)
    ]
    steps = f"{size.first}-{size.rollout}"
    seconds = {name: round(status[name]["seconds"], 1) for name in STAGES}
    context = (
        f"seed {seed} (data and training); KS, L ~ U(57.6, 70.4), 128 points, frame 0.5; {size.n_train}/{size.n_val}/{size.n_test} "
        f"trajectories; rollout steps {size.first}-{size.rollout} from t = {size.burn_in * 0.5:g}; prior "
        f"{size.samples} draws x {stack.prior_steps} Euler steps per test trajectory, trained "
        f"{size.prior_epochs} epochs; stage seconds {seconds}, generation {generation:.0f} s, scoring "
        f"{scoring:.0f} s; truth's own half-window floor {mean_and_stderr(floor)[0]:.3f}; "
        f"{load_note()}; torch {torch.__version__}, one thread"
        + ("; QUICK SMOKE RUN, not a figure" if quick else "")
    )
    return [
        record(
            "steady prior (stack with it)",
            "mean-spectrum baseline",
            d["prior"],
            d["baseline"],
            steps,
            context,
        ),
        record(
            "steady prior (stack with it)",
            "stack without it: operator + corrector rollout",
            d["prior"],
            d["rollout"],
            steps,
            context,
        ),
        record(
            "stack without the prior: operator + corrector rollout",
            "mean-spectrum baseline",
            d["rollout"],
            d["baseline"],
            steps,
            context,
        ),
        record(
            "steady prior (stack with it)",
            f"parameter-aware baseline: mean spectrum of the {NEIGHBOURS} training trajectories nearest in L",
            d["prior"],
            d["neighbours"],
            steps,
            context,
        ),
        record(
            "operator alone (rollout)", "mean-spectrum baseline", d["operator"], d["baseline"], steps, context
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: tiny sizes, not a figure, a temporary folder"
    )
    parser.add_argument("--work", default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--out", default=None, help="results JSON (default results/steady_prior.json)")
    parser.add_argument(
        "--seeds", type=int, default=1, help="data and training seeds 0 .. SEEDS-1, one run each (default 1)"
    )
    args = parser.parse_args()
    torch.set_num_threads(1)
    results = []
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(args.work) if args.work else Path(scratch)
        for seed in range(args.seeds):
            results += run(work / f"seed{seed}" if seed else work, args.quick, seed)
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    atomic_write_json(out, results)
    print(json.dumps(results, indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
