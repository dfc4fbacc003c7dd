"""Two-phase training (equilibrium propagation) of energy-based models, without back-propagation in time.

The method (Scellier & Bengio 2017). A model has an energy E(s; theta, x) over its state s, with the
input x clamped; its prediction is read from s* = argmin_s E, found by relaxation. With a cost C(s, y)
(here 1/2 |outputs - y|^2) the total energy of the nudged system is F_beta = E + beta C, and s_beta is its
minimum. Because dF_beta/ds = 0 at s_beta, d/dbeta F_beta(s_beta) = C(s_beta), and swapping the order of
the derivatives in beta and theta gives the gradient of the loss L = C(s_0) at the free fixed point:
    dL/dtheta = d/dbeta [dE/dtheta(s_beta)] at beta = 0
              = (dE/dtheta(s_beta) - dE/dtheta(s_0)) / beta + O(beta)               (one-sided)
              = (dE/dtheta(s_beta) - dE/dtheta(s_-beta)) / (2 beta) + O(beta^2)     (symmetric)
C does not depend on theta, so only E's parameter gradient enters. The estimate is the *gradient*: the
optimiser steps against it (theta <- theta - lr * estimate), which lowers the loss. The sign of beta
matters: +beta pulls the outputs toward the target (F = E + beta C), and the estimate subtracts the
free (or -beta) phase from the +beta phase.

One window (one optimiser step, `TwoPhaseTrainer.window`), all on the device:
    free phase     relax E from s = 0 for `free_steps` steps                 -> s_0 (the prediction)
    snapshot       copy the state (units and velocity) and the model's buffers into preallocated storage
    nudged phase   relax E + beta C from the snapshot for `nudged_steps`     -> s_beta
    (symmetric)    restore the snapshot; relax E - beta C                    -> s_-beta
    update         gradient estimate into preallocated .grad tensors, clip, optimiser step (skipped on
                   the device when not finite), device meters
The window is a hot loop: no host sync (no .item(), no branch on a tensor's value), so on CUDA it can be
captured as one CUDA graph (`train.cuda_graph`, `dynaforge.train.capture.StepGraph`) and on any device
the relaxation can be compiled (`train.compile`); losses are read back once per logging window.

Relaxation is gradient descent with optional heavy-ball momentum on the state:
    v <- momentum v - step_size dF/ds,   s <- s + v.

Run folder (`dynaforge.runs.RunFolder`): config.yaml, metrics.jsonl (header, `train` windows, `epoch`
lines, `resume`), checkpoints/last.pt and best.pt (written atomically, loaded with weights_only=True).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn
from torch.nn.utils import clip_grads_with_norm_, get_total_norm

import dynaforge
from dynaforge.config import (
    Config,
    ConfigError,
    TwoPhaseConfig,
    config_from_dict,
    config_to_dict,
    load_config,
    resolve_device,
    save_config,
)
from dynaforge.errors import RunError
from dynaforge.models.hopfield import HopfieldNet, build_energy_model, hopfield_state_gradient
from dynaforge.runs import (
    CHECKPOINT_VERSION,
    RunFolder,
    holds_run,
    load_checkpoint,
    save_checkpoint,
    training_differences,
)
from dynaforge.train.capture import StepGraph
from dynaforge.train.checkpoint import restore_rng_state, rng_state
from dynaforge.train.log import MetricsLog, WandbLogger, WindowMeter, environment
from dynaforge.train.optim import build_optimizer, step_unless
from dynaforge.train.schedule import build_scheduler, schedule_intervals
from dynaforge.train.engine import TrainingDiverged, seed_everything

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "two_phase"
TEACHER_RELAX_STEPS = 400
"""Relaxation steps of the teacher that makes the task's targets (long enough to reach its fixed point)."""
TEACHER_TOLERANCE = 1e-8
"""Largest |dE/ds| the teacher may have left after its relaxation (float64)."""
DTYPES = {"float32": torch.float32, "float64": torch.float64}


# ---- relaxation ----------------------------------------------------------------------------------


StateGradient = Callable[[Tensor, Tensor, Tensor, str], Tensor]
"""dE/ds of an energy model from (units, coupling, drive, activation)."""


class RelaxState(NamedTuple):
    """Everything a relaxation carries from step to step."""

    units: Float[Tensor, "batch units"]
    velocity: Float[Tensor, "batch units"]
    """The heavy-ball memory (zero without momentum)."""


def relax(
    state: RelaxState,
    coupling: Float[Tensor, "units units"],
    drive: Float[Tensor, "batch units"],
    target_units: Float[Tensor, "batch units"],
    output_mask: Float[Tensor, " units"],
    beta: Tensor,
    steps: int,
    step_size: float,
    momentum: float,
    activation: str,
    state_gradient: StateGradient = hopfield_state_gradient,
) -> RelaxState:
    """`steps` descent steps on F = E + beta C from `state` (a new state; the inputs are not written).

    `beta` is a 0-dim tensor (0 for the free phase), so the free and nudged phases share one compiled graph.
    A fixed number of steps and no test of convergence: the loop never reads a tensor back to the host.
    `state_gradient(units, coupling, drive, activation)` is the model's dE/ds.
    """
    units, velocity = state
    for _ in range(steps):
        force = state_gradient(units, coupling, drive, activation)
        force = force + beta * output_mask * (units - target_units)
        velocity = momentum * velocity - step_size * force
        units = units + velocity
    return RelaxState(units, velocity)


COMPILED_CHUNK_LIMIT = 10
"""Most relaxation steps unrolled into one compiled graph. Measured on 2 loaded CPU cores (hidden 32,
batch 32, 40 + 20 + 20 steps per window): eager 93 windows/s; compiled chunks of 5 and 10 steps 210 and
253 windows/s after 5 and 4 s of compilation; chunks of 20 steps 278 windows/s (compiled from a warm
cache, so its cold compile time was not measured); each phase unrolled whole (40 and 20 steps) 226
windows/s after 73 s of compilation; one compiled step called in a Python loop 93 windows/s (no gain: the
per-call overhead is the eager cost). Ten steps is the knee."""


class CompiledRelax:
    """`relax` compiled for `chunk` steps and called steps / chunk times: one small graph serves the free
    and the nudged phases (both step counts are multiples of `chunk`), so compilation stays short.

    The undecorated functions are the ones compiled: under pytest jaxtyping wraps every annotated
    function in a runtime shape check that dynamo cannot trace (`inspect.unwrap` is a no-op otherwise).
    """

    def __init__(self, chunk: int, mode: str | None, backend: str, dynamic: bool | None) -> None:
        self.chunk = chunk
        self.compiled = torch.compile(inspect.unwrap(relax), mode=mode, backend=backend, dynamic=dynamic)

    def __call__(
        self,
        state: RelaxState,
        coupling: Tensor,
        drive: Tensor,
        target_units: Tensor,
        output_mask: Tensor,
        beta: Tensor,
        steps: int,
        step_size: float,
        momentum: float,
        activation: str,
        state_gradient: StateGradient = hopfield_state_gradient,
    ) -> RelaxState:
        compilable = inspect.unwrap(state_gradient)
        for _ in range(steps // self.chunk):
            state = self.compiled(
                state,
                coupling,
                drive,
                target_units,
                output_mask,
                beta,
                self.chunk,
                step_size,
                momentum,
                activation,
                compilable,
            )
        return state


def compiled_chunk(free_steps: int, nudged_steps: int, limit: int = COMPILED_CHUNK_LIMIT) -> int:
    """The largest step count <= `limit` that divides both phases' step counts."""
    common = math.gcd(free_steps, nudged_steps)
    return max(d for d in range(1, min(limit, common) + 1) if common % d == 0)


def cost(
    units: Float[Tensor, "batch units"],
    target_units: Float[Tensor, "batch units"],
    output_mask: Float[Tensor, " units"],
) -> Float[Tensor, " batch"]:
    """C = 1/2 |outputs - targets|^2 per sample."""
    error = output_mask * (units - target_units)
    return 0.5 * (error * error).sum(-1)


class Snapshot:
    """A relaxation state and the model's buffers, copied into storage allocated once.

    `save` and `restore` are device copies (no allocation, no host sync), so they can run inside a
    captured window. `restore` puts the buffers back into the module and returns the saved state: read it
    (relaxation builds new tensors from it), do not write it.
    """

    def __init__(self, state: RelaxState, module: nn.Module) -> None:
        self.state = RelaxState(*(torch.empty_like(t) for t in state))
        self.buffers = [torch.empty_like(b) for b in module.buffers()]

    @torch.no_grad()
    def save(self, state: RelaxState, module: nn.Module) -> None:
        # In place on purpose: preallocated storage, reused every window.
        for stored, value in zip(self.state, state):
            stored.copy_(value)
        for stored, buffer in zip(self.buffers, module.buffers()):
            stored.copy_(buffer)

    @torch.no_grad()
    def restore(self, module: nn.Module) -> RelaxState:
        for stored, buffer in zip(self.buffers, module.buffers()):
            buffer.copy_(stored)  # in place on purpose: the module's own buffers
        return self.state


# ---- the task ------------------------------------------------------------------------------------


class TaskData(NamedTuple):
    train_inputs: Float[Tensor, "train inputs"]
    train_targets: Float[Tensor, "train outputs"]
    val_inputs: Float[Tensor, "val inputs"]
    val_targets: Float[Tensor, "val outputs"]


def teacher_task(config: TwoPhaseConfig, device: str | torch.device, dtype: torch.dtype) -> TaskData:
    """Inputs x ~ N(0, 1) and the relaxed outputs of a teacher network (`TeacherTaskConfig`), computed in
    float64 and relaxed for `TEACHER_RELAX_STEPS` steps; the same for a given config on every machine."""
    task = config.task
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(task.seed)
        teacher_config = dataclasses.replace(config.model, init_scale=task.teacher_scale)
        teacher = build_energy_model(teacher_config, torch.float64)
        inputs = torch.randn(task.train_samples + task.val_samples, config.model.inputs, dtype=torch.float64)
    with torch.no_grad():
        units = free_relaxation(teacher, inputs, TEACHER_RELAX_STEPS, step_size=0.5)
        outputs = teacher.predict(units)
        residual = float(teacher.state_gradient(units, inputs).abs().max())
    if not residual < TEACHER_TOLERANCE:
        raise ConfigError(
            f"the teacher network does not settle to a fixed point (largest |dE/ds| {residual:.2g} after "
            f"{TEACHER_RELAX_STEPS} steps); lower twophase.task.teacher_scale (now {task.teacher_scale})"
        )
    split = task.train_samples
    inputs, outputs = inputs.to(device, dtype), outputs.to(device, dtype)
    return TaskData(inputs[:split], outputs[:split], inputs[split:], outputs[split:])


def free_relaxation(
    model: HopfieldNet, inputs: Tensor, steps: int, step_size: float, momentum: float = 0.0
) -> Float[Tensor, "batch units"]:
    """The free phase from s = 0 on any number of inputs, eagerly (the teacher, validation)."""
    rest = model.initial_units(inputs.shape[0])
    state = relax(
        RelaxState(rest, rest),
        model.coupling(),
        model.drive(inputs),
        rest,
        model.output_mask,
        torch.zeros((), dtype=rest.dtype, device=rest.device),
        steps,
        step_size,
        momentum,
        model.activation,
        model.state_gradient_function,
    )
    return state.units


# ---- the trainer ---------------------------------------------------------------------------------


class TwoPhaseSummary(NamedTuple):
    run: Path
    epochs: int
    steps: int
    best_val_loss: float
    last_val_loss: float
    seconds: float


def check_supported(config: Config) -> None:
    """Train-section switches the two-phase trainer does not have: a clear error naming the fix."""
    train = config.train
    problems = []
    if train.precision != "fp32":
        problems.append(f"train.precision={train.precision} (set fp32; twophase.dtype picks the precision)")
    if train.accumulate != 1:
        problems.append(f"train.accumulate={train.accumulate} (set 1; raise twophase.batch instead)")
    if train.ema.decay > 0:
        problems.append(f"train.ema.decay={train.ema.decay} (set 0)")
    if train.loss != "mse":
        problems.append(f"train.loss={train.loss} (set mse: the nudging force is that of 1/2 |y - t|^2)")
    if problems:
        raise ConfigError("the two-phase trainer does not support " + "; ".join(problems))


class TwoPhaseTrainer:
    """Trains `config.twophase.model` on the teacher task by two-phase windows, into run folder `out`.

    `resume`: continue the run in `out` from checkpoints/last.pt (it must be a run of the same config),
    or start one there if it has none.
    """

    def __init__(self, config: Config, out: str | Path, resume: bool = False) -> None:
        check_supported(config)
        self.config = config
        self.settings = config.twophase
        train = config.train
        self.run = RunFolder(Path(out))
        self.resume_from = self.checkpoint_to_resume(resume)
        self.device = torch.device(resolve_device(train.device))
        self.dtype = DTYPES[self.settings.dtype]
        self.task = teacher_task(self.settings, self.device, self.dtype)
        self.batch = self.settings.batch
        self.steps_per_epoch = self.task.train_inputs.shape[0] // self.batch
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"twophase.batch={self.batch} exceeds the {self.task.train_inputs.shape[0]} training inputs; "
                "lower twophase.batch or raise twophase.task.train_samples"
            )
        seed_everything(train.seed)
        self.model = build_energy_model(self.settings.model, self.dtype).to(self.device)
        self.parameters = [p for p in self.model.parameters() if p.requires_grad]
        for p in self.parameters:
            p.grad = torch.zeros_like(p)  # preallocated: every window writes its estimate here
        self.capturing = self.cuda_graph_possible()
        self.optimizer = build_optimizer(self.model, train, capturable=self.capturing)
        intervals = schedule_intervals(train.schedule, train.epochs, self.steps_per_epoch)
        self.scheduler = build_scheduler(self.optimizer, train, intervals)
        self.meter = WindowMeter(self.device)
        self.metrics = MetricsLog(self.run.metrics)
        self.wandb: WandbLogger | None = None
        self.relax: Callable[..., RelaxState] = relax
        self.compiled = False
        rest = self.model.initial_units(self.batch)
        self.rest = RelaxState(rest, torch.zeros_like(rest))  # never written: every free phase starts here
        self.snapshot = Snapshot(self.rest, self.model)
        beta = self.settings.beta
        self.betas = {
            name: torch.tensor(value, dtype=self.dtype, device=self.device)
            for name, value in (("free", 0.0), ("plus", beta), ("minus", -beta))
        }
        symmetric = self.settings.nudging == "symmetric"
        self.contrast_scale = 1.0 / (2.0 * beta) if symmetric else 1.0 / beta
        self.graph = (
            StepGraph(self.window, train.cuda_graph.warmup, free_gradients=lambda: None)
            if self.capturing
            else None
        )
        # Where training stands (restored by `resume`).
        self.step = 0
        self.epoch = 0
        self.batches_done = 0
        self.best_val_loss = math.inf
        self.val_loss = math.nan
        self.skipped_steps = 0

    # ---- the loop ----------------------------------------------------------------------------------

    def fit(self, stop_after: int | None = None) -> TwoPhaseSummary:
        """Train all epochs (from where a resumed run stands). `stop_after` ends the run after that global
        step without a checkpoint, as a kill would (for tests)."""
        started = time.perf_counter()
        self.begin()
        try:
            self.train_epochs(stop_after)
        finally:
            if self.wandb is not None:
                self.wandb.finish()
        return self.summary(started)

    def train_epochs(self, stop_after: int | None) -> None:
        """The loop: windows, schedule, logging and checkpoints; validation at each epoch's end."""
        for epoch in range(self.epoch, self.config.train.epochs):
            epoch_started = time.perf_counter()
            order = self.epoch_order(epoch)
            self.meter.restart_clock()
            while self.batches_done < self.steps_per_epoch:
                inputs, targets = self.batch_of(order, self.batches_done)
                if self.graph is not None:
                    self.graph.run(inputs, targets)  # `window`, replayed as a CUDA graph after warmup
                else:
                    self.window(inputs, targets)
                self.schedule_step()
                self.count_step()
                self.log_window_if_due(epoch)
                self.save_progress_if_due()
                if stop_after is not None and self.step >= stop_after:
                    return
            self.log_window(epoch)
            self.val_loss = self.validate()
            self.schedule_epoch(self.val_loss)
            self.log_epoch(epoch, time.perf_counter() - epoch_started)
            self.save_checkpoints(epochs_done=epoch + 1)

    def window(self, inputs: Float[Tensor, "batch inputs"], targets: Float[Tensor, "batch outputs"]) -> None:
        """One two-phase window on a batch: the estimate, then the update (see the module docstring).

        No host sync and no branch on a tensor's value: the whole window can be captured in a CUDA graph.
        """
        gradients, loss = self.estimate(inputs, targets)
        with torch.no_grad():
            for p, g in zip(self.parameters, gradients):
                p.grad.copy_(g)  # in place on purpose: preallocated gradients, read by the optimiser
        grad_norm = self.clip_gradients()
        bad = ~torch.isfinite(grad_norm) | ~torch.isfinite(loss)
        step_unless(self.optimizer, bad.to(torch.float32))
        self.meter.add(loss, grad_norm, bad)

    def estimate(
        self, inputs: Float[Tensor, "batch inputs"], targets: Float[Tensor, "batch outputs"]
    ) -> tuple[tuple[Tensor, ...], Float[Tensor, ""]]:
        """Free phase, snapshot, nudged phase(s): the two-phase estimate of the gradient of the batch-mean
        loss in every parameter, and that loss (at the free state), on the device."""
        model, settings = self.model, self.settings
        with torch.no_grad():
            coupling = model.coupling()
            drive = model.drive(inputs)
            target_units = model.targets_to_units(targets)
            free = self.phase(self.rest, coupling, drive, target_units, "free", settings.free_steps)
            self.snapshot.save(free, model)
            plus = self.phase(free, coupling, drive, target_units, "plus", settings.nudged_steps)
            if settings.nudging == "symmetric":
                start = self.snapshot.restore(model)
                low = self.phase(start, coupling, drive, target_units, "minus", settings.nudged_steps)
            else:
                low = free
            loss = cost(free.units, target_units, model.output_mask).mean()
        return self.gradient_estimate(plus, low, inputs), loss

    def phase(
        self,
        start: RelaxState,
        coupling: Tensor,
        drive: Tensor,
        target_units: Tensor,
        beta: str,
        steps: int,
    ) -> RelaxState:
        """Relax from `start` with nudging `beta` (`free`, `plus` or `minus`)."""
        s = self.settings
        return self.relax(
            start,
            coupling,
            drive,
            target_units,
            self.model.output_mask,
            self.betas[beta],
            steps,
            s.step_size,
            s.momentum,
            self.model.activation,
            self.model.state_gradient_function,
        )

    def gradient_estimate(self, high: RelaxState, low: RelaxState, inputs: Tensor) -> tuple[Tensor, ...]:
        """(dE/dtheta(high) - dE/dtheta(low)) * contrast_scale, E averaged over the batch: the estimate of
        the gradient of the batch-mean loss (high = s_beta; low = s_0, or s_-beta when symmetric)."""
        with torch.enable_grad():
            contrast = (self.model.energy(high.units, inputs) - self.model.energy(low.units, inputs)).mean()
            return torch.autograd.grad(contrast * self.contrast_scale, self.parameters)

    def clip_gradients(self) -> Tensor:
        """The gradient estimate's norm before clipping (clipped when `train.grad_clip` is set)."""
        norm = get_total_norm([p.grad for p in self.parameters])
        if self.config.train.grad_clip is not None:
            clip_grads_with_norm_(self.parameters, self.config.train.grad_clip, norm)
        return norm

    def schedule_step(self) -> None:
        if self.config.train.schedule.interval == "step":
            self.scheduler.step()

    def count_step(self) -> None:
        self.step += 1
        self.batches_done += 1
        self.meter.count(self.batch)

    def epoch_order(self, epoch: int) -> Tensor:
        """The training inputs' order in `epoch`: a permutation drawn from (seed, epoch) alone, so that a
        resumed run sees the batches an uninterrupted one would."""
        generator = torch.Generator(device="cpu")
        generator.manual_seed(self.config.train.seed * 1_000_003 + epoch)
        return torch.randperm(self.task.train_inputs.shape[0], generator=generator, dtype=torch.int64).to(
            self.device
        )

    def batch_of(self, order: Tensor, index: int) -> tuple[Tensor, Tensor]:
        picked = order[index * self.batch : (index + 1) * self.batch]
        return self.task.train_inputs[picked], self.task.train_targets[picked]

    def validate(self) -> float:
        """Mean loss of the free phase on the validation inputs (one host sync)."""
        self.model.eval()
        s = self.settings
        with torch.inference_mode():
            units = free_relaxation(self.model, self.task.val_inputs, s.free_steps, s.step_size, s.momentum)
            target_units = self.model.targets_to_units(self.task.val_targets)
            value = float(cost(units, target_units, self.model.output_mask).mean())
        self.model.train()
        if not math.isfinite(value):
            raise TrainingDiverged(
                f"validation loss is {value} after step {self.step}; lower train.lr, twophase.step_size or "
                "twophase.model.init_scale"
            )
        return value

    def schedule_epoch(self, val_loss: float) -> None:
        self.scheduler.observe(val_loss)
        if self.config.train.schedule.interval == "epoch":
            self.scheduler.step()

    def summary(self, started: float) -> TwoPhaseSummary:
        return TwoPhaseSummary(
            self.run.root,
            self.epoch,
            self.step,
            self.best_val_loss,
            self.val_loss,
            time.perf_counter() - started,
        )

    # ---- set-up ------------------------------------------------------------------------------------

    def checkpoint_to_resume(self, resume: bool) -> Path | None:
        """The last checkpoint to continue from, None for a fresh run; refuses to clobber another run or
        to resume one of a different config."""
        if resume and self.run.config.exists():
            self.check_same_config(config_to_dict(load_config(self.run.config)))
        if resume and self.run.last.exists():
            self.check_same_config(load_checkpoint(self.run.last)["config"])
            return self.run.last
        if holds_run(self.run.root) and not resume:
            raise RunError(
                f"{self.run.root} already holds a run; continue it with --resume, choose another --out "
                "folder or delete this one"
            )
        return None

    def check_same_config(self, saved: dict[str, Any]) -> None:
        wanted = config_to_dict(self.config)
        differences = training_differences(saved, wanted)
        if differences:
            raise RunError(
                f"{self.run.root} holds a run of a different config; it cannot be resumed with this one "
                f"({'; '.join(differences[:5])}). Pass the run's own config (RUN/config.yaml) or another --out."
            )

    def cuda_graph_possible(self) -> bool:
        """Whether the window can be captured; says why not when capture was asked for but cannot be."""
        train = self.config.train
        if not train.cuda_graph.enabled:
            return False
        reasons = []
        if self.device.type != "cuda":
            reasons.append(f"training runs on {self.device.type}")
        if train.optimizer.name not in ("adam", "adamw"):
            reasons.append(f"optimizer {train.optimizer.name} has no capturable mode")
        if train.compile.enabled and train.compile.mode == "reduce-overhead":
            reasons.append("compile mode reduce-overhead already uses CUDA graphs")
        if reasons:
            log.info("CUDA graph capture of the two-phase window off: %s", "; ".join(reasons))
            return False
        return True

    def begin(self) -> None:
        if self.resume_from is not None:
            self.restore(load_checkpoint(self.resume_from, map_location=self.device))
        else:
            self.prepare_run_folder()
        if self.epoch == self.config.train.epochs:
            return  # a finished run: nothing to compile or log
        if self.config.train.compile.enabled:
            self.compile_with_fallback()
        if self.config.train.wandb.enabled:
            self.wandb = WandbLogger(self.config.train.wandb, self.run.root, config_to_dict(self.config))

    def prepare_run_folder(self) -> None:
        shutil.rmtree(self.run.checkpoints, ignore_errors=True)
        self.run.checkpoints.mkdir(parents=True, exist_ok=True)
        save_config(self.config, self.run.config)
        self.metrics.start(
            {
                **environment(),
                "trainer": CHECKPOINT_KIND,
                "device": str(self.device),
                "parameters": sum(p.numel() for p in self.parameters),
                "train_samples": self.task.train_inputs.shape[0],
                "val_samples": self.task.val_inputs.shape[0],
                "steps_per_epoch": self.steps_per_epoch,
                "cuda_graph": self.capturing,
            }
        )

    def restore(self, state: dict[str, Any]) -> None:
        if state.get("kind") != CHECKPOINT_KIND:
            raise RunError(f"{self.resume_from} is not a two-phase checkpoint (kind {state.get('kind')!r})")
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.scheduler.load_state_dict(state["scheduler"])
        restore_rng_state(state["rng"])
        self.step = int(state["step"])
        self.epoch = int(state["position"]["epoch"])
        self.batches_done = int(state["position"]["batches"])
        self.best_val_loss = float(state["best_val_loss"])
        self.val_loss = float(state["val_loss"])
        self.skipped_steps = int(state["skipped_steps"])
        self.meter.epoch.copy_(torch.tensor(state["epoch_loss"], dtype=torch.float64))
        if state["complete"]:
            log.info("%s has finished training; nothing to resume", self.run.root)
            return
        self.metrics.resume(
            self.step,
            {"kind": "resume", "step": self.step, "epoch": self.epoch + 1, "batch": self.batches_done},
        )
        log.info(
            "resuming %s at epoch %d, window %d, step %d",
            self.run.root,
            self.epoch + 1,
            self.batches_done,
            self.step,
        )

    def compile_with_fallback(self) -> None:
        """torch.compile the relaxation (`CompiledRelax`); if a trial relaxation fails to compile, log it
        and stay eager.

        The trial relaxes one training batch (free and nudged, the shapes training uses); it changes
        nothing (relaxation writes no tensor it was given)."""
        compile_config = self.config.train.compile
        mode = compile_config.mode if compile_config.backend == "inductor" else None
        chunk = compiled_chunk(self.settings.free_steps, self.settings.nudged_steps)
        compiled = CompiledRelax(chunk, mode, compile_config.backend, compile_config.dynamic)
        eager, self.relax = self.relax, compiled
        try:
            inputs, targets = self.batch_of(self.epoch_order(self.epoch), 0)
            with torch.no_grad():
                coupling, drive = self.model.coupling(), self.model.drive(inputs)
                target_units = self.model.targets_to_units(targets)
                free = self.phase(self.rest, coupling, drive, target_units, "free", self.settings.free_steps)
                self.phase(free, coupling, drive, target_units, "plus", self.settings.nudged_steps)
            self.compiled = True
            log.info(
                "relaxation compiled in chunks of %d steps (mode %s, backend %s)",
                chunk,
                compile_config.mode,
                compile_config.backend,
            )
        except Exception as error:  # any compilation failure: eager, logged
            self.relax = eager
            log.warning(
                "torch.compile of the relaxation failed (%s: %s); it runs eagerly",
                type(error).__name__,
                str(error).splitlines()[0] if str(error) else "",
            )

    # ---- logging and checkpoints -------------------------------------------------------------------

    def log_window_if_due(self, epoch: int) -> None:
        if self.step % self.config.train.log_every == 0:
            self.log_window(epoch)

    def log_window(self, epoch: int) -> None:
        """Read the window meters (the one host sync of a logging window) and write a metrics line."""
        if self.meter.steps == 0:
            return
        summary = self.meter.read()
        self.meter.reset()
        self.skipped_steps += summary["skipped"]
        lr = float(self.optimizer.param_groups[0]["lr"])
        summary["windows_per_s"] = summary["samples_per_s"] / self.batch
        self.write_record({"kind": "train", "epoch": epoch + 1, "step": self.step, "lr": lr, **summary})
        limit = self.config.train.max_bad_steps
        if summary["bad_streak"] >= limit:
            raise TrainingDiverged(
                f"{summary['bad_streak']} windows in a row had a non-finite loss or gradient estimate (by step "
                f"{self.step}); stopping after train.max_bad_steps={limit}. Lower train.lr or "
                "twophase.step_size, or set train.grad_clip. checkpoints/last.pt holds the last good state."
            )

    def log_epoch(self, epoch: int, seconds: float) -> None:
        loss_sum, good = self.meter.epoch.tolist()
        record = {
            "kind": "epoch",
            "epoch": epoch + 1,
            "step": self.step,
            "train_loss": loss_sum / good if good else math.nan,
            "val_loss": self.val_loss,
            "best": self.val_loss < self.best_val_loss,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "skipped_steps": self.skipped_steps,
            "epoch_time": seconds,
        }
        self.write_record(record)
        log.info(
            "epoch %d/%d  train %.3e  val %.3e  %.1f s%s",
            epoch + 1,
            self.config.train.epochs,
            record["train_loss"],
            self.val_loss,
            seconds,
            "  (best)" if record["best"] else "",
        )

    def write_record(self, record: dict[str, Any]) -> None:
        self.metrics.write(record)
        if self.wandb is not None:
            self.wandb.log(record)

    def save_progress_if_due(self) -> None:
        every = self.config.train.checkpoint_every
        if every and self.step % every == 0 and self.batches_done < self.steps_per_epoch:
            self.save_checkpoints(epochs_done=self.epoch)

    def save_checkpoints(self, epochs_done: int) -> None:
        """At an epoch's end: best.pt when the validation loss improved, then last.pt; mid-epoch last.pt."""
        at_epoch_end = self.batches_done == self.steps_per_epoch
        improved = at_epoch_end and self.val_loss < self.best_val_loss
        if improved:
            self.best_val_loss = self.val_loss
        position = {"epoch": epochs_done, "batches": 0 if at_epoch_end else self.batches_done}
        epoch_loss = [0.0, 0.0] if at_epoch_end else self.meter.epoch.tolist()
        state = self.checkpoint_state(position, epoch_loss)
        if improved:
            save_checkpoint(self.run.best, state)
        save_checkpoint(self.run.last, state)
        if at_epoch_end:
            self.epoch = epochs_done
            self.batches_done = 0
            self.meter.epoch.zero_()

    def checkpoint_state(self, position: dict[str, int], epoch_loss: list[float]) -> dict[str, Any]:
        return {
            "format_version": CHECKPOINT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "kind": CHECKPOINT_KIND,
            "model": self.model.state_dict(),
            "model_config": config_to_dict(self.settings.model),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "rng": rng_state(),
            "step": self.step,
            "position": position,
            "epoch": position["epoch"],
            "epoch_loss": epoch_loss,
            "skipped_steps": self.skipped_steps,
            "complete": position["epoch"] == self.config.train.epochs and position["batches"] == 0,
            "val_loss": self.val_loss,
            "best_val_loss": self.best_val_loss,
            "config": config_to_dict(self.config),
        }


def energy_model_from_checkpoint(path: str | Path, device: str = "cpu") -> HopfieldNet:
    """The trained energy model of a two-phase checkpoint (a file or a run folder's last.pt), rebuilt from
    the checkpoint's own config; nothing of the training run is needed."""
    path = Path(path)
    if path.is_dir():
        path = RunFolder(path).last
    state = load_checkpoint(path, device)
    if state.get("kind") != CHECKPOINT_KIND:
        raise RunError(f"{path} is not a two-phase checkpoint (kind {state.get('kind')!r})")
    config = config_from_dict(state["config"]).twophase
    model = build_energy_model(config.model, DTYPES[config.dtype]).to(device)
    model.load_state_dict(state["model"])
    return model.eval()


def train_two_phase(
    config: Config, out: str | Path, resume: bool = False, stop_after: int | None = None
) -> TwoPhaseSummary:
    """Train (or resume) `config.twophase` into run folder `out` (see `TwoPhaseTrainer`)."""
    return TwoPhaseTrainer(config, out, resume).fit(stop_after)
