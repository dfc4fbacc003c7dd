"""The whole-run, scale-free controller loss (`timestepper.loss: run`): log(N / T) + log(soft max |dE/E|) / 2."""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.errors import RunError
from dynaforge.models.loading import load_learned_controller
from dynaforge.models.step_controller import LearnedStep, StepControllerNet
from dynaforge.systems.nbody.control import (
    CLASSICAL_FEATURE,
    FEATURE_NAMES,
    ClassicalStep,
    FixedStep,
    Integrator,
    StepController,
)
from dynaforge.systems.nbody.initial import kepler_orbit
from dynaforge.systems.nbody.physics import BodyState, make_params
from dynaforge.train.controller_losses import RunLoss, run_loss
from dynaforge.train.log import read_metrics
from dynaforge.train.step_controller import controller_engine, train_controller

TINY = Path(__file__).resolve().parents[2] / "configs" / "nbody_tiny.yaml"
PERIOD = 2.0 * math.pi  # a = 1, M = 1


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def one_orbit(controller: StepController, eccentricity: float = 0.9, segment: int = 64) -> RunLoss:
    """`run_loss` of one leapfrog orbit from apocentre (band penalties off), back-propagation truncated
    every `segment` steps."""
    bodies = kepler_orbit(1.0, eccentricity, 0.5, 0.5, math.pi)
    x = torch.as_tensor(bodies.positions, dtype=torch.float64).unsqueeze(0)
    v = torch.as_tensor(bodies.velocities, dtype=torch.float64).unsqueeze(0)
    params = make_params(torch.as_tensor(bodies.masses, dtype=torch.float64).unsqueeze(0), 0.0)
    integrator = Integrator(params, controller, "leapfrog", reversible=True)
    return run_loss(
        integrator, integrator.start(BodyState(x, v)), PERIOD, 100_000, segment, (1e-12, 1.0), 0.0
    )


def test_cost_does_not_change_when_every_step_is_scaled() -> None:
    # Leapfrog's error ~ h^2, so N * sqrt(max error) is the same at any global step scale; measured
    # spread 0.002 (classical) in log units, i.e. 0.2 % in evaluations at equal error.
    with torch.no_grad():
        coarse, fine = one_orbit(ClassicalStep(0.04)), one_orbit(ClassicalStep(0.02))
        fixed_coarse, fixed_fine = one_orbit(FixedStep(0.008)), one_orbit(FixedStep(0.004))
    assert float(fine.steps_per_time) > 1.9 * float(coarse.steps_per_time)
    assert float(coarse.max_error) > 3.5 * float(fine.max_error)
    assert abs(float(coarse.cost - fine.cost)) < 0.01
    assert abs(float(fixed_coarse.cost - fixed_fine.cost)) < 0.01


def test_cost_prefers_the_classical_criterion_to_a_fixed_step_on_an_eccentric_orbit() -> None:
    # At e = 0.9 the classical criterion needs >10x fewer evaluations than fixed dt at equal error
    # (benchmarks/nbody_timestep.py measures 14.5x over 10 orbits); the cost is the log of that.
    with torch.no_grad():
        classical, fixed = one_orbit(ClassicalStep(0.04)), one_orbit(FixedStep(0.008))
    assert float(fixed.cost - classical.cost) > math.log(8.0)


def test_cost_has_a_gradient_through_a_learned_controller() -> None:
    net = StepControllerNet(features=len(FEATURE_NAMES), hidden=8, classical_feature=CLASSICAL_FEATURE)
    with torch.no_grad():  # a non-zero last layer, else the gradient of every hidden weight is zero
        net.mlp[-1].weight.fill_(0.01)
    result = one_orbit(LearnedStep(net, 2.0), eccentricity=0.6)
    result.loss.backward()
    grads = [p.grad for p in net.parameters()]
    assert all(g is not None and torch.isfinite(g).all() for g in grads)
    assert sum(float(g.abs().sum()) for g in grads if g is not None) > 0


def test_training_with_the_run_loss_logs_the_cost(tmp_path: Path) -> None:
    config = load_config(
        TINY, ["timestepper.loss=run", "timestepper.horizon=0.5", "timestepper.run_steps=40"]
    )
    train_controller(config, tmp_path / "run")
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    train = [r for r in records if r["kind"] == "train"]
    validation = [r for r in records if r["kind"] == "epoch"]
    assert len(train) == 4 and all(math.isfinite(r["cost"]) for r in train)
    assert {"val_kepler_cost", "val_cluster3_steps_per_time"} <= validation[-1].keys()
    # The loss does not see a global step scale, so the output biases (which set it) stay untrained.
    net = load_learned_controller(tmp_path / "run").net
    assert float(net.linear.bias.detach().abs().max()) == 0.0
    assert float(net.mlp[-1].bias.detach().abs().max()) == 0.0
    assert float(net.linear.weight.detach().abs().max()) > 0.0
    with pytest.raises(ConfigError, match="lbfgs_steps"):
        load_config(TINY, ["timestepper.loss=run", "timestepper.lbfgs_steps=2"])


def test_missing_wandb_error_names_the_timestepper_key(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "wandb", None)  # `import wandb` raises ImportError
    config = load_config(TINY, ["timestepper.train.wandb.enabled=true"])
    with pytest.raises(RunError, match=r"timestepper\.train\.wandb\.enabled=true") as caught:
        train_controller(config, tmp_path / "run")
    assert " train.wandb" not in str(caught.value)


def test_run_scale_sets_the_training_step_scale(tmp_path: Path) -> None:
    # `loss: run` integrates with h = run_scale * eta0 * tau * exp(correction): the first proposals of
    # the same start states scale exactly with run_scale; the window loss ignores it.
    proposals = {}
    for loss, scale in (("run", 1.0), ("run", 0.25), ("window", 0.25)):
        config = load_config(TINY, [f"timestepper.loss={loss}", f"timestepper.run_scale={scale}"])
        task = controller_engine(config, tmp_path / f"{loss}{scale}").task
        stream = task.start_stream(task.net, "kepler", torch.arange(4))
        with torch.no_grad():
            _, info = task.integrator(task.net, stream.params).step(stream.run)
        proposals[(loss, scale)] = info.proposal
    torch.testing.assert_close(proposals[("run", 0.25)], 0.25 * proposals[("run", 1.0)], rtol=1e-12, atol=0.0)
    torch.testing.assert_close(proposals[("window", 0.25)], proposals[("run", 1.0)], rtol=1e-12, atol=0.0)
    with pytest.raises(ConfigError, match="run_scale"):
        load_config(TINY, ["timestepper.run_scale=0"])


def test_centre_pins_the_mean_learned_correction() -> None:
    # The pin reads the network's correction back from the steps: zero for an untrained controller (the
    # classical criterion), c tanh(b / c) when the linear path's bias is b, so the loss grows by
    # centre * (c tanh(b / c))^2 exactly (the cost itself only sees the step shape, unchanged here).
    bodies = kepler_orbit(1.0, 0.7, 0.5, 0.5, math.pi)
    x = torch.as_tensor(bodies.positions, dtype=torch.float64).unsqueeze(0)
    v = torch.as_tensor(bodies.velocities, dtype=torch.float64).unsqueeze(0)
    params = make_params(torch.as_tensor(bodies.masses, dtype=torch.float64).unsqueeze(0), 0.0)
    net = StepControllerNet(len(FEATURE_NAMES), hidden=8, classical_feature=CLASSICAL_FEATURE)
    losses = {}
    for bias, centre in ((0.0, 0.0), (0.0, 3.0), (0.5, 0.0), (0.5, 3.0)):
        with torch.no_grad():
            net.linear.bias.fill_(bias)
        integrator = Integrator(params, LearnedStep(net, 0.5), "leapfrog", reversible=True)
        start = integrator.start(BodyState(x, v))
        result = run_loss(integrator, start, 1e9, 60, 64, (1e-12, 1.0), 0.0, centre)
        losses[(bias, centre)] = float(result.loss.detach())
    assert losses[(0.0, 3.0)] == pytest.approx(losses[(0.0, 0.0)], abs=1e-12)
    expected = 3.0 * (2.0 * math.tanh(0.25)) ** 2
    assert losses[(0.5, 3.0)] - losses[(0.5, 0.0)] == pytest.approx(expected, rel=1e-9)
    with pytest.raises(ConfigError, match="centre"):
        load_config(TINY, ["timestepper.centre=-1"])


def test_fixed_time_cost_has_no_gradient_along_the_global_step_scale() -> None:
    # The cost of a whole orbit does not change when every step is scaled alike (first test), so its
    # derivative along the linear path's bias (which scales every step) must be ~0. It is when the step
    # count's gradient is taken at fixed states and the errors are back-propagated through the whole run
    # (measured: -0.02; finite difference 0.000). Truncated every 64 steps it is -0.63 (the bias that
    # docs/nbody.md records).
    net = StepControllerNet(len(FEATURE_NAMES), hidden=8, classical_feature=CLASSICAL_FEATURE)
    with torch.no_grad():  # a non-trivial step shape
        net.linear.weight[0, FEATURE_NAMES.index("closest_pair_orbit_phase")] = -0.5
    result = one_orbit(LearnedStep(net, 2.0), eccentricity=0.9, segment=100_000)
    result.loss.backward()
    assert net.linear.bias.grad is not None
    assert abs(float(net.linear.bias.grad)) < 0.1
    with torch.no_grad():  # and the cost indeed does not move: finite difference over a 10 % scale change
        net.linear.bias.fill_(0.1)
        shifted = one_orbit(LearnedStep(net, 2.0), eccentricity=0.9, segment=100_000)
    assert abs(float(shifted.cost - result.cost)) < 0.01
