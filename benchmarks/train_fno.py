"""Time to accuracy of FNO training on 1D Burgers: dynaforge's trainer against neuraloperator's and a plain loop.

Every trainer learns the same one-step map u(t) -> u(t + 0.05) on the same windows and is scored after every
epoch on the same test windows with the same metric. The figure is the wall time a trainer needs to reach a
fixed test error, and its training throughput (samples/s).

Data (generated with dynaforge's store into a temporary folder, or --data-cache): viscous Burgers
u_t + u u_x = nu u_xx on [0, 1), N = 128, nu = 0.02, ETDRK4 with dt = 0.01, 100 steps saved every 5th, so
21 frames per trajectory, t in [0, 1]; initial fields half Fourier series (wavenumbers <= 4), half Gaussian
random fields (length 0.15), scaled to max |u0| = 1. Splits of 128 / 16 / 32 trajectories give 2560 train,
320 validation and 640 test windows (one input frame, one target frame). Fields are normalised with the
train split's mean and std (dynaforge's `Normalizer`); every trainer gets the same normalised tensors from
the same `WindowDataset`, through the same DataLoader settings (batch 32, shuffled by a generator seeded with
the run's seed, no workers).

Model: FNO width 32, 16 Fourier modes, 4 layers, projection 64, no grid channels, GELU, direct prediction
(dynaforge's `model.residual=false`, since neuraloperator's FNO has no residual form). neuraloperator's FNO is
configured to the same architecture and the same 137 537 real parameters: `n_modes=(30,)` (it keeps
n // 2 + 1 = 16 rfft modes on the last axis), linear lifting (`lifting_channel_ratio=0`), a 64-channel
projection, linear skips, no channel MLP, no positional embedding. The two implementations still differ in
initialisation of the spectral weights (neuraloperator: complex normal with std sqrt(2 / (in + out)), so
its spectral path starts at full strength; dynaforge: Li et al.'s uniform [0, 1 / (in out)), so its blocks
start close to their pointwise paths), in where the spectral bias sits, and in arithmetic: neuraloperator
runs rfft, a complex einsum on the kept modes and irfft on channels-first fields with 1x1 convolutions;
dynaforge's FNO (by default, `model.spectral_transform=auto`, which picks `dft` for 16 of 128 modes) keeps
its fields channels last, runs the pointwise layers as matrix products and reaches the kept modes through
truncated real DFT matrices (the same result as rfft/irfft to float32 rounding; tests/unit/
test_spectral_dft.py), with real block matrices for the mode mixing.

Optimisation, identical for all: AdamW (torch.optim, betas (0.9, 0.999), eps 1e-8), peak lr 2e-3 with a
cosine decay to 0 over all optimiser steps, stepped per step, no warmup (dynaforge's schedule with
warmup_fraction 0 and min_lr_ratio 0; neuraloperator's Trainer steps its scheduler once per epoch, so it gets
a stand-in that does nothing and the same per-step cosine is advanced by a hook after every optimiser step),
weight decay 1e-4 on weights of 2 or more dimensions only, no gradient clipping, loss the relative L2 error
||pred - y|| / ||y|| per sample on normalised fields (neuraloperator's `LpLoss(d=1, p=2)`, which sums over the
batch where dynaforge averages: Adam is invariant to that constant factor up to eps). Each repeat r seeds the
weights and the data order with r for every trainer (the plain loop and dynaforge start from the same
weights; dynaforge's progress bar draws one extra shuffle per epoch, so their batch orders differ).

Trainers:
- neuraloperator's `Trainer.train` with its FNO (evaluating a validation loader every epoch, its default);
- a plain eager PyTorch loop on dynaforge's FNO (zero_grad, forward, loss, backward, step; a validation pass
  per epoch), fp32;
- dynaforge's training engine (`Engine.fit` with a `WindowTask`), driven through its public config: eager fp32, and bf16 autocast
  (`train.precision=bf16`; the spectral convolutions stay fp32), torch.compile (`train.compile.enabled=true`,
  mode default, inductor) and both, where the config has those keys (a variant whose key is missing is
  recorded as skipped); and two ablations: eager fp32 with the rfft/irfft path
  (`model.spectral_transform=fft`), and compiled bf16 with the DFT products under autocast too
  (`model.spectral_low_precision=true`).

Timing: a trainer's clock runs from the call of its training method (trainer construction, which reads the
data and builds the model, is outside) to the end of each epoch, including its own per-epoch validation pass
on the 320 validation windows (every trainer makes one) and, for dynaforge, its checkpoint writes; the
benchmark's test evaluation after each epoch is excluded for every trainer (the clock is paused). Compilation
happens inside the first epoch and counts. A trainer's time to a target error is its clock at the end of
the first epoch whose test error is at or below it; every trainer runs all epochs (or until the wall-time
cap), and one that never gets there is recorded as not reaching it. Two targets, both set after the runs from
the recorded curves (benchmarks/results/train_fno.curves.json holds every run's per-epoch times and errors):
- `common`, reachable by every run: the worst final error of any run, times `common_slack` (1.1);
- `plain-loop`, stricter: the plain fp32 loop's median error after `target_epoch` (17) of the `epochs` (20)
  epochs, times `target_slack` (1.25).
Test error: relative L2 error per window in physical units (denormalised), averaged over the test windows,
computed in fp32, eager, by one function for all trainers. samples/s: training windows per second of clock
time over the epochs after the first (its compile and warm-up excluded).

Interleaving: in each of `repeats` rounds (seed = round), every trainer runs in its own thread and they take
turns one epoch at a time (only one runs at any moment; the others wait with their clocks paused), so that
the load of a shared machine, which drifts over seconds to minutes, weighs on all of them alike; medians over
the rounds are reported. Set-up happens in a run's first turn, untimed. Compiled variants pay compilation in
their first epoch, but inductor's caches (in this process and on disk) make later compilations cheap, so
their median includes little compile time. On a shared machine the figures are provisional.

Run: `.venv-bench/bin/python benchmarks/train_fno.py [--quick] [--threads 1]` (or `make bench`).
Writes benchmarks/results/train_fno.json (ratio > 1: dynaforge faster). `--quick` is the smoke run (`make
bench-smoke`, the QUICK setup): every trainer but the compiled variants for 2 epochs on 4 trajectories; not
a figure, written to a temporary folder (smoke.quick_path) unless --out is given.
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import platform
import statistics
import tempfile
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim.lr_scheduler import LambdaLR
from torch.utils.data import DataLoader, Dataset

from dynaforge.allocator import keep_freed_memory
from dynaforge.atomic import atomic_write_json
from dynaforge.config import Config, ConfigError, DataConfig, load_config
from dynaforge.data import (
    MemoryTrajectories,
    Normalizer,
    WindowDataset,
    make_loader,
)
from dynaforge.generate import generate
from dynaforge.metrics.fields import relative_l2_per_frame
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train import Engine, WindowTask
from machine import device_name, load_note
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "train_fno.json"
DEVICE = torch.device("cpu")  # --device sets it


@dataclass(frozen=True)
class Setup:
    """Everything the trainers share: data sizes, model size, optimisation, the target and the budget."""

    resolution: int = 128
    n_train: int = 128
    n_val: int = 16
    n_test: int = 32
    width: int = 32
    modes: int = 16
    layers: int = 4
    projection: int = 64
    batch_size: int = 32
    lr: float = 2e-3
    weight_decay: float = 1e-4
    epochs: int = 20
    target_epoch: int = 17  # the plain loop's error after this many epochs (x slack) is the target
    target_slack: float = 1.25
    common_slack: float = 1.1  # the `common` target: the worst final error of any run, times this
    repeats: int = 3
    cap_seconds: float = 900.0  # a run stops at the first epoch end past this clock time

    def dataset_overrides(self) -> list[str]:
        """The system and dataset sections: what `dynaforge generate` makes."""
        return [
            "system.name=burgers",
            f"system.resolution={self.resolution}",
            "system.domain_length=1.0",
            "system.viscosity=0.02",
            "system.dt=0.01",
            "system.steps=100",
            "system.save_every=5",
            "system.order=4",
            "system.dtype=float32",
            "system.initial.families.fourier=0.5",
            "system.initial.families.grf=0.5",
            "system.initial.max_wavenumber=4",
            "system.initial.length_scale=0.15",
            "system.initial.normalize=max",
            "system.initial.amplitude=1.0",
            f"dataset.n_train={self.n_train}",
            f"dataset.n_val={self.n_val}",
            f"dataset.n_test={self.n_test}",
            "dataset.shard_size=64",
            "dataset.batch_size=64",
            "dataset.seed=0",
            "dataset.device=cpu",
        ]

    def training_overrides(self, seed: int) -> list[str]:
        """The data, model and train sections every dynaforge variant shares (schedule keys apart)."""
        return [
            "data.history=1",
            "data.horizon=1",
            "data.stride=1",
            f"data.batch_size={self.batch_size}",
            "data.num_workers=0",
            "model.name=fno",
            f"model.width={self.width}",
            f"model.modes={self.modes}",
            f"model.layers={self.layers}",
            f"model.projection={self.projection}",
            "model.residual=false",
            f"train.epochs={self.epochs}",
            f"train.lr={self.lr}",
            f"train.weight_decay={self.weight_decay}",
            "train.grad_clip=null",
            "train.grad_clip_relative=null",  # no clipping, as the README's figure was measured
            "train.loss=relative_l2",
            "train.rollout_steps=1",
            "train.log_every=1000000",  # one metrics line per epoch (the end-of-epoch flush)
            f"train.seed={seed}",
            f"train.device={DEVICE}",
        ]

    def label(self) -> str:
        return (
            f"1D Burgers N={self.resolution}, one-step map dt=0.05, {self.n_train}/{self.n_val}/{self.n_test} "
            f"trajectories ({self.n_train * 20}/{self.n_val * 20}/{self.n_test * 20} windows); FNO width "
            f"{self.width}, {self.modes} modes, {self.layers} layers; batch {self.batch_size}, AdamW lr "
            f"{self.lr:g} cosine per step, {self.epochs} epochs"
        )


QUICK = Setup(n_train=4, n_val=2, n_test=2, epochs=2, target_epoch=1, repeats=1, cap_seconds=120.0)
"""The smoke run (--quick): every trainer, 2 epochs (the first is not timed) on 80 windows; the compiled
variants only when named in --variants (compiling takes longer than the rest of the run)."""

COSINE_SCHEDULES = (
    # The shared schedule in the engine's schedule section, then in main's first-cut keys: the first set the
    # config accepts is used.
    [
        "train.schedule.name=cosine",
        "train.schedule.interval=step",
        "train.schedule.warmup_fraction=0.0",
        "train.schedule.min_lr_ratio=0.0",
    ],
    ["train.warmup_fraction=0.0", "train.min_lr_ratio=0.0"],
)


@dataclass(frozen=True)
class DynaforgeVariant:
    """One dynaforge trainer setting, switched by config keys only."""

    name: str
    overrides: tuple[str, ...]


DYNAFORGE_VARIANTS = (
    # The FNO's defaults: `model.spectral_transform=auto` (16 of 128 modes: the truncated DFT matrices),
    # channels-last pointwise layers, spectral convolutions in fp32 whatever train.precision is.
    DynaforgeVariant("dynaforge eager fp32", ()),
    DynaforgeVariant("dynaforge eager bf16", ("train.precision=bf16",)),
    DynaforgeVariant("dynaforge compiled fp32", ("train.compile.enabled=true",)),
    DynaforgeVariant("dynaforge compiled bf16", ("train.precision=bf16", "train.compile.enabled=true")),
    # Ablations: the rfft/irfft path instead of the DFT matrices; the DFT products under bf16 autocast too.
    DynaforgeVariant("dynaforge eager fp32, fft transform", ("model.spectral_transform=fft",)),
    DynaforgeVariant(
        "dynaforge compiled bf16, bf16 spectral",
        ("train.precision=bf16", "train.compile.enabled=true", "model.spectral_low_precision=true"),
    ),
)
CUDA_VARIANTS = (
    # On a GPU: the whole training step captured in a CUDA graph (one launch per step), and fp16 with a
    # gradient scaler.
    DynaforgeVariant("dynaforge eager fp32, CUDA graph", ("train.cuda_graph.enabled=true",)),
    DynaforgeVariant(
        "dynaforge eager bf16, CUDA graph", ("train.precision=bf16", "train.cuda_graph.enabled=true")
    ),
    DynaforgeVariant("dynaforge eager fp16", ("train.precision=fp16",)),
)
NEURALOPERATOR = "neuraloperator Trainer"
PLAIN = "plain eager loop fp32"


# --------------------------------------------------------------------------------------------------
# Data


@dataclass
class Data:
    root: Path
    normalizer: Normalizer
    train: WindowDataset
    val: WindowDataset
    test_inputs: Tensor  # (M, 1, 1, N) normalised
    test_truth: Tensor  # (M, 1, 1, N) physical


def make_dataset(setup: Setup, root: Path) -> Path:
    """Generate the dataset with dynaforge's store (resumes, or reuses a complete folder of the same config)."""
    config = load_config(None, setup.dataset_overrides())
    generate(config, root, progress=False)
    return root


def load_data(root: Path) -> Data:
    dataset = DatasetFolder(root)
    normalizer = Normalizer.from_stats(dataset.stats)

    def windows(split: str) -> WindowDataset:
        frames = MemoryTrajectories.normalized(fields_from_disk(dataset.read_split(split).fields), normalizer)
        return WindowDataset(frames, history=1, targets=1, stride=1)

    test = windows("test")
    inputs = torch.stack([test[i].inputs for i in range(len(test))])
    targets = torch.stack([test[i].targets for i in range(len(test))])
    truth = normalizer.normalized_to_physical(targets, spatial_dims=1)
    return Data(root, normalizer, windows("train"), windows("val"), inputs, truth)


class PairDataset(Dataset[dict[str, Tensor]]):
    """The same windows as neuraloperator's Trainer wants them: {"x": (C, N), "y": (C, N)}."""

    def __init__(self, windows: WindowDataset) -> None:
        self.windows = windows

    def __len__(self) -> int:
        return len(self.windows)

    def __getitem__(self, index: int) -> dict[str, Tensor]:
        window = self.windows[index]
        return {"x": window.inputs.flatten(0, 1), "y": window.targets.flatten(0, 1)}


def loader(dataset: Dataset, setup: Setup, shuffle: bool, seed: int) -> DataLoader:
    """dynaforge's loader settings for every trainer (batch size, shuffling generator, no workers)."""
    return make_loader(
        dataset, DataConfig(batch_size=setup.batch_size, num_workers=0), DEVICE, shuffle=shuffle, seed=seed
    )


# --------------------------------------------------------------------------------------------------
# The shared metric and the clock

Predict = Callable[[nn.Module, Tensor], Tensor]
"""(model, normalised input frames (B, 1, 1, N)) -> normalised predicted frames (B, 1, 1, N)."""


def predict_dynaforge(model: nn.Module, frames: Tensor) -> Tensor:
    return model(ModelInput(frames=frames)).frames


def predict_neuraloperator(model: nn.Module, frames: Tensor) -> Tensor:
    return model(frames[:, 0])[:, None]


def unwrap(model: nn.Module) -> nn.Module:
    """The plain module inside a torch.compile or DDP wrapper."""
    model = getattr(model, "_orig_mod", model)
    return getattr(model, "module", model)


def test_error(model: nn.Module, predict: Predict, data: Data, batch: int = 320) -> float:
    """Relative L2 error per test window in physical units, averaged; fp32, eager, eval mode."""
    model = unwrap(model)
    was_training = model.training
    model.eval()
    errors = []
    with torch.inference_mode(), torch.compiler.set_stance("force_eager"):
        for start in range(0, len(data.test_inputs), batch):
            inputs = data.test_inputs[start : start + batch].to(DEVICE)
            predicted = predict(model, inputs).float().cpu()
            physical = data.normalizer.normalized_to_physical(predicted, spatial_dims=1)
            errors.append(relative_l2_per_frame(physical, data.test_truth[start : start + batch]))
    model.train(was_training)
    return torch.cat(errors).mean().item()


class WallCapReached(Exception):
    """A run passed its wall-time cap at an epoch end; the epochs done so far are kept."""


@dataclass
class Curve:
    """One training run: clock time and test error at the end of each epoch."""

    trainer: str
    seed: int
    samples_per_epoch: int
    seconds: list[float] = field(default_factory=list)
    errors: list[float] = field(default_factory=list)
    note: str = ""

    def time_to(self, target: float) -> float:
        """Clock time at the end of the first epoch at or below `target`; inf if none was."""
        for seconds, error in zip(self.seconds, self.errors):
            if error <= target:
                return seconds
        return math.inf

    def samples_per_s(self) -> float:
        """Training windows per clock second over the epochs after the first (warm-up and compilation)."""
        if len(self.seconds) < 2:
            return self.samples_per_epoch * len(self.seconds) / self.seconds[-1] if self.seconds else math.nan
        return self.samples_per_epoch * (len(self.seconds) - 1) / (self.seconds[-1] - self.seconds[0])


class Turns:
    """Lets the runs of a round take turns, one epoch each: every run has its own thread, and only the one
    whose turn it is runs (the others wait, their clocks paused), so that the load of a shared machine, which
    drifts over seconds to minutes, weighs on every trainer alike."""

    def __init__(self, names: list[str]) -> None:
        self.order = list(names)
        self.current = 0
        self.changed = threading.Condition()

    def wait(self, name: str) -> None:
        with self.changed:
            self.changed.wait_for(lambda: not self.order or self.order[self.current] == name)

    def pass_on(self, name: str) -> None:
        """End `name`'s turn and wait for its next one."""
        with self.changed:
            self.current = (self.order.index(name) + 1) % len(self.order)
            self.changed.notify_all()
        self.wait(name)

    def leave(self, name: str) -> None:
        """`name` is done (or failed): the turn goes to the next run in order."""
        with self.changed:
            index = self.order.index(name)
            self.order.pop(index)
            if self.order:
                self.current = (self.current - (index < self.current)) % len(self.order)
            self.changed.notify_all()


class Clock:
    """Times a run from `start` to each epoch end; paused while it measures the test error and while the
    other runs take their turns."""

    def __init__(self, curve: Curve, predict: Predict, data: Data, cap_seconds: float, turns: Turns) -> None:
        self.curve, self.predict, self.data, self.cap, self.turns = curve, predict, data, cap_seconds, turns
        self.started = time.perf_counter()
        self.paused = 0.0

    def start(self) -> None:
        self.started = time.perf_counter()
        self.paused = 0.0

    def epoch_end(self, model: nn.Module) -> None:
        if DEVICE.type == "cuda":
            torch.cuda.synchronize(DEVICE)  # the epoch ends when the GPU's queued work does
        now = time.perf_counter()
        elapsed = now - self.started - self.paused
        self.curve.seconds.append(elapsed)
        self.curve.errors.append(test_error(model, self.predict, self.data))
        if elapsed > self.cap:
            raise WallCapReached(f"stopped after {len(self.curve.seconds)} epochs: wall cap {self.cap:g} s")
        self.turns.pass_on(self.curve.trainer)
        self.paused += time.perf_counter() - now


# --------------------------------------------------------------------------------------------------
# Shared optimisation pieces


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """Weight decay on weights of 2 or more dimensions, none on biases (dynaforge's rule, for every trainer)."""
    decay, no_decay = [], []
    for name, parameter in model.named_parameters():
        (decay if parameter.ndim >= 2 and not name.endswith("bias") else no_decay).append(parameter)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def adamw(model: nn.Module, setup: Setup) -> torch.optim.AdamW:
    return torch.optim.AdamW(
        decay_groups(model, setup.weight_decay), lr=setup.lr, betas=(0.9, 0.999), eps=1e-8
    )


def cosine_factor(step: int, total_steps: int) -> float:
    """Multiplier of the peak lr at optimiser step `step`: cosine from 1 to 0 over `total_steps`, no warmup
    (dynaforge's schedule with warmup_fraction 0 and min_lr_ratio 0)."""
    return 0.5 * (1.0 + math.cos(math.pi * min(step / total_steps, 1.0)))


def per_step_cosine(optimizer: torch.optim.Optimizer, setup: Setup, steps_per_epoch: int) -> LambdaLR:
    return LambdaLR(optimizer, functools.partial(cosine_factor, total_steps=setup.epochs * steps_per_epoch))


def relative_l2(predicted: Tensor, target: Tensor) -> Tensor:
    """||pred - y|| / ||y|| per sample (over channels and space), averaged over the batch, in fp32."""
    return relative_l2_per_frame(predicted.float(), target.float()).mean()


def dynaforge_fno(setup: Setup) -> nn.Module:
    config = load_config(None, setup.training_overrides(seed=0))
    return build_model(config.model, ModelShape(channels=1, history=1, horizon=1, spatial_dims=1))


# --------------------------------------------------------------------------------------------------
# (a) neuraloperator


def neuraloperator_fno(setup: Setup) -> nn.Module:
    from neuralop.models import FNO

    return FNO(
        n_modes=(2 * setup.modes - 2,),  # neuraloperator keeps n_modes // 2 + 1 rfft modes on the last axis
        in_channels=1,
        out_channels=1,
        hidden_channels=setup.width,
        n_layers=setup.layers,
        lifting_channel_ratio=0,  # a linear lifting, as dynaforge's
        projection_channel_ratio=setup.projection / setup.width,
        positional_embedding=None,
        non_linearity=nn.functional.gelu,
        use_channel_mlp=False,
        fno_skip="linear",
    )


class EpochSchedulerStandIn:
    """Takes neuraloperator's per-epoch `scheduler.step()` and does nothing (the lr moves per step)."""

    def step(self, *args: Any) -> None:
        pass


def run_neuraloperator(setup: Setup, data: Data, seed: int, turns: Turns) -> Curve:
    from neuralop.losses import LpLoss
    from neuralop.training import Trainer as NOTrainer

    class ClockedNOTrainer(NOTrainer):
        """neuraloperator's Trainer; after its own per-epoch evaluation, the benchmark's paused test."""

        clock: Clock

        def evaluate_all(self, *args: Any, **kwargs: Any) -> dict[str, Any]:
            metrics = super().evaluate_all(*args, **kwargs)
            self.clock.epoch_end(self.model)
            return metrics

    curve = Curve(NEURALOPERATOR, seed, len(data.train))
    turns.wait(curve.trainer)  # set-up in its own turn too: seeding and building touch global state
    torch.manual_seed(seed)
    model = neuraloperator_fno(setup)
    optimizer = adamw(model, setup)
    train_loader = loader(PairDataset(data.train), setup, shuffle=True, seed=seed)
    val_loader = loader(PairDataset(data.val), setup, shuffle=False, seed=seed)
    # Its Trainer steps the scheduler once per epoch; the shared schedule advances per optimiser step, so
    # the cosine is stepped by a hook after every optimiser step and the Trainer gets one that does nothing.
    cosine = per_step_cosine(optimizer, setup, len(train_loader))
    optimizer.register_step_post_hook(lambda *_: cosine.step())
    trainer = ClockedNOTrainer(
        model=model, n_epochs=setup.epochs, device=DEVICE, eval_interval=1, verbose=False
    )
    trainer.clock = Clock(curve, predict_neuraloperator, data, setup.cap_seconds, turns)
    loss = LpLoss(d=1, p=2)
    trainer.clock.start()
    try:
        trainer.train(
            train_loader,
            {"val": val_loader},
            optimizer,
            EpochSchedulerStandIn(),
            training_loss=loss,
            eval_losses={"l2": loss},
        )
    except WallCapReached as stop:
        curve.note = str(stop)
    return curve


# --------------------------------------------------------------------------------------------------
# (b) the plain loop


def run_plain(setup: Setup, data: Data, seed: int, turns: Turns) -> Curve:
    curve = Curve(PLAIN, seed, len(data.train))
    turns.wait(curve.trainer)
    torch.manual_seed(seed)
    model = dynaforge_fno(setup).to(DEVICE)
    optimizer = adamw(model, setup)
    train_loader = loader(data.train, setup, shuffle=True, seed=seed)
    val_loader = loader(data.val, setup, shuffle=False, seed=seed)
    scheduler = per_step_cosine(optimizer, setup, len(train_loader))
    clock = Clock(curve, predict_dynaforge, data, setup.cap_seconds, turns)
    clock.start()
    try:
        for _ in range(setup.epochs):
            model.train()
            for batch in train_loader:
                inputs = batch.inputs.to(DEVICE, non_blocking=True)
                targets = batch.targets.to(DEVICE, non_blocking=True)
                optimizer.zero_grad(set_to_none=True)
                loss = relative_l2(model(ModelInput(frames=inputs)).frames, targets)
                loss.backward()
                optimizer.step()
                scheduler.step()
            model.eval()
            with torch.inference_mode():
                val = [
                    relative_l2(model(ModelInput(frames=b.inputs.to(DEVICE))).frames, b.targets.to(DEVICE))
                    for b in val_loader
                ]
            torch.stack(val).mean().item()
            clock.epoch_end(model)
    except WallCapReached as stop:
        curve.note = str(stop)
    return curve


# --------------------------------------------------------------------------------------------------
# (c) dynaforge


def dynaforge_config(setup: Setup, variant: DynaforgeVariant, seed: int) -> Config:
    """The variant's config; ConfigError when this dynaforge lacks one of its keys."""
    base = setup.dataset_overrides() + setup.training_overrides(seed)
    error: ConfigError | None = None
    for schedule in COSINE_SCHEDULES:
        try:
            return load_config(None, [*base, *schedule, *variant.overrides])
        except ConfigError as problem:
            error = problem
    assert error is not None
    raise error


def run_dynaforge(setup: Setup, data: Data, seed: int, variant: DynaforgeVariant, turns: Turns) -> Curve:
    curve = Curve(variant.name, seed, len(data.train))
    turns.wait(curve.trainer)
    config = dynaforge_config(setup, variant, seed)
    with tempfile.TemporaryDirectory(prefix="train_fno_run_") as run:
        clock = Clock(curve, predict_dynaforge, data, setup.cap_seconds, turns)
        trainer = Engine(config, WindowTask(config, data.root), run, progress=False)
        # after each epoch's own validation and checkpoints: the benchmark's paused test evaluation
        trainer.callbacks.append(lambda epoch, metrics: clock.epoch_end(trainer.model))
        clock.start()
        try:
            trainer.fit()
        except WallCapReached as stop:
            curve.note = str(stop)
    return curve


def available_variants(setup: Setup) -> tuple[list[DynaforgeVariant], dict[str, str]]:
    """Variants this dynaforge's config accepts, and why the others are skipped."""
    available, skipped = [], {}
    for variant in DYNAFORGE_VARIANTS + (CUDA_VARIANTS if DEVICE.type == "cuda" else ()):
        try:
            dynaforge_config(setup, variant, seed=0)
        except ConfigError as error:
            skipped[variant.name] = f"skipped: this dynaforge's config has no such switch ({error})"
        else:
            available.append(variant)
    return available, skipped


# --------------------------------------------------------------------------------------------------
# Running and recording


Run = Callable[[int, Turns], Curve]


def run_all(setup: Setup, data: Data, variants: list[DynaforgeVariant]) -> dict[str, list[Curve]]:
    """`repeats` rounds; in each, every trainer runs with the round's seed, all taking turns epoch by epoch
    (the order of turns rotated from round to round)."""
    runs: list[tuple[str, Run]] = [
        (NEURALOPERATOR, lambda seed, turns: run_neuraloperator(setup, data, seed, turns)),
        (PLAIN, lambda seed, turns: run_plain(setup, data, seed, turns)),
        *[(v.name, lambda seed, turns, v=v: run_dynaforge(setup, data, seed, v, turns)) for v in variants],
    ]
    curves: dict[str, list[Curve]] = {name: [] for name, _ in runs}
    for seed in range(setup.repeats):
        shift = seed % len(runs)
        for curve in run_round(runs[shift:] + runs[:shift], seed):
            curves[curve.trainer].append(curve)
            print(format_curve(curve), flush=True)
    return curves


def run_round(runs: list[tuple[str, Run]], seed: int) -> list[Curve]:
    """Every run in its own thread, taking turns (see `Turns`); the first failure is raised after all end."""
    turns = Turns([name for name, _ in runs])
    curves: dict[str, Curve] = {}
    failures: list[BaseException] = []

    def work(name: str, run: Run) -> None:
        try:
            curves[name] = run(seed, turns)
        except BaseException as error:
            failures.append(error)
        finally:
            turns.leave(name)

    threads = [threading.Thread(target=work, args=run, name=run[0]) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    if failures:
        raise failures[0]
    return [curves[name] for name, _ in runs]


def format_curve(curve: Curve) -> str:
    errors = " ".join(f"{e:.4f}" for e in curve.errors)
    last = curve.seconds[-1] if curve.seconds else math.nan
    note = f"  ({curve.note})" if curve.note else ""
    return (
        f"  {curve.trainer:<26} seed {curve.seed}: {len(curve.errors)} epochs, {last:7.1f} s, "
        f"{curve.samples_per_s():7.0f} samples/s; test error per epoch: {errors}{note}"
    )


def median_or_inf(values: list[float]) -> float:
    return statistics.median(values) if values else math.inf


@dataclass(frozen=True)
class Target:
    """A test error to reach, with the rule that set it."""

    name: str
    error: float
    rule: str


def targets_for(setup: Setup, curves: dict[str, list[Curve]]) -> list[Target]:
    """`common`: reachable by every run (the worst final error of any run, times `common_slack`);
    `plain-loop`: the plain loop's median error after `target_epoch` epochs, times `target_slack`."""
    finals = [(c.errors[-1], c.trainer, c.seed) for runs in curves.values() for c in runs if c.errors]
    worst, worst_trainer, worst_seed = max(finals)
    at_epoch = [
        c.errors[setup.target_epoch - 1] for c in curves[PLAIN] if len(c.errors) >= setup.target_epoch
    ]
    if not at_epoch:
        raise RuntimeError(f"the plain loop did not complete {setup.target_epoch} epochs; raise --cap")
    return [
        Target(
            "common",
            worst * setup.common_slack,
            f"reachable by every run: the worst final error of any run ({worst_trainer}, seed {worst_seed}, "
            f"{worst:.4f}) x {setup.common_slack:g}",
        ),
        Target(
            "plain-loop",
            statistics.median(at_epoch) * setup.target_slack,
            f"the plain fp32 loop's median error after {setup.target_epoch} of {setup.epochs} epochs "
            f"({statistics.median(at_epoch):.4f}) x {setup.target_slack:g}",
        ),
    ]


@dataclass(frozen=True)
class Summary:
    """Medians over a trainer's repeats, for one target."""

    time_to_target: float  # inf when the median run did not reach the target
    reached: int
    runs: int
    samples_per_s: float
    final_error: float
    times: tuple[float, ...]

    def describe(self, name: str) -> str:
        times = ", ".join("never" if math.isinf(t) else f"{t:.1f}" for t in self.times)
        return (
            f"{name}: time to target {fmt_seconds(self.time_to_target)} (runs: {times} s; reached in "
            f"{self.reached}/{self.runs}), {self.samples_per_s:.0f} samples/s, final test error "
            f"{self.final_error:.4f}"
        )


def summarise(curves: list[Curve], target: float) -> Summary:
    times = [c.time_to(target) for c in curves]
    return Summary(
        time_to_target=statistics.median(times),
        reached=sum(math.isfinite(t) for t in times),
        runs=len(curves),
        samples_per_s=statistics.median(c.samples_per_s() for c in curves),
        final_error=statistics.median(c.errors[-1] for c in curves if c.errors),
        times=tuple(times),
    )


def fmt_seconds(seconds: float) -> str:
    return "not reached" if math.isinf(seconds) else f"{seconds:.1f} s"


def finite_or_none(value: float) -> float | None:
    return value if math.isfinite(value) else None


FAIR_COMPARISON = (
    "fair-comparison settings: the same FNO size in every trainer (width 32, 16 Fourier modes, 4 layers, "
    "projection 64, 137 537 parameters), the same training/validation/test windows, batch 32, the same "
    "optimiser and schedule for all (AdamW lr 2e-3, weight decay 1e-4 on weights of 2+ dims, cosine to 0 "
    "stepped per optimiser step, no warmup, no clipping: not each tool's default schedule), the same loss "
    "(relative L2) and test metric; neuraloperator runs fp32 eager (its Trainer's default), each trainer "
    "including its own per-epoch validation pass in its clock"
)


def environment() -> str:
    return (
        (f"every trainer on {device_name(DEVICE)}; " if DEVICE.type == "cuda" else "")
        + f"torch {torch.__version__} with {torch.get_num_threads()} intra-op threads, Python "
        f"{platform.python_version()}, {platform.machine()} with {os.cpu_count()} cores; {load_note()} when "
        "written"
    )


def paired_ratio(baseline: list[Curve], mine: list[Curve], value: Callable[[Curve], float]) -> float:
    """Median over rounds of value(baseline run) / value(dynaforge run), runs paired by seed (a round's runs
    took turns, so they saw the same machine load); inf when the baseline missed where dynaforge did not."""
    by_seed = {c.seed: c for c in baseline}
    ratios = [value(by_seed[c.seed]) / value(c) for c in mine if c.seed in by_seed]
    ratios = [r for r in ratios if not math.isnan(r)]  # both missed the target: no ratio
    return statistics.median(ratios) if ratios else math.nan


def records_for(
    setup: Setup,
    targets: list[Target],
    curves: dict[str, list[Curve]],
    skipped: dict[str, str],
    versions: str,
    env: str,
) -> list[dict[str, Any]]:
    """Per dynaforge variant and baseline: seconds to each target, and training samples/s."""
    case = setup.label()
    baselines = {
        NEURALOPERATOR: f"neuraloperator {versions} FNO + Trainer, eager fp32",
        PLAIN: "plain eager PyTorch loop (AdamW) on dynaforge's FNO, fp32",
    }
    records = []
    for variant in DYNAFORGE_VARIANTS + (CUDA_VARIANTS if DEVICE.type == "cuda" else ()):
        for baseline, description in baselines.items():
            if variant.name in skipped or variant.name not in curves:
                why = skipped.get(variant.name, "not run")
                records += [
                    skipped_record(
                        f"{case}; {variant.name}; target {t.name} {t.error:.4f}",
                        description,
                        "seconds to target error",
                        why,
                    )
                    for t in targets
                ]
                records.append(
                    skipped_record(f"{case}; {variant.name}", description, "training samples/s", why)
                )
                continue
            mine_runs, base_runs = curves[variant.name], curves[baseline]
            for target in targets:
                mine = summarise(mine_runs, target.error)
                base = summarise(base_runs, target.error)
                ratio = paired_ratio(base_runs, mine_runs, lambda c, t=target.error: c.time_to(t))
                records.append(
                    {
                        "case": f"{case}; {variant.name}; target {target.name} {target.error:.4f}",
                        "baseline": description,
                        "metric": "seconds to target error",
                        "dynaforge": finite_or_none(mine.time_to_target),
                        "baseline_value": finite_or_none(base.time_to_target),
                        "ratio": finite_or_none(ratio),
                        "notes": (
                            f"target test relative L2 error {target.error:.4f}, {target.rule}; values are "
                            f"medians of {mine.runs} rounds, ratio the median of the per-round ratios "
                            "(null when the baseline missed the target in most rounds: unbounded); "
                            f"{mine.describe(variant.name)}; {base.describe(baseline)}; {FAIR_COMPARISON}; "
                            f"{env}"
                        ),
                    }
                )
            mine = summarise(mine_runs, math.inf)
            base = summarise(base_runs, math.inf)
            records.append(
                {
                    "case": f"{case}; {variant.name}",
                    "baseline": description,
                    "metric": "training samples/s",
                    "dynaforge": mine.samples_per_s,
                    "baseline_value": base.samples_per_s,
                    "ratio": paired_ratio(mine_runs, base_runs, Curve.samples_per_s),
                    "notes": (
                        "training windows per second of clock time (own validation pass included) over the "
                        f"epochs after the first; medians of {mine.runs} rounds, ratio the median of the "
                        f"per-round ratios; {FAIR_COMPARISON}; {env}"
                    ),
                }
            )
    return records


def skipped_record(case: str, baseline: str, metric: str, why: str) -> dict[str, Any]:
    return {
        "case": case,
        "baseline": baseline,
        "metric": metric,
        "dynaforge": None,
        "baseline_value": None,
        "ratio": None,
        "notes": why,
    }


def curves_to_json(
    setup: Setup,
    targets: list[Target],
    curves: dict[str, list[Curve]],
    skipped: dict[str, str],
    versions: str,
    env: str,
) -> dict[str, Any]:
    """Every run's per-epoch clock times and test errors, to recompute any target afterwards."""
    return {
        "setup": dataclasses.asdict(setup),
        "targets": [dataclasses.asdict(t) for t in targets],
        "environment": env,
        "neuraloperator": versions,
        "skipped": skipped,
        "runs": [dataclasses.asdict(curve) for runs in curves.values() for curve in runs],
    }


def curves_from_json(saved: dict[str, Any]) -> dict[str, list[Curve]]:
    curves: dict[str, list[Curve]] = {}
    for run in saved["runs"]:
        curves.setdefault(run["trainer"], []).append(Curve(**run))
    return curves


def report(
    setup: Setup,
    curves: dict[str, list[Curve]],
    skipped: dict[str, str],
    versions: str,
    env: str,
    out: Path,
) -> None:
    """Print the summaries per target and write the records and the curves."""
    targets = targets_for(setup, curves)
    for target in targets:
        print(f"\ntarget {target.name}: test error {target.error:.4f}, {target.rule}")
        for name, runs in curves.items():
            print("  " + summarise(runs, target.error).describe(name))
    atomic_write_json(out, records_for(setup, targets, curves, skipped, versions, env))
    curves_out = curves_path(out)
    atomic_write_json(curves_out, curves_to_json(setup, targets, curves, skipped, versions, env))
    print(f"\nwrote {out} and {curves_out.name}")


def curves_path(out: Path) -> Path:
    """Beside the records: train_fno.curves.json for train_fno.json."""
    return out.with_name(out.stem + ".curves.json")


def neuraloperator_version() -> str:
    from importlib.metadata import version

    return version("neuraloperator")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: 4 trajectories, 2 epochs, eager variants"
    )
    parser.add_argument(
        "--threads",
        type=int,
        default=0,
        help="torch intra-op threads (default 0: torch's default, all cores)",
    )
    parser.add_argument("--repeats", type=int, default=None, help="rounds of runs (median reported)")
    parser.add_argument(
        "--device",
        default="cpu",
        help="cpu (default) or cuda: every trainer on this device; on cuda dynaforge's CUDA-graph and fp16 "
        "variants run too",
    )
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run")
    parser.add_argument(
        "--variants",
        default="",
        help="dynaforge variants to run, names separated by semicolons (some names hold commas), e.g. "
        "'dynaforge eager fp32;dynaforge eager fp32, fft transform'; default all. "
        "neuraloperator and the plain loop always run",
    )
    parser.add_argument(
        "--target-epoch", type=int, default=None, help="plain-loop epoch that sets the target"
    )
    parser.add_argument("--cap", type=float, default=None, help="wall-time cap per run, seconds")
    parser.add_argument(
        "--data-cache", type=Path, default=None, help="dataset folder to reuse (default: a temporary one)"
    )
    parser.add_argument(
        "--out", type=Path, default=None, help="JSON records (default results/train_fno.json)"
    )
    parser.add_argument(
        "--from-curves",
        type=Path,
        default=None,
        help="recompute the targets and records from a saved .curves.json instead of training",
    )
    args = parser.parse_args()
    # dynaforge's engine lets the C allocator keep freed memory (dynaforge/allocator.py), process-wide: set
    # from the start, so that both libraries run under the same allocator whichever trains first.
    keep_freed_memory()
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    if args.from_curves is not None:
        saved = json.loads(args.from_curves.read_text())
        setup = Setup(**saved["setup"])
        skipped = saved.get("skipped", available_variants(setup)[1])
        versions = saved.get("neuraloperator", neuraloperator_version())
        report(setup, curves_from_json(saved), skipped, versions, saved["environment"], out)
        return
    global DEVICE
    DEVICE = torch.device(args.device)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    setup = QUICK if args.quick else Setup()
    changes = {
        "repeats": args.repeats,
        "epochs": args.epochs,
        "target_epoch": args.target_epoch,
        "cap_seconds": args.cap,
    }
    setup = dataclasses.replace(setup, **{k: v for k, v in changes.items() if v is not None})
    if not 1 <= setup.target_epoch <= setup.epochs:
        parser.error(f"--target-epoch must lie in [1, epochs={setup.epochs}]")

    # neuraloperator's Trainer passes the whole batch dict to the model and the loss, which warn about the
    # extra key on every call; the warning is the library's (the cost of raising it stays in the timing).
    # Imported first: importing it puts a `once` filter for every UserWarning in front of the list.
    import neuralop.training  # noqa: F401

    warnings.filterwarnings("ignore", message=r".*received unexpected keyword arguments")
    variants, skipped = available_variants(setup)
    if args.variants:
        chosen = [name.strip() for name in args.variants.split(";")]
        unknown = [name for name in chosen if name not in {v.name for v in variants}]
        if unknown:
            parser.error(
                f"--variants: no variant {unknown[0]!r}; choose from: {', '.join(v.name for v in variants)}"
            )
        skipped.update({v.name: "not chosen (--variants)" for v in variants if v.name not in chosen})
        variants = [v for v in variants if v.name in chosen]
    elif args.quick:
        compiled = [v for v in variants if "train.compile.enabled=true" in v.overrides]
        skipped.update({v.name: "not in the smoke run (--quick; name it in --variants)" for v in compiled})
        variants = [v for v in variants if v not in compiled]
    for name, why in skipped.items():
        print(f"{name}: {why}")
    with tempfile.TemporaryDirectory(prefix="train_fno_data_") as scratch:
        root = make_dataset(setup, args.data_cache or Path(scratch) / "burgers")
        data = load_data(root)
        print(f"{setup.label()}\n{environment()}")
        curves = run_all(setup, data, variants)
    report(setup, curves, skipped, neuraloperator_version(), environment(), out)


if __name__ == "__main__":
    main()
