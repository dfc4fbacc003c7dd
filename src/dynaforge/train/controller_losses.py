"""The losses of the N-body step controller: differentiated through the integrator it drives.

`segment_loss` (`timestepper.loss: window`) integrates one segment (`timestepper.window` steps) of a stream
of systems; `run_loss`
(`loss: run`) integrates whole runs and is unchanged when every step is scaled by one factor.
`TimestepperConfig` documents both; docs/nbody.md derives the gradients.
"""

from __future__ import annotations

import math
from typing import Any, NamedTuple

import torch
from torch import Tensor

from dynaforge.config import ConfigError
from dynaforge.models.step_controller import LearnedStep, StepControllerInput
from dynaforge.systems.nbody.control import TINY, Integrator, RunState, classical_timescale, pair_view

SOFT_MAX_SHARPNESS = 8.0


class SegmentLoss(NamedTuple):
    loss: Tensor
    penalty_high: Tensor
    penalty_low: Tensor
    shape_cost: Tensor
    mean_log_step: Tensor
    fraction_above: Tensor
    max_error: Tensor


def segment_loss(
    integrator: Integrator,
    run: RunState,
    steps: int,
    band: tuple[float, float],
    reward: float,
    penalty: float,
    shape: float = 1.0,
) -> tuple[RunState, SegmentLoss]:
    """Integrate a segment of `steps` steps (`timestepper.window`) from `run` with the integrator's (learned)
    controller; the loss of `TimestepperConfig` (documented there), errors measured from the run's start."""
    low, high = band
    errors, log_steps = [], []
    for _ in range(steps):
        run, info = integrator.step(run)
        errors.append(info.energy_error)
        log_steps.append(torch.log(info.dt / run.context.scales.time))
    error = torch.stack(errors, dim=1).clamp_min(1e-300)  # (B, steps); the floor keeps log finite
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
    log_mean_step = torch.logsumexp(log_step, dim=1) - math.log(steps)
    shape_cost = (0.5 * soft_max - log_mean_step).mean()
    loss = penalty * (penalty_high + penalty_low) - reward * mean_log_step + shape * shape_cost
    result = SegmentLoss(
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
    # Error ~ h^order at a fixed step shape, so N M^(1/order) is unchanged by a global step scale.
    cost = torch.log(count / covered) + soft_max / integrator.scheme.order
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
