"""Train the learned N-body step controller by differentiating through the integrator.

The loop (`Trainer.run`) takes, in order: the next window of a stream of systems, forward (integrate with
the controller choosing the steps), loss, backward, clip, optimiser step, schedule step, log, evaluate,
checkpoint; then optional L-BFGS iterations on fixed validation episodes. It runs on the trainer engine's
pieces: `build_optimizer` / `build_scheduler` (`timestepper.optimizer`, `timestepper.schedule`),
`MetricsLog` and `environment` (metrics.jsonl), `WandbLogger` (`timestepper.wandb`), `save_checkpoint` /
`load_checkpoint` and `rng_state`. What is particular to the controller: `build_training_systems` (the
data), `window_loss` (forward + loss, `TimestepperConfig` documents it), `detach_run` (the truncation
point), and the systems in flight that a checkpoint carries.

Run folder (`--out RUN`):
    config.yaml               the full resolved config
    metrics.jsonl             a `header` line (code version, environment), then `train` lines (every
                              `log_every` steps), `validation` lines (every `eval_every`) and `resume` lines
    checkpoints/last.pt       model, optimiser, schedule, step, phase, RNG states, validation losses, model
                              config, feature names, full config, the training systems (initial conditions
                              and episode start states) and the systems in flight, so a resume is exact
    checkpoints/best.pt       the same at the best validation loss so far
Checkpoints are written atomically and load with torch.load(..., weights_only=True).
"""

from __future__ import annotations

import logging
import math
import time
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from torch import Tensor

import dynaforge
from dynaforge.config import (
    Config,
    ConfigError,
    ControllerSystemsConfig,
    TimestepperConfig,
    TrainConfig,
    config_differences,
    config_to_dict,
    resolve_device,
    save_config,
)
from dynaforge.models.step_controller import (
    LearnedStep,
    StepControllerInput,
    StepControllerNet,
    build_step_controller_net,
)
from dynaforge.runs import CHECKPOINT_VERSION, RunFolder, load_checkpoint, save_checkpoint
from dynaforge.systems.nbody.control import (
    CLASSICAL_FEATURE,
    FEATURE_NAMES,
    TINY,
    ClassicalStep,
    Integrator,
    RunState,
    classical_timescale,
    pair_view,
)
from dynaforge.systems.nbody.initial import kepler_relative_state, random_cluster
from dynaforge.systems.nbody.physics import BodyParams, BodyState, make_params
from dynaforge.train.checkpoint import restore_rng_state, rng_state
from dynaforge.train.log import MetricsLog, WandbLogger, environment
from dynaforge.train.optim import build_optimizer
from dynaforge.train.schedule import build_scheduler

log = logging.getLogger(__name__)

CHECKPOINT_KIND = "nbody_step_controller"
SOFT_MAX_SHARPNESS = 8.0
RESUMABLE_KEYS = (
    "timestepper.steps",
    "timestepper.lbfgs_steps",
    "timestepper.log_every",
    "timestepper.eval_every",
    "timestepper.checkpoint_every",
    "timestepper.device",
    "timestepper.wandb",
)
"""Config keys a resumed run may change (the rest must match the checkpoint's config)."""


# --------------------------------------------------------------------------------------------------
# Training systems: initial conditions and window start states


def build_training_systems(
    config: ControllerSystemsConfig, seed: int, dtype: torch.dtype = torch.float64
) -> dict[str, Tensor]:
    """Episode start states, grouped by body count, as a flat dict of tensors (stored in checkpoints).

    Keys per group g (`kepler`, `cluster4`, ...): `g/positions` (S, N, 3), `g/velocities`, `g/masses`
    (S, N), `g/softening` (S,), and the systems' initial conditions `g/initial_positions` (P, N, 3),
    `g/initial_velocities`, `g/initial_masses`.
    """
    rng = np.random.default_rng(seed)
    systems: dict[str, Tensor] = {}
    if config.kepler:
        systems |= kepler_group(config, rng, dtype)
    for bodies in config.cluster_bodies if config.clusters else []:
        systems |= cluster_group(config, bodies, rng, dtype)
    return systems


def group_names(systems: dict[str, Tensor]) -> list[str]:
    return sorted({key.split("/")[0] for key in systems})


def kepler_group(
    config: ControllerSystemsConfig, rng: np.random.Generator, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Kepler orbits (a = 1, m1 + m2 = 1), `snapshots` states each at uniformly drawn eccentric anomalies."""
    count, snaps = config.kepler, config.snapshots
    low, high = config.eccentricity.low, config.eccentricity.high
    if config.eccentricity_draw == "log_pericentre":
        e = 1.0 - np.exp(rng.uniform(math.log(1.0 - high), math.log(1.0 - low), size=count))
    else:
        e = rng.uniform(low, high, size=count)
    q = rng.uniform(config.mass_ratio.low, config.mass_ratio.high, size=count)
    m1, m2 = 1.0 / (1.0 + q), q / (1.0 + q)
    anomalies = rng.uniform(0.0, 2.0 * math.pi, size=(count, snaps))
    positions, velocities, masses = [], [], []
    initial_x, initial_v = [], []
    for k in range(count):
        rel_x, rel_v = kepler_relative_state(1.0, e[k], 1.0, anomalies[k])  # (snaps, 3)
        pair_x = np.stack([-m2[k] * rel_x, m1[k] * rel_x], axis=1)
        pair_v = np.stack([-m2[k] * rel_v, m1[k] * rel_v], axis=1)
        positions.append(pair_x)
        velocities.append(pair_v)
        masses.append(np.tile([m1[k], m2[k]], (snaps, 1)))
        initial_x.append(pair_x[0])
        initial_v.append(pair_v[0])
    return {
        "kepler/positions": torch.as_tensor(np.concatenate(positions), dtype=dtype),
        "kepler/velocities": torch.as_tensor(np.concatenate(velocities), dtype=dtype),
        "kepler/masses": torch.as_tensor(np.concatenate(masses), dtype=dtype),
        "kepler/softening": torch.zeros(count * snaps, dtype=dtype),
        "kepler/initial_positions": torch.as_tensor(np.stack(initial_x), dtype=dtype),
        "kepler/initial_velocities": torch.as_tensor(np.stack(initial_v), dtype=dtype),
        "kepler/initial_masses": torch.as_tensor(np.stack([m1, m2], axis=1), dtype=dtype),
        "kepler/eccentricity": torch.as_tensor(e, dtype=dtype),
    }


def cluster_group(
    config: ControllerSystemsConfig, bodies: int, rng: np.random.Generator, dtype: torch.dtype
) -> dict[str, Tensor]:
    """Random virialised clusters integrated for `reference_time` with the classical criterion; window
    starts are states drawn uniformly over the reference run's steps (so close encounters, where steps
    are short, are drawn often)."""
    count = config.clusters
    softening = rng.uniform(config.softening.low, config.softening.high, size=count)
    drawn = [random_cluster(bodies, rng, 0.5, 1.5, 0.5, float(eps)) for eps in softening]
    x0 = torch.as_tensor(np.stack([b.positions for b in drawn]), dtype=dtype)
    v0 = torch.as_tensor(np.stack([b.velocities for b in drawn]), dtype=dtype)
    m = torch.as_tensor(np.stack([b.masses for b in drawn]), dtype=dtype)
    eps = torch.as_tensor(softening, dtype=dtype)
    params = make_params(m, eps)
    states: list[BodyState] = []
    integrator = Integrator(params, ClassicalStep(config.reference_eta), "leapfrog", reversible=True)
    with torch.inference_mode():
        run = integrator.start(BodyState(x0, v0))
        run = integrator.advance(
            run, config.reference_time, max_steps=200_000, on_step=lambda r, _: states.append(r.state)
        )
    x = torch.stack([s.positions for s in states], dim=1)  # (count, steps, N, 3)
    v = torch.stack([s.velocities for s in states], dim=1)
    picks = rng.integers(0, x.shape[1], size=(count, config.snapshots))
    index = torch.as_tensor(picks, dtype=torch.int64)
    rows = torch.arange(count).unsqueeze(1).expand_as(index)
    name = f"cluster{bodies}"
    snaps = config.snapshots
    return {
        f"{name}/positions": x[rows, index].reshape(count * snaps, bodies, 3).clone(),
        f"{name}/velocities": v[rows, index].reshape(count * snaps, bodies, 3).clone(),
        f"{name}/masses": m.repeat_interleave(snaps, dim=0),
        f"{name}/softening": eps.repeat_interleave(snaps, dim=0),
        f"{name}/initial_positions": x0,
        f"{name}/initial_velocities": v0,
        f"{name}/initial_masses": m,
    }


def window_starts(systems: dict[str, Tensor], group: str, index: Tensor) -> tuple[BodyState, BodyParams]:
    state = BodyState(systems[f"{group}/positions"][index], systems[f"{group}/velocities"][index])
    return state, make_params(systems[f"{group}/masses"][index], systems[f"{group}/softening"][index])


# --------------------------------------------------------------------------------------------------
# The loss


class WindowLoss(NamedTuple):
    loss: Tensor
    penalty_high: Tensor
    penalty_low: Tensor
    shape_cost: Tensor
    mean_log_step: Tensor
    fraction_above: Tensor
    max_error: Tensor


def window_loss(
    integrator: Integrator,
    run: RunState,
    window: int,
    band: tuple[float, float],
    reward: float,
    penalty: float,
    shape: float = 1.0,
) -> tuple[RunState, WindowLoss]:
    """Integrate `window` steps from `run` with the integrator's (learned) controller; the loss of
    `TimestepperConfig` (documented there), errors measured from the run's start."""
    low, high = band
    errors, log_steps = [], []
    for _ in range(window):
        run, info = integrator.step(run)
        errors.append(info.energy_error)
        log_steps.append(torch.log(info.dt / run.context.scales.time))
    error = torch.stack(errors, dim=1).clamp_min(1e-300)  # (B, window); the floor keeps log finite
    log_step = torch.stack(log_steps, dim=1)
    above = torch.relu(torch.log(error / high))
    below = torch.relu(torch.log(low / error.amax(1)))
    penalty_high = (above**2).mean()
    penalty_low = (below**2).mean()
    mean_log_step = log_step.mean()
    # Scale-free cost (see TimestepperConfig): unchanged when every step is scaled by one factor.
    soft_max = torch.logsumexp(SOFT_MAX_SHARPNESS * torch.log(error), dim=1) / SOFT_MAX_SHARPNESS
    # log of the mean step, not the mean log step: over a fixed time the step count is 1 / mean(h), and
    # the mean of log h would also penalise varying steps (Jensen), i.e. favour fixed-step behaviour.
    log_mean_step = torch.logsumexp(log_step, dim=1) - math.log(window)
    shape_cost = (0.5 * soft_max - log_mean_step).mean()
    loss = penalty * (penalty_high + penalty_low) - reward * mean_log_step + shape * shape_cost
    result = WindowLoss(
        loss,
        penalty_high.detach(),
        penalty_low.detach(),
        shape_cost.detach(),
        mean_log_step.detach(),
        (error > high).to(error.dtype).mean(),
        error.amax().detach(),
    )
    return run, result


class RunLoss(NamedTuple):
    loss: Tensor
    cost: Tensor
    """Mean over systems of log(N / T) + log(soft max error) / 2 (detached)."""
    penalty_high: Tensor
    penalty_low: Tensor
    steps_per_time: Tensor
    """Mean N / T (detached)."""
    max_error: Tensor
    """Largest energy error of any system over its run (detached)."""


def run_loss(
    integrator: Integrator,
    run: RunState,
    horizon: float,
    max_steps: int,
    segment: int,
    band: tuple[float, float],
    penalty: float,
    centre: float = 0.0,
    sharpness: float = SOFT_MAX_SHARPNESS,
) -> RunLoss:
    """The whole-run, scale-free loss of `TimestepperConfig` (`loss: run`): integrate every system of
    `run` for `horizon` time units (at most `max_steps` steps), the state detached every `segment` steps.

    The step count enters through sum_n sg(h_n) / h_n over the steps taken: its value is N and its
    gradient -sum_n d log h_n, the derivative of N = integral dt / h over a fixed time. For a learned
    controller h_n here is the network's proposal at the state y_n held fixed (its features detached): the
    step count of a converged run is the integral of dt / h along the exact trajectory, which does not
    depend on the steps, so d N / d theta = -sum_n d log h(y_n; theta) / d theta. Differentiating h_n
    through the trajectory instead (the state at step n moves along the orbit when earlier steps change)
    biases the gradient along the global step scale (docs/nbody.md). The soft maximum error M is the
    power mean (mean_n e_n^s)^(1/s) with s = `sharpness`, differentiated through the integrator.
    With `centre` > 0 (a `LearnedStep` controller) the loss adds centre * (mean over the steps and systems of
    the learned log-correction log(h_n / (scale eta0 tau_n)))^2, which pins its mean at zero so that only
    the shape of the steps is trained (the scale is the benchmark's knob).
    """
    low, high = band
    batch = run.time.shape[0]
    count = torch.zeros(batch, dtype=run.time.dtype, device=run.time.device)
    log_errors = []
    corrections = []
    taken = 0
    while True:
        active = (run.time < horizon * (1.0 - 1e-12)) & (run.steps < max_steps)
        if not bool(active.any()):
            break
        before = run
        run, info = integrator.step(run, torch.where(active, horizon, run.time))
        if centre > 0:
            correction = learned_correction(integrator, before, info.proposal)
            corrections.append(torch.where(active, correction, torch.zeros_like(correction)))
        ones = step_count_ones(integrator, before, run, info.proposal)
        count = count + torch.where(active, ones, torch.zeros_like(ones))
        log_error = torch.log(info.energy_error.clamp_min(1e-300))  # the floor keeps log finite
        # + log of the weight sg(h)/h (value 1), so sums over steps are integrals dt / h over a fixed time
        weighted = sharpness * log_error + torch.log(ones)
        log_errors.append(torch.where(active, weighted, torch.full_like(weighted, -math.inf)))
        taken += 1
        if taken % segment == 0:
            run = detach_run(run)
    weighted = torch.stack(log_errors, dim=1)  # (B, steps): s log e_n + log w_n
    # A power mean, (sum_n w_n e_n^s / sum_n w_n)^(1/s), not logsumexp: the latter grows by log(N) / s
    # with the step count, which would break the invariance to a global step scale.
    soft_max = (torch.logsumexp(weighted, dim=1) - torch.log(count.clamp_min(1.0))) / sharpness
    # Systems that reached the horizon covered a fixed time (run.time's gradient is zero there: the last
    # step lands on it) and their step count carries the gradient; systems stopped by `max_steps` took a
    # fixed number of steps and the time they covered carries it (for these the weights above are not
    # needed either, but their value is 1).
    reached = run.time >= horizon * (1.0 - 1e-12)
    count = torch.where(reached, count, count.detach())
    covered = run.time.clamp_min(1e-300)
    cost = torch.log(count / covered) + 0.5 * soft_max
    penalty_high = (torch.relu(soft_max - math.log(high)) ** 2).mean()
    penalty_low = (torch.relu(math.log(low) - soft_max) ** 2).mean()
    loss = cost.mean() + penalty * (penalty_high + penalty_low)
    if corrections:
        mean_correction = torch.stack(corrections, dim=1).sum() / count.detach().sum().clamp_min(1.0)
        loss = loss + centre * mean_correction**2
    return RunLoss(
        loss,
        cost.mean().detach(),
        penalty_high.detach(),
        penalty_low.detach(),
        (count / covered).detach().mean(),
        (weighted.amax() / sharpness).exp().detach(),
    )


def step_count_ones(integrator: Integrator, before: RunState, after: RunState, proposal: Tensor) -> Tensor:
    """sg(h) / h of a step (value 1): for a `LearnedStep`, h is the network's proposal at the step's start
    state with the features detached (the parameter-only derivative, see `run_loss`); otherwise, and when
    no gradient is taken (validation), `proposal`, without a second network call."""
    controller = integrator.controller
    features = after.context.features
    if not torch.is_grad_enabled() or not isinstance(controller, LearnedStep) or features is None:
        return proposal.detach() / proposal
    history = before.context.history
    log_step = controller.net(
        StepControllerInput(features.detach(), None if history is None else history.detach())
    ).log_step
    return torch.exp(log_step.detach() - log_step)


def learned_correction(integrator: Integrator, before: RunState, proposal: Tensor) -> Tensor:
    """log(h / (scale eta0 tau)) of a `LearnedStep` proposal h made at state `before` (tau the classical
    time scale there): the network's bounded correction c tanh(net / c), read back from the step."""
    controller = integrator.controller
    if not isinstance(controller, LearnedStep):
        raise ConfigError("timestepper.centre needs the learned controller")
    floor = TINY * before.context.scales.velocity
    tau = classical_timescale(pair_view(before.state, integrator.params), before.gravity.accelerations, floor)
    scale = torch.as_tensor(controller.scale, dtype=proposal.dtype, device=proposal.device)
    return torch.log(proposal / (scale * tau)) - controller.net.log_eta


def detach_run(run: RunState) -> RunState:
    """The same run state, cut from the autograd graph (the boundary of truncated back-propagation)."""
    return _map_tensors(run, lambda t: t.detach())


def _map_tensors(value: Any, fn: Any) -> Any:
    if isinstance(value, Tensor):
        return fn(value)
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_map_tensors(v, fn) for v in value))
    return value


def flatten_tensors(value: Any, prefix: str, out: dict[str, Tensor]) -> dict[str, Tensor]:
    """Every tensor of nested NamedTuples under dotted keys (for checkpoints)."""
    if isinstance(value, Tensor):
        out[prefix] = value.detach().cpu()
    elif isinstance(value, tuple) and hasattr(value, "_fields"):
        for name, item in zip(value._fields, value):
            flatten_tensors(item, f"{prefix}.{name}", out)
    return out


def restore_tensors(template: Any, prefix: str, flat: dict[str, Tensor], device: str) -> Any:
    """`template` with each tensor replaced by `flat`'s tensor of the same dotted key."""
    if isinstance(template, Tensor):
        return flat[prefix].to(device)
    if isinstance(template, tuple) and hasattr(template, "_fields"):
        return type(template)(
            *(restore_tensors(v, f"{prefix}.{n}", flat, device) for n, v in zip(template._fields, template))
        )
    return template


# --------------------------------------------------------------------------------------------------
# Checkpoints


def load_controller_checkpoint(path: Path, device: str = "cpu") -> dict[str, Any]:
    checkpoint = load_checkpoint(path, device)
    if checkpoint.get("kind") != CHECKPOINT_KIND:
        raise ConfigError(f"{path} is not a step-controller checkpoint (kind {checkpoint.get('kind')!r})")
    return checkpoint


def new_net(config: Config, device: str) -> StepControllerNet:
    model = config.timestepper.model
    with torch.random.fork_rng(devices=[]):  # seeded initial weights without touching the global RNG
        torch.manual_seed(config.timestepper.seed)
        net = StepControllerNet(
            features=len(FEATURE_NAMES),
            hidden=model.hidden,
            layers=model.layers,
            history=model.history,
            correction=model.correction,
            classical_feature=CLASSICAL_FEATURE,
            inputs=feature_indices(model.inputs),
        )
    return net.to(device)


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


def fix_scale(net: StepControllerNet, t: TimestepperConfig) -> None:
    """`loss: run` does not see a global step scale (the benchmark tunes it per system), so the two output
    biases, which shift every log step alike, are not trained (the overall level stays the classical one)
    unless `timestepper.train_bias` asks for it (then `centre` pins the level)."""
    if t.loss == "run" and not t.train_bias:
        net.linear.bias.requires_grad_(False)
        net.mlp[-1].bias.requires_grad_(False)


# --------------------------------------------------------------------------------------------------
# The loop


class Stream(NamedTuple):
    """A batch of systems of one group being integrated across optimiser steps."""

    params: BodyParams
    run: RunState
    windows: int
    """Windows done since the episode started."""


def engine_settings(t: TimestepperConfig) -> TrainConfig:
    """The trainer engine's view of the controller's optimiser settings (`build_optimizer`, `build_scheduler`)."""
    return TrainConfig(
        lr=t.lr,
        weight_decay=t.weight_decay,
        optimizer=t.optimizer,
        schedule=t.schedule,
        grad_clip=t.grad_clip,
    )


class Trainer:
    """Holds the objects of one controller training run; `run` is the loop.

    Built from the trainer engine's pieces: `build_optimizer` and `build_scheduler` (`timestepper.optimizer`,
    `timestepper.schedule`), `MetricsLog` (metrics.jsonl with an environment header; a resume drops the lines
    after the checkpoint), `WandbLogger` (optional), `save_checkpoint` / `load_checkpoint` (atomic, plain
    data) and `rng_state`. What is particular to the controller is the data (streams of systems integrated
    across optimiser steps, `window_loss`) and the optional L-BFGS phase.
    """

    def __init__(self, config: Config, out: str | Path, resume: bool = False) -> None:
        self.config = config
        self.t = config.timestepper
        self.paths = RunFolder(Path(out))
        self.device = resolve_device(self.t.device)
        self.scheme = config.system.integrator if config.system.name == "nbody" else "leapfrog"
        self.generator = torch.Generator(device="cpu")
        self.generator.manual_seed(self.t.seed)
        self.step = 0
        self.phase = "adam"
        self.best = math.inf
        self.val_loss = math.inf
        self.streams: dict[str, Stream] = {}
        self.metrics = MetricsLog(self.paths.metrics)
        self.wandb: WandbLogger | None = None
        if self.paths.last.exists() and resume:
            self.restore(load_controller_checkpoint(self.paths.last, self.device))
        elif self.paths.last.exists():
            raise ConfigError(
                f"{self.paths.root} already holds a training run; pass --resume to continue it or choose another --out"
            )
        else:
            if resume:
                log.info("no checkpoint in %s: starting a new run", self.paths.root)
            self.systems = {
                k: v.to(self.device) for k, v in build_training_systems(self.t.systems, self.t.seed).items()
            }
            self.net = new_net(config, self.device)
            fix_scale(self.net, self.t)
            self.optimizer = build_optimizer(self.net, engine_settings(self.t))
            self.scheduler = build_scheduler(self.optimizer, engine_settings(self.t), self.t.steps)
            self.paths.checkpoints.mkdir(parents=True, exist_ok=True)
            save_config(config, self.paths.config)
            self.metrics.start(self.header())
        self.groups = group_names(self.systems)
        if self.t.wandb.enabled:
            self.wandb = WandbLogger(
                self.t.wandb, self.paths.root, config_to_dict(config), "timestepper.wandb"
            )

    def header(self) -> dict[str, Any]:
        return {
            **environment(),
            "device": str(self.device),
            "parameters": sum(p.numel() for p in self.net.parameters()),
            "feature_names": list(FEATURE_NAMES),
            "groups": {g: int(self.systems[f"{g}/positions"].shape[0]) for g in group_names(self.systems)},
        }

    # ---- objects ---------------------------------------------------------------------------------

    def lbfgs(self) -> torch.optim.Optimizer:
        return torch.optim.LBFGS(
            self.net.parameters(), lr=1.0, max_iter=1, history_size=10, line_search_fn="strong_wolfe"
        )

    def integrator(self, params: BodyParams) -> Integrator:
        scale = self.t.run_scale if self.t.loss == "run" else 1.0
        return Integrator(params, LearnedStep(self.net, scale), self.scheme, reversible=True)

    def start_stream(self, group: str, index: Tensor) -> Stream:
        state, params = window_starts(self.systems, group, index)
        with torch.no_grad():
            run = self.integrator(params).start(state)
        return Stream(params, run, 0)

    # ---- checkpoints -------------------------------------------------------------------------------

    def payload(self) -> dict[str, Any]:
        streams: dict[str, Tensor] = {}
        for group, stream in self.streams.items():
            flatten_tensors(stream.params, f"{group}.params", streams)
            flatten_tensors(stream.run, f"{group}.run", streams)
            streams[f"{group}.windows"] = torch.tensor(stream.windows, dtype=torch.int64)
        return {
            "format_version": CHECKPOINT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            "kind": CHECKPOINT_KIND,
            "model": self.net.state_dict(),
            "model_config": dict(self.net.config),
            "feature_names": list(FEATURE_NAMES),
            "optimizer": self.optimizer.state_dict(),
            "scheduler": self.scheduler.state_dict(),
            "phase": self.phase,
            "step": self.step,
            "complete": self.step == self.t.steps + self.t.lbfgs_steps,
            "val_loss": self.val_loss,
            "best_val_loss": self.best,
            "generator": self.generator.get_state(),
            "rng": [rng_state()],
            "streams": streams,
            "config": config_to_dict(self.config),
            "training_systems": {k: v.cpu() for k, v in self.systems.items()},
        }

    def restore(self, checkpoint: dict[str, Any]) -> None:
        saved = checkpoint["config"]
        differences = [
            d
            for d in config_differences(saved, config_to_dict(self.config))
            if not d.split(":")[0].startswith(RESUMABLE_KEYS)
        ]
        if differences:
            raise ConfigError(
                f"cannot resume {self.paths.root}: the config differs from the checkpoint's "
                f"({'; '.join(differences[:5])}); use the saved {self.paths.config} or another --out"
            )
        self.systems = {k: v.to(self.device) for k, v in checkpoint["training_systems"].items()}
        self.net = build_step_controller_net(checkpoint["model_config"]).to(self.device)
        self.net.load_state_dict(checkpoint["model"])
        fix_scale(self.net, self.t)
        self.phase = checkpoint["phase"]
        settings = engine_settings(self.t)
        adam = build_optimizer(self.net, settings)
        self.scheduler = build_scheduler(adam, settings, self.t.steps)
        self.scheduler.load_state_dict(checkpoint["scheduler"])
        self.optimizer = adam if self.phase == "adam" else self.lbfgs()
        self.optimizer.load_state_dict(checkpoint["optimizer"])
        self.step = int(checkpoint["step"])
        self.best = float(checkpoint["best_val_loss"])
        self.val_loss = float(checkpoint["val_loss"])
        self.generator.set_state(checkpoint["generator"])
        restore_rng_state(checkpoint["rng"][0])
        flat = checkpoint["streams"]
        for group in sorted({key.split(".")[0] for key in flat}):
            size = flat[f"{group}.params.masses"].shape[0]
            template = self.start_stream(group, torch.zeros(size, dtype=torch.int64, device=self.device))
            params = make_params(
                flat[f"{group}.params.masses"].to(self.device),
                flat[f"{group}.params.softening"].to(self.device),
            )
            run = restore_tensors(template.run, f"{group}.run", flat, self.device)
            self.streams[group] = Stream(params, run, int(flat[f"{group}.windows"]))
        self.metrics.resume(self.step, {"kind": "resume", "step": self.step, "phase": self.phase})
        log.info("resumed %s at step %d (%s)", self.paths.root, self.step, self.phase)

    # ---- the loop ------------------------------------------------------------------------------------

    def run(self, stop_after: int | None = None) -> dict[str, Any]:
        """`steps` first-order steps, then `lbfgs_steps` L-BFGS iterations; returns the last validation
        metrics.

        `stop_after` ends the run early after that global step (a stand-in for a killed run in tests).
        """
        total = self.t.steps + self.t.lbfgs_steps
        last_eval: dict[str, Any] = {}
        started = time.perf_counter()
        try:
            while self.step < total:
                if self.step == self.t.steps and self.phase == "adam":
                    self.phase, self.optimizer = "lbfgs", self.lbfgs()
                metrics = self.adam_step() if self.phase == "adam" else self.lbfgs_step()
                self.step += 1
                if self.step % self.t.log_every == 0 or self.step == total:
                    self.log_metrics(metrics | {"seconds": time.perf_counter() - started})
                if self.step % self.t.eval_every == 0 or self.step == total:
                    last_eval = self.evaluate()
                if self.step % self.t.checkpoint_every == 0 or self.step == total:
                    save_checkpoint(self.paths.last, self.payload())
                if stop_after is not None and self.step >= stop_after:
                    break
        finally:
            if self.wandb is not None:
                self.wandb.finish()
        return last_eval

    def adam_step(self) -> dict[str, Any]:
        """One window of one group's stream: forward through the integrator, loss, backward, clip, step,
        schedule."""
        self.net.train()
        group = self.groups[self.step % len(self.groups)]
        if self.t.loss == "run":
            return self.run_step(group)
        stream = self.streams.get(group)
        if stream is None or stream.windows >= self.t.episode:
            stream = self.start_stream(group, self.draw_starts(group))
        self.optimizer.zero_grad(set_to_none=True)
        run, result = window_loss(
            self.integrator(stream.params),
            stream.run,
            self.t.window,
            self.band,
            self.t.reward,
            self.t.penalty,
            self.t.shape,
        )
        result.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.t.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        self.streams[group] = Stream(stream.params, detach_run(run), stream.windows + 1)
        return self.step_metrics(group, result, norm)

    def whole_run(self, group: str, index: Tensor) -> RunLoss:
        """`run_loss` of the systems `index` of `group`, from their start states."""
        stream = self.start_stream(group, index)
        horizon = self.t.horizon
        if group != "kepler" and self.t.cluster_horizon is not None:
            horizon = self.t.cluster_horizon
        return run_loss(
            self.integrator(stream.params),
            stream.run,
            horizon,
            self.t.run_steps,
            self.t.window,
            self.band,
            self.t.penalty,
            self.t.centre,
            self.t.sharpness,
        )

    def run_step(self, group: str) -> dict[str, Any]:
        """`loss: run`: one whole run of a fresh batch of `group`, backward, clip, step, schedule."""
        self.optimizer.zero_grad(set_to_none=True)
        result = self.whole_run(group, self.draw_starts(group))
        result.loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(self.net.parameters(), self.t.grad_clip)
        self.optimizer.step()
        self.scheduler.step()
        return self.train_metrics(
            group,
            result.loss,
            norm,
            cost=float(result.cost),
            penalty_high=float(result.penalty_high),
            penalty_low=float(result.penalty_low),
            steps_per_time=float(result.steps_per_time),
            max_error=float(result.max_error),
        )

    def evaluate_runs(self) -> dict[str, Any]:
        """`loss: run`: whole runs from the validation starts per group; best.pt when the loss improved."""
        self.net.eval()
        results: dict[str, Any] = {"kind": "validation", "step": self.step}
        losses = []
        with torch.no_grad():
            for group in self.groups:
                result = self.whole_run(group, self.validation_starts(group))
                losses.append(float(result.loss))
                results[f"val_{group}_cost"] = float(result.cost)
                results[f"val_{group}_steps_per_time"] = float(result.steps_per_time)
                results[f"val_{group}_max_error"] = float(result.max_error)
        return self.finish_validation(results, losses)

    def finish_validation(self, results: dict[str, Any], losses: list[float]) -> dict[str, Any]:
        """Add the mean validation loss to `results`, log them, and write best.pt when the loss improved."""
        results["val_loss"] = self.val_loss = sum(losses) / len(losses)
        results["best"] = self.val_loss < self.best
        self.log_metrics(results)
        if results["best"]:
            self.best = self.val_loss
            save_checkpoint(self.paths.best, self.payload())
        return results

    def lbfgs_step(self) -> dict[str, Any]:
        """One L-BFGS iteration on the validation episodes (a fixed, deterministic objective)."""
        self.net.train()

        def closure() -> Tensor:
            self.optimizer.zero_grad(set_to_none=True)
            return self.episode_losses(backward=True)[0]

        self.optimizer.step(closure)
        loss, result = self.episode_losses(backward=False)
        norm = torch.sqrt(sum((p.grad**2).sum() for p in self.net.parameters() if p.grad is not None))
        return self.step_metrics("all", result._replace(loss=loss), norm)

    @property
    def band(self) -> tuple[float, float]:
        return (self.t.band_low, self.t.band_high)

    def draw_starts(self, group: str) -> Tensor:
        size = self.systems[f"{group}/positions"].shape[0]
        return torch.randint(0, size, (self.t.batch,), generator=self.generator).to(self.device)

    def validation_starts(self, group: str) -> Tensor:
        size = self.systems[f"{group}/positions"].shape[0]
        # Every k-th start state: a fixed spread over the group's systems.
        return torch.arange(0, size, max(1, size // self.t.batch), device=self.device)[: self.t.batch]

    def episode_losses(self, backward: bool) -> tuple[Tensor, WindowLoss]:
        """Mean window loss over one full episode per group from the validation starts (back-propagated
        window by window when `backward`); also the first window's details."""
        total = torch.zeros((), dtype=torch.float64, device=self.device)
        count = 0
        first: WindowLoss | None = None
        for group in self.groups:
            stream = self.start_stream(group, self.validation_starts(group))
            integrator, run = self.integrator(stream.params), stream.run
            for _ in range(self.t.episode):
                with torch.set_grad_enabled(backward):
                    run, result = window_loss(
                        integrator, run, self.t.window, self.band, self.t.reward, self.t.penalty, self.t.shape
                    )
                if backward:
                    (result.loss / (self.t.episode * len(self.groups))).backward()
                    run = detach_run(run)
                total = total + result.loss.detach()
                count += 1
                first = result if first is None else first
        assert first is not None
        return total / count, first

    def evaluate(self) -> dict[str, Any]:
        """Fixed validation episodes per group; best.pt when the loss improved."""
        if self.t.loss == "run":
            return self.evaluate_runs()
        self.net.eval()
        results: dict[str, Any] = {"kind": "validation", "step": self.step}
        losses = []
        with torch.no_grad():
            for group in self.groups:
                stream = self.start_stream(group, self.validation_starts(group))
                integrator, run = self.integrator(stream.params), stream.run
                parts = []
                for _ in range(self.t.episode):
                    run, result = window_loss(
                        integrator, run, self.t.window, self.band, self.t.reward, self.t.penalty, self.t.shape
                    )
                    parts.append(result)
                losses.append(sum(float(r.loss) for r in parts) / len(parts))
                results[f"val_{group}_mean_log_step"] = sum(float(r.mean_log_step) for r in parts) / len(
                    parts
                )
                results[f"val_{group}_fraction_above"] = sum(float(r.fraction_above) for r in parts) / len(
                    parts
                )
                results[f"val_{group}_max_error"] = max(float(r.max_error) for r in parts)
                results[f"val_{group}_shape_cost"] = sum(float(r.shape_cost) for r in parts) / len(parts)
        return self.finish_validation(results, losses)

    def step_metrics(self, group: str, result: WindowLoss, norm: Tensor) -> dict[str, Any]:
        return self.train_metrics(
            group,
            result.loss,
            norm,
            penalty_high=float(result.penalty_high),
            penalty_low=float(result.penalty_low),
            shape_cost=float(result.shape_cost),
            mean_log_step=float(result.mean_log_step),
            fraction_above=float(result.fraction_above),
            max_error=float(result.max_error),
        )

    def train_metrics(self, group: str, loss: Tensor, norm: Tensor, **values: float) -> dict[str, Any]:
        """One `train` line: step, phase, group, lr, loss, the loss's own `values`, gradient norm."""
        return {
            "kind": "train",
            "step": self.step + 1,
            "phase": self.phase,
            "group": group,
            "lr": float(self.optimizer.param_groups[0]["lr"]),
            "loss": float(loss.detach()),
            **values,
            "grad_norm": float(norm),
        }

    def log_metrics(self, metrics: dict[str, Any]) -> None:
        self.metrics.write(metrics)
        if self.wandb is not None:
            self.wandb.log(metrics)
        if metrics["kind"] == "train" and "mean_log_step" in metrics:  # window loss
            log.info(
                "step %d %s loss %.4g log(h/T0) %.3f above-band %.2f |g| %.3g",
                metrics["step"],
                metrics["phase"],
                metrics["loss"],
                metrics["mean_log_step"],
                metrics["fraction_above"],
                metrics["grad_norm"],
            )
        elif metrics["kind"] == "train":  # whole-run loss
            log.info(
                "step %d %s loss %.4g steps/time %.4g max|dE/E| %.2e |g| %.3g",
                metrics["step"],
                metrics["phase"],
                metrics["loss"],
                metrics["steps_per_time"],
                metrics["max_error"],
                metrics["grad_norm"],
            )
        else:
            log.info("step %d validation loss %.4g", metrics["step"], metrics["val_loss"])


def train_controller(
    config: Config, out: str | Path, resume: bool = False, stop_after: int | None = None
) -> dict[str, Any]:
    """Train (or resume) a step controller into run folder `out`; returns the last validation metrics."""
    return Trainer(config, out, resume).run(stop_after)
