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

One phase step (one optimiser step of the engine with a `TwoPhaseTask`), all on the device:
    free phase     relax E from s = 0 for `free_steps` steps                 -> s_0 (the prediction)
    snapshot       copy the state (units and velocity) and the model's buffers into preallocated storage
    nudged phase   relax E + beta C from the snapshot for `nudged_steps`     -> s_beta
    (symmetric)    restore the snapshot; relax E - beta C                    -> s_-beta
    update         the contrast's gradient (the estimate) into .grad, clip, optimiser step (skipped on
                   the device when not finite), device meters: the engine's step
The phase step is a hot loop: no host sync (no .item(), no branch on a tensor's value), so on CUDA it can be
captured as one CUDA graph (`train.cuda_graph`, `dynaforge.train.capture.StepGraph`) and on any device
the relaxation can be compiled (`train.compile`); losses are read back once per log interval.

Relaxation is gradient descent with optional heavy-ball momentum on the state:
    v <- momentum v - step_size dF/ds,   s <- s + v.

Run folder (`dynaforge.runs.RunFolder`): config.yaml, metrics.jsonl (header, `train` records per log interval, `epoch`
lines, `resume`), checkpoints/last.pt and best.pt (written atomically, loaded with weights_only=True).
"""

from __future__ import annotations

import dataclasses
import inspect
import logging
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import (
    Config,
    ConfigError,
    TwoPhaseConfig,
    config_to_dict,
)
from dynaforge.models.hopfield import HopfieldNet, build_energy_model, hopfield_state_gradient
from dynaforge.models.loading import TWO_PHASE_KIND
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.task import EngineContext, StepLoss, TaskDefaults

log = logging.getLogger(__name__)

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


class Clamp(NamedTuple):
    """What a relaxation holds fixed: the model's coupling, the drive of the clamped input, and the target
    the cost C nudges the output units toward (`output_mask` marks them)."""

    coupling: Float[Tensor, "units units"]
    drive: Float[Tensor, "batch units"]
    target_units: Float[Tensor, "batch units"]
    output_mask: Float[Tensor, " units"]


class Descent(NamedTuple):
    """How a relaxation steps: heavy-ball gradient descent with the model's dE/ds."""

    step_size: float
    momentum: float
    activation: str
    state_gradient: StateGradient = hopfield_state_gradient
    """dE/ds from (units, coupling, drive, activation)."""


def relax(state: RelaxState, clamp: Clamp, beta: Tensor, steps: int, descent: Descent) -> RelaxState:
    """`steps` descent steps on F = E + beta C from `state` (a new state; the inputs are not written).

    `beta` is a 0-dim tensor (0 for the free phase), so the free and nudged phases share one compiled graph.
    A fixed number of steps and no test of convergence: the loop never reads a tensor back to the host.
    """
    units, velocity = state
    coupling, drive, target_units, output_mask = clamp
    step_size, momentum, activation, state_gradient = descent
    for _ in range(steps):
        force = state_gradient(units, coupling, drive, activation)
        force = force + beta * output_mask * (units - target_units)
        velocity = momentum * velocity - step_size * force
        units = units + velocity
    return RelaxState(units, velocity)


COMPILED_CHUNK_LIMIT = 10
"""Most relaxation steps unrolled into one compiled graph: longer chunks compile for much longer and run
little faster, one step per call gains nothing (docs/two_phase.md, "Compilation")."""


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
        self, state: RelaxState, clamp: Clamp, beta: Tensor, steps: int, descent: Descent
    ) -> RelaxState:
        compilable = descent._replace(state_gradient=inspect.unwrap(descent.state_gradient))
        for _ in range(steps // self.chunk):
            state = self.compiled(state, clamp, beta, self.chunk, compilable)
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
    captured phase step. `restore` puts the buffers back into the module and returns the saved state: read it
    (relaxation builds new tensors from it), do not write it.
    """

    def __init__(self, state: RelaxState, module: nn.Module) -> None:
        self.state = RelaxState(*(torch.empty_like(t) for t in state))
        self.buffers = [torch.empty_like(b) for b in module.buffers()]

    @torch.no_grad()
    def save(self, state: RelaxState, module: nn.Module) -> None:
        # In place on purpose: preallocated storage, reused every phase step.
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
        Clamp(model.coupling(), model.drive(inputs), rest, model.output_mask),
        torch.zeros((), dtype=rest.dtype, device=rest.device),
        steps,
        Descent(step_size, momentum, model.activation, model.state_gradient_function),
    )
    return state.units


# ---- the task ------------------------------------------------------------------------------------


def check_supported(config: Config) -> None:
    """Train-section switches two-phase training does not have: a clear error naming the fix."""
    train = config.train
    problems = []
    if train.precision != "fp32":
        problems.append(f"train.precision={train.precision} (set fp32; twophase.dtype picks the precision)")
    if train.loss != "mse":
        problems.append(f"train.loss={train.loss} (set mse: the nudging force is that of 1/2 |y - t|^2)")
    if problems:
        raise ConfigError("two-phase training does not support " + "; ".join(problems))


class TwoPhaseTask(TaskDefaults):
    """Two-phase training of `config.twophase.model` on the teacher task, as an engine task.

    A step's `loss` runs the free and nudged phases without gradients and returns the contrast of
    energies scaled by 1 / beta (1 / (2 beta) when symmetric), whose gradient in the parameters is the
    two-phase estimate of the loss gradient, beside the loss itself at the free state (what the logs and the
    non-finite guard read). No host sync and no branch on a tensor's value: the whole step can be captured
    in a CUDA graph; `train.compile` compiles the relaxation (`CompiledRelax`).
    """

    kind: str | None = TWO_PHASE_KIND
    capturable = True
    data_parallel = False

    def __init__(self, config: Config) -> None:
        check_supported(config)
        self.config = config
        self.settings = config.twophase
        self.relax: Callable[..., RelaxState] = relax

    def setup(self, context: EngineContext) -> None:
        self.context = context
        self.device = context.device
        self.dtype = DTYPES[self.settings.dtype]
        self.data = teacher_task(self.settings, self.device, self.dtype)
        self.batch = self.settings.batch
        self.steps_per_epoch = self.data.train_inputs.shape[0] // self.batch
        if self.steps_per_epoch == 0:
            raise ConfigError(
                f"twophase.batch={self.batch} exceeds the {self.data.train_inputs.shape[0]} training inputs; "
                "lower twophase.batch or raise twophase.task.train_samples"
            )
        beta = self.settings.beta
        self.betas = {
            name: torch.tensor(value, dtype=self.dtype, device=self.device)
            for name, value in (("free", 0.0), ("plus", beta), ("minus", -beta))
        }
        symmetric = self.settings.nudging == "symmetric"
        self.contrast_scale = 1.0 / (2.0 * beta) if symmetric else 1.0 / beta

    def build_model(self) -> nn.Module:
        self.model = build_energy_model(self.settings.model, self.dtype).to(self.device)
        rest = self.model.initial_units(self.batch)
        self.rest = RelaxState(rest, torch.zeros_like(rest))  # never written: every free phase starts here
        self.snapshot = Snapshot(self.rest, self.model)
        return self.model

    def epochs(self) -> int:
        return self.context.settings.epochs

    def micro_batches(self, epoch: int) -> int:
        return self.steps_per_epoch

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]:
        order = self.epoch_order(epoch)
        for index in range(skip, self.steps_per_epoch):
            yield self.batch_of(order, index)

    def epoch_order(self, epoch: int) -> Tensor:
        """The training inputs' order in `epoch`: a permutation drawn from (seed, epoch) alone, so that a
        resumed run sees the batches an uninterrupted one would."""
        generator = torch.Generator(device="cpu")
        generator.manual_seed(self.context.settings.seed * 1_000_003 + epoch)
        count = self.data.train_inputs.shape[0]
        return torch.randperm(count, generator=generator, dtype=torch.int64).to(self.device)

    def batch_of(self, order: Tensor, index: int) -> tuple[Tensor, Tensor]:
        picked = order[index * self.batch : (index + 1) * self.batch]
        return self.data.train_inputs[picked], self.data.train_targets[picked]

    # ---- one phase step ------------------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        """Free phase, snapshot, nudged phase(s); the contrast to differentiate and the batch-mean loss at
        the free state (see the class docstring)."""
        inputs, targets = batch[0], batch[1]
        settings = self.settings
        with torch.no_grad():
            clamp = self.clamp(inputs, targets)
            free = self.phase(self.rest, clamp, "free", settings.free_steps)
            self.snapshot.save(free, self.model)
            plus = self.phase(free, clamp, "plus", settings.nudged_steps)
            if settings.nudging == "symmetric":
                start = self.snapshot.restore(self.model)
                low = self.phase(start, clamp, "minus", settings.nudged_steps)
            else:
                low = free
            loss = cost(free.units, clamp.target_units, clamp.output_mask).mean()
        with torch.enable_grad():
            contrast = (self.model.energy(plus.units, inputs) - self.model.energy(low.units, inputs)).mean()
        return StepLoss(contrast * self.contrast_scale, loss)

    def gradient_estimate(self, inputs: Tensor, targets: Tensor) -> tuple[tuple[Tensor, ...], Tensor]:
        """The two-phase estimate of the gradient of the batch-mean loss in every parameter, and that loss."""
        step = self.loss(self.model, (inputs, targets))
        parameters = [p for p in self.model.parameters() if p.requires_grad]
        return torch.autograd.grad(step.objective, parameters), step.value

    def clamp(self, inputs: Tensor, targets: Tensor) -> Clamp:
        """What the phases of one batch hold fixed."""
        model = self.model
        return Clamp(
            model.coupling(), model.drive(inputs), model.targets_to_units(targets), model.output_mask
        )

    def descent(self) -> Descent:
        s, model = self.settings, self.model
        return Descent(s.step_size, s.momentum, model.activation, model.state_gradient_function)

    def phase(self, start: RelaxState, clamp: Clamp, beta: str, steps: int) -> RelaxState:
        """Relax from `start` with nudging `beta` (`free`, `plus` or `minus`)."""
        return self.relax(start, clamp, self.betas[beta], steps, self.descent())

    def validate(self, model: nn.Module) -> float:
        """Mean loss of the free phase on the validation inputs."""
        s = self.settings
        units = free_relaxation(model, self.data.val_inputs, s.free_steps, s.step_size, s.momentum)
        target_units = model.targets_to_units(self.data.val_targets)
        return float(cost(units, target_units, model.output_mask).mean())

    def compiled(self, model: nn.Module) -> nn.Module | None:
        """torch.compile the relaxation (`CompiledRelax`), tried on one training batch (free and nudged, the
        shapes training uses; relaxation writes no tensor it was given). On failure it stays eager."""
        compile_config = self.context.settings.compile
        mode = compile_config.mode if compile_config.backend == "inductor" else None
        chunk = compiled_chunk(self.settings.free_steps, self.settings.nudged_steps)
        eager, self.relax = (
            self.relax,
            CompiledRelax(chunk, mode, compile_config.backend, compile_config.dynamic),
        )
        try:
            inputs, targets = self.batch_of(self.epoch_order(0), 0)
            with torch.no_grad():
                clamp = self.clamp(inputs, targets)
                free = self.phase(self.rest, clamp, "free", self.settings.free_steps)
                self.phase(free, clamp, "plus", self.settings.nudged_steps)
        except Exception:
            self.relax = eager
            raise
        log.info("relaxation compiled in chunks of %d steps", chunk)
        return model

    # ---- what the run records -----------------------------------------------------------------------

    def describe(self) -> str:
        return f"an energy model ({self.settings.model.name}) on {self.data.train_inputs.shape[0]} teacher samples"

    def header(self) -> dict[str, Any]:
        return {
            "trainer": TWO_PHASE_KIND,
            "train_samples": self.data.train_inputs.shape[0],
            "val_samples": self.data.val_inputs.shape[0],
        }

    def checkpoint_extras(self) -> dict[str, Any]:
        return {"model_config": config_to_dict(self.settings.model)}

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing beyond what the engine restores: the teacher task is rebuilt from its seed."""


def two_phase_engine(config: Config, out: str | Path, resume: bool = False) -> Engine:
    """The engine set up to train `config.twophase` into run folder `out` (resuming when asked)."""
    return Engine(config, TwoPhaseTask(config), out, resume=resume)


def train_two_phase(config: Config, out: str | Path, resume: bool = False) -> TrainSummary:
    """Train (or resume) `config.twophase` into run folder `out` (see `TwoPhaseTask`)."""
    return two_phase_engine(config, out, resume).fit()
