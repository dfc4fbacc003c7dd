"""Training of the learned N-body step controller, as a task of the engine (`ControllerTask`).

The controller is trained by differentiating through the integrator it drives (`train/controller_losses.py`)
on systems drawn once per run (`train/controller_systems.py`). To the engine an optimiser step is one
micro-batch of systems of one group (Kepler orbits, or clusters of one size, in turn), and an epoch is
`timestepper.eval_every` optimiser steps followed by validation on fixed start states; `timestepper.steps`
optimiser steps in all (the last epoch may be shorter). Everything else (optimiser, schedule, clipping,
non-finite guard, EMA, logging, checkpoints, exact resume, W&B) is the engine's, set by `timestepper.train`.

- `loss: window`: each group keeps a stream of `batch` systems integrated across optimiser steps, one
  segment of `timestepper.window` steps per step (truncated back-propagation: the state entering a segment
  is detached); after `episode` segments the stream restarts from freshly drawn start states.
- `loss: run`: each step integrates `batch` freshly drawn systems of the group for a whole run.

A checkpoint carries, beyond the engine's state, the training systems, the streams in flight and the
start-state generator, so a resumed run continues exactly; `kind` is `nbody_step_controller`, and
`model_config` and `feature_names` are what `dynaforge.models.loading` rebuilds the network from.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn

from dynaforge.config import Config, ConfigError, ControllerNetConfig
from dynaforge.models.loading import CONTROLLER_KIND
from dynaforge.models.step_controller import LearnedStep, StepControllerNet
from dynaforge.systems.nbody.control import CLASSICAL_FEATURE, FEATURE_NAMES, Integrator, RunState
from dynaforge.systems.nbody.physics import BodyParams, make_params
from dynaforge.train.capture import compile_model
from dynaforge.train.controller_losses import (
    RunLoss,
    SegmentLoss,
    detach_run,
    flatten_tensors,
    restore_tensors,
    run_loss,
    segment_loss,
)
from dynaforge.train.controller_systems import build_training_systems, group_names, segment_starts
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.task import EngineContext, StepLoss, TaskDefaults


class Stream(NamedTuple):
    """Systems of one group being integrated across optimiser steps (`loss: window`)."""

    index: Tensor
    """Their start states in the group."""
    params: BodyParams
    run: RunState
    segments: int
    """Segments done since the episode started."""


def new_net(model: ControllerNetConfig, seed: int) -> StepControllerNet:
    """The untrained network, its initial weights seeded by `seed` (the global generator left as it was)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return StepControllerNet(
            features=len(FEATURE_NAMES),
            hidden=model.hidden,
            layers=model.layers,
            history=model.history,
            correction=model.correction,
            classical_feature=CLASSICAL_FEATURE,
            inputs=feature_indices(model.inputs),
        )


def feature_indices(names: list[str] | None) -> list[int] | None:
    """Positions in `FEATURE_NAMES` of `timestepper.model.inputs` (None: every feature)."""
    if names is None:
        return None
    unknown = [name for name in names if name not in FEATURE_NAMES]
    if unknown:
        raise ConfigError(
            f"timestepper.model.inputs: unknown feature(s) {unknown}; valid names: {', '.join(FEATURE_NAMES)}"
        )
    return [FEATURE_NAMES.index(name) for name in names]


def fix_scale(net: StepControllerNet, loss: str, train_bias: bool) -> None:
    """`loss: run` does not see a global step scale (the benchmark tunes it per system), so the two output
    biases, which shift every log step alike, are not trained (the overall level stays the classical one)
    unless `timestepper.train_bias` asks for it (then `centre` pins the level)."""
    if loss == "run" and not train_bias:
        net.linear.bias.requires_grad_(False)
        net.mlp[-1].bias.requires_grad_(False)


class ControllerTask(TaskDefaults):
    """Train `config.timestepper`'s step controller (see the module docstring)."""

    kind: str | None = CONTROLLER_KIND
    capturable = False  # the integrator's loop has a data-dependent length and reads the clock on the host
    data_parallel = False

    def __init__(self, config: Config) -> None:
        self.config = config
        self.t = config.timestepper
        self.scheme = config.system.integrator if config.system.name == "nbody" else "leapfrog"
        self.streams: dict[str, Stream] = {}
        self.group = ""
        """The group of the micro-batch in flight (set by `epoch_batches`, read by `loss`)."""
        self.details: dict[str, float] = {}

    # ---- set-up ------------------------------------------------------------------------------------

    def setup(self, context: EngineContext) -> None:
        self.context = context
        self.device = context.device
        seed = context.settings.seed
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(seed)
        self.systems = {k: v.to(self.device) for k, v in build_training_systems(self.t.systems, seed).items()}
        self.groups = group_names(self.systems)

    def build_model(self) -> nn.Module:
        self.net = new_net(self.t.model, self.context.settings.seed).to(self.device)
        fix_scale(self.net, self.t.loss, self.t.train_bias)
        return self.net

    def epochs(self) -> int:
        return math.ceil(self.t.steps / self.t.eval_every)

    def micro_batches(self, epoch: int) -> int:
        steps = min(self.t.eval_every, self.t.steps - epoch * self.t.eval_every)
        return steps * self.context.settings.accumulate

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]:
        """The start states of each micro-batch of `epoch` after the first `skip`: the groups take turns by
        optimiser step (the micro-batches of one step share a group); a stream restarts (new start states
        drawn) when its episode is over. Lazy on purpose: draws follow the steps taken, so a checkpoint's
        generator state is that of its step."""
        accumulate = self.context.settings.accumulate
        first = epoch * self.t.eval_every * accumulate
        for micro in range(first + skip, first + self.micro_batches(epoch)):
            self.group = self.groups[(micro // accumulate) % len(self.groups)]
            yield (self.starts(self.group),)

    def starts(self, group: str) -> Tensor:
        if self.t.loss == "run":
            return self.draw_starts(group)
        stream = self.streams.get(group)
        if stream is None or stream.segments >= self.t.episode:
            stream = self.start_stream(self.net, group, self.draw_starts(group))
            self.streams[group] = stream
        return stream.index

    def draw_starts(self, group: str) -> Tensor:
        size = self.systems[f"{group}/positions"].shape[0]
        return torch.randint(0, size, (self.t.batch,), generator=self.generator).to(self.device)

    def validation_starts(self, group: str) -> Tensor:
        size = self.systems[f"{group}/positions"].shape[0]
        # Every k-th start state: a fixed spread over the group's systems.
        return torch.arange(0, size, max(1, size // self.t.batch), device=self.device)[: self.t.batch]

    def integrator(self, model: nn.Module, params: BodyParams) -> Integrator:
        scale = self.t.run_scale if self.t.loss == "run" else 1.0
        return Integrator(params, LearnedStep(model, scale), self.scheme, reversible=True)

    def start_stream(self, model: nn.Module, group: str, index: Tensor) -> Stream:
        starts = segment_starts(self.systems, group, index)
        with torch.no_grad():
            run = self.integrator(model, starts.params).start(starts.state)
        return Stream(index, starts.params, run, 0)

    # ---- the step and its measures -------------------------------------------------------------------

    @property
    def band(self) -> tuple[float, float]:
        return (self.t.band_low, self.t.band_high)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        """One segment of the group's stream, or one whole run of the batch's start states."""
        if self.t.loss == "run":
            result = self.whole_run(model, self.group, batch[0])
            return StepLoss(result.loss, result.loss, loss_details(result))
        stream = self.streams[self.group]
        run, segment = self.segment(model, stream.params, stream.run)
        self.streams[self.group] = stream._replace(run=detach_run(run), segments=stream.segments + 1)
        return StepLoss(segment.loss, segment.loss, loss_details(segment))

    def segment(self, model: nn.Module, params: BodyParams, run: RunState) -> tuple[RunState, SegmentLoss]:
        t = self.t
        return segment_loss(
            self.integrator(model, params), run, t.window, self.band, t.reward, t.penalty, t.shape
        )

    def whole_run(self, model: nn.Module, group: str, index: Tensor) -> RunLoss:
        """`run_loss` of the systems `index` of `group`, from their start states."""
        t = self.t
        stream = self.start_stream(model, group, index)
        horizon = t.cluster_horizon if group != "kepler" and t.cluster_horizon is not None else t.horizon
        return run_loss(
            self.integrator(model, stream.params),
            stream.run,
            horizon,
            t.run_steps,
            t.window,
            self.band,
            t.penalty,
            t.centre,
            t.sharpness,
        )

    def validate(self, model: nn.Module) -> float:
        """The mean over groups of the loss from fixed start states: a whole run each (`loss: run`) or one
        episode of segments (`loss: window`); per-group figures in `validation_details`."""
        losses = []
        self.details = {}
        for group in self.groups:
            index = self.validation_starts(group)
            if self.t.loss == "run":
                result = self.whole_run(model, group, index)
                losses.append(float(result.loss))
                details = {
                    "cost": float(result.cost),
                    "steps_per_time": float(result.steps_per_time),
                    "max_error": float(result.max_error),
                }
            else:
                stream = self.start_stream(model, group, index)
                run, parts = stream.run, []
                for _ in range(self.t.episode):
                    run, result = self.segment(model, stream.params, run)
                    parts.append(result)
                losses.append(sum(float(r.loss) for r in parts) / len(parts))
                details = {
                    "mean_log_step": sum(float(r.mean_log_step) for r in parts) / len(parts),
                    "fraction_above": sum(float(r.fraction_above) for r in parts) / len(parts),
                    "max_error": max(float(r.max_error) for r in parts),
                    "shape_cost": sum(float(r.shape_cost) for r in parts) / len(parts),
                }
            self.details |= {f"val_{group}_{name}": value for name, value in details.items()}
        return sum(losses) / len(losses)

    def validation_details(self) -> dict[str, float]:
        return dict(self.details)

    def compiled(self, model: nn.Module) -> nn.Module | None:
        """torch.compile of the network, tried on two integrator steps of the first group's validation
        systems forward and backward, so that compilation fails here if at all."""
        compiled = compile_model(model, self.context.settings.compile)
        stream = self.start_stream(model, self.groups[0], self.validation_starts(self.groups[0]))
        integrator = self.integrator(compiled, stream.params)
        with self.context.precision.autocast():
            run, _ = segment_loss(integrator, stream.run, 2, self.band, 1.0, 1.0, 1.0)
            run.time.sum().backward()
        return compiled

    # ---- what the run records -----------------------------------------------------------------------

    def describe(self) -> str:
        return f"the step controller on {', '.join(self.groups)} ({self.t.loss} loss)"

    def header(self) -> dict[str, Any]:
        return {
            "feature_names": list(FEATURE_NAMES),
            "groups": {g: int(self.systems[f"{g}/positions"].shape[0]) for g in self.groups},
        }

    def checkpoint_extras(self) -> dict[str, Any]:
        streams: dict[str, Tensor] = {}
        for group, stream in self.streams.items():
            streams[f"{group}.index"] = stream.index.detach().cpu()
            flatten_tensors(stream.params, f"{group}.params", streams)
            flatten_tensors(stream.run, f"{group}.run", streams)
            # The key keeps its first name: checkpoints written before the rename resume.
            streams[f"{group}.windows"] = torch.tensor(stream.segments, dtype=torch.int64)
        return {
            "model_config": dict(self.net.config),
            "feature_names": list(FEATURE_NAMES),
            "generator": self.generator.get_state(),
            "streams": streams,
            "training_systems": {k: v.cpu() for k, v in self.systems.items()},
        }

    def restore(self, state: dict[str, Any]) -> None:
        """The training systems, the start-state generator and the streams in flight of a checkpoint."""
        self.systems = {k: v.to(self.device) for k, v in state["training_systems"].items()}
        self.groups = group_names(self.systems)
        self.generator.set_state(state["generator"])
        flat = state["streams"]
        for group in sorted({key.split(".")[0] for key in flat}):
            index = flat[f"{group}.index"].to(self.device)
            template = self.start_stream(self.net, group, index)
            params = make_params(
                flat[f"{group}.params.masses"].to(self.device),
                flat[f"{group}.params.softening"].to(self.device),
            )
            run = restore_tensors(template.run, f"{group}.run", flat, str(self.device))
            self.streams[group] = Stream(index, params, run, int(flat[f"{group}.windows"]))


def loss_details(result: RunLoss | SegmentLoss) -> dict[str, Tensor]:
    """The detached terms and measures of a controller loss, by name (all its fields but the loss)."""
    return {name: value for name, value in result._asdict().items() if name != "loss"}


def controller_engine(
    config: Config, out: str | Path, resume: bool = False, progress: bool | None = None
) -> Engine:
    """The engine set up to train `config.timestepper`'s controller into run folder `out`."""
    return Engine(
        config,
        ControllerTask(config),
        out,
        settings=config.timestepper.train,
        settings_key="timestepper.train",
        progress=progress,
        resume=resume,
    )


def train_controller(
    config: Config, out: str | Path, resume: bool = False, progress: bool | None = None
) -> TrainSummary:
    """Train (or resume) a step controller into run folder `out`."""
    return controller_engine(config, out, resume, progress).fit()
