"""N-body config checks, sampling, .npy files, controller features and the learned controller's output."""

from __future__ import annotations

import math
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.models.step_controller import (
    LearnedStep,
    StepControllerInput,
    StepControllerNet,
    build_step_controller_net,
)
from dynaforge.systems import build_system
from dynaforge.systems.nbody.control import (
    CLASSICAL_FEATURE,
    FEATURE_NAMES,
    controller_features,
    system_scales,
)
from dynaforge.systems.nbody.initial import kepler_orbit, load_initial_npy, random_cluster, save_initial_npy
from dynaforge.systems.nbody.physics import BodyState, gravity, make_params
from dynaforge.train.step_controller import feature_indices

CONFIGS = Path(__file__).resolve().parents[2] / "configs"


@pytest.fixture(autouse=True)
def one_thread() -> Iterator[None]:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


def cluster_batch(count: int, bodies: int, seed: int = 0) -> tuple[BodyState, object]:
    rng = np.random.default_rng(seed)
    drawn = [random_cluster(bodies, rng, 0.5, 2.0, 0.5, 0.01) for _ in range(count)]
    state = BodyState(
        torch.tensor(np.stack([b.positions for b in drawn]), dtype=torch.float64),
        torch.tensor(np.stack([b.velocities for b in drawn]), dtype=torch.float64),
    )
    return state, make_params(torch.tensor(np.stack([b.masses for b in drawn]), dtype=torch.float64), 0.01)


def test_config_errors_name_the_fix() -> None:
    with pytest.raises(ConfigError, match="set bodies=2"):
        load_config(None, ["system.name=nbody", "system.bodies=3"])
    with pytest.raises(ConfigError, match=r"eccentricity must lie in \[0, 1\)"):
        load_config(None, ["system.name=nbody", "system.initial.eccentricity=1.0"])
    with pytest.raises(ConfigError, match=r"Did you mean 'system\.softening'"):
        load_config(None, ["system.name=nbody", "system.softenning=0.1"])
    with pytest.raises(ConfigError, match=r"system\.control\.model=RUN"):
        from dynaforge.models.loading import controller_for

        controller_for(
            load_config(None, ["system.name=nbody", "system.control.kind=learned"]).system.control, 0.1
        )


def test_draw_samples_is_deterministic_and_laid_out_as_documented() -> None:
    config = load_config(CONFIGS / "nbody_plummer.yaml", ["system.bodies=5"])
    system = build_system(config.system)
    params, initial = system.draw_samples([np.random.default_rng(s) for s in (1, 2)])
    again, initial_again = system.draw_samples([np.random.default_rng(s) for s in (2,)])
    assert initial.shape == (2, 6, 5) and params.shape == (2, len(system.parameter_names))
    assert torch.equal(initial[1], initial_again[0]) and torch.equal(params[1], again[0])
    assert system.parameter_names[:5] == tuple(f"mass_{i}" for i in range(5))
    rollout = system.rollout(initial, params, steps=20, save_every=10)
    assert rollout.fields.shape == (2, 3, 6, 5)
    assert torch.equal(rollout.fields[:, 0], initial)
    np.testing.assert_allclose(rollout.time.numpy(), [0.0, 0.1, 0.2])


def test_rollout_rejects_a_missing_batch_axis() -> None:
    system = build_system(load_config(CONFIGS / "nbody_tiny.yaml").system)
    params, initial = system.draw_samples([np.random.default_rng(0)])
    # Under pytest the jaxtyping annotation catches it first; without it, the message names the fix.
    with pytest.raises(Exception, match=r"add a leading batch axis|Type-check"):
        system.rollout(initial[0], params)


def test_npy_round_trip(tmp_path: Path) -> None:
    state, params = cluster_batch(3, 4)
    rows = np.concatenate([params.masses.numpy(), params.softening.numpy()[:, None]], axis=1)
    path = tmp_path / "initial.npy"
    save_initial_npy(path, state.positions.numpy(), state.velocities.numpy(), rows)
    x, v, p = load_initial_npy(path)
    np.testing.assert_array_equal(x, state.positions.numpy())
    np.testing.assert_array_equal(v, state.velocities.numpy())
    np.testing.assert_array_equal(p, rows)
    with pytest.raises(ValueError, match="save_initial_npy"):
        np.save(tmp_path / "bad.npy", np.zeros((3, 4)))
        load_initial_npy(tmp_path / "bad.npy")


def features_of(state: BodyState, params: object) -> torch.Tensor:
    g = gravity(state.positions, params)
    return controller_features(state, g, params, system_scales(state, params, g.potential))


def test_features_are_permutation_invariant_and_even_in_the_velocities() -> None:
    state, params = cluster_batch(3, 7, seed=5)
    features = features_of(state, params)
    assert features.shape == (3, len(FEATURE_NAMES)) and torch.isfinite(features).all()
    order = torch.tensor([3, 0, 6, 1, 5, 2, 4])
    permuted = BodyState(state.positions[:, order], state.velocities[:, order])
    torch.testing.assert_close(
        features_of(permuted, params._replace(masses=params.masses[:, order])), features
    )
    reversed_ = BodyState(state.positions, -state.velocities)
    torch.testing.assert_close(features_of(reversed_, params), features)


@pytest.mark.parametrize("history", [0, 3])
def test_learned_step_is_positive_and_finite(history: int) -> None:
    torch.manual_seed(0)
    net = StepControllerNet(len(FEATURE_NAMES), hidden=16, layers=2, history=history)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(10.0 * torch.randn_like(p))  # a badly trained network: outputs far from the initial ones
    controller = LearnedStep(net)
    state, params = cluster_batch(5, 4, seed=1)
    state = BodyState(
        state.positions * torch.logspace(-6, 3, 5, dtype=torch.float64).view(-1, 1, 1), state.velocities
    )
    g = gravity(state.positions, params)
    context = controller.init(state, g, params)
    for _ in range(3):
        h, context = controller.step_size(state, g, params, context)
        assert h.shape == (5,) and bool((h > 0).all()) and bool(torch.isfinite(h).all())
    if history:
        assert context.history is not None and context.history.shape == (5, history, len(FEATURE_NAMES))


def test_untrained_controller_starts_as_the_classical_criterion() -> None:
    net = StepControllerNet(len(FEATURE_NAMES), hidden=8, layers=1)
    state, params = cluster_batch(2, 5)
    features = features_of(state, params)
    out = net(StepControllerInput(features)).log_step
    torch.testing.assert_close(out, features[:, 0] + np.log(0.02), rtol=0, atol=1e-9)  # soft clamp ~1e-11


def test_learned_step_stays_within_its_bounded_correction_of_the_classical_step() -> None:
    torch.manual_seed(1)
    net = StepControllerNet(len(FEATURE_NAMES), hidden=16, layers=2, correction=1.5)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(10.0 * torch.randn_like(p))  # far from the initial weights: corrections saturate
    state, params = cluster_batch(6, 5, seed=3)
    features = features_of(state, params)
    with torch.no_grad():
        ratio = net(StepControllerInput(features)).log_step - features[:, 0] - np.log(0.02)
    assert bool((ratio.abs() <= 1.5 + 1e-9).all())
    assert float(ratio.abs().max()) > 1.0  # the random weights do move the step


def test_closest_pair_apsis_features_on_a_kepler_orbit() -> None:
    # log(Q / q) = log((1 + e) / (1 - e)) whatever the phase; the orbit phase log(r / q) / log(Q / q) is 0 at
    # pericentre, 1 at apocentre and log(r / q) / log(Q / q) between (r = a (1 - e cos E)).
    e = 0.8
    anomalies = torch.tensor([0.0, 1.0, 2.0, math.pi], dtype=torch.float64)
    x, v, m = [], [], []
    for anomaly in anomalies.tolist():
        bodies = kepler_orbit(1.0, e, 0.4, 0.6, anomaly - e * math.sin(anomaly))  # mean anomaly of E
        x.append(bodies.positions)
        v.append(bodies.velocities)
        m.append(bodies.masses)
    state = BodyState(torch.as_tensor(np.stack(x)), torch.as_tensor(np.stack(v)))
    params = make_params(torch.as_tensor(np.stack(m)), 0.0)
    g = gravity(state.positions, params)
    features = controller_features(state, g, params, system_scales(state, params, g.potential))
    ratio = features[:, FEATURE_NAMES.index("log_closest_pair_apsis_ratio")]
    phase = features[:, FEATURE_NAMES.index("closest_pair_orbit_phase")]
    torch.testing.assert_close(ratio, torch.full_like(ratio, math.log(1.8 / 0.2)), rtol=1e-9, atol=1e-9)
    radius = 1.0 - e * torch.cos(anomalies)
    expected = torch.log(radius / 0.2) / math.log(1.8 / 0.2)
    torch.testing.assert_close(phase, expected, rtol=1e-7, atol=1e-7)
    assert float(phase[0]) == pytest.approx(0.0, abs=1e-7) and float(phase[-1]) == pytest.approx(
        1.0, abs=1e-7
    )


def test_network_reads_only_its_inputs() -> None:
    reads = [FEATURE_NAMES.index("closest_pair_alignment"), FEATURE_NAMES.index("closest_pair_orbit_phase")]
    net = StepControllerNet(len(FEATURE_NAMES), hidden=8, layers=2, inputs=reads)
    with torch.no_grad():
        net.mlp[-1].weight.fill_(0.3)
    features = torch.randn(6, len(FEATURE_NAMES), dtype=torch.float64)
    other = features.clone()
    ignored = [i for i in range(len(FEATURE_NAMES)) if i not in reads and i != CLASSICAL_FEATURE]
    other[:, ignored] += 5.0
    moved = features.clone()
    moved[:, reads[1]] += 0.5
    out = net(StepControllerInput(features)).log_step
    torch.testing.assert_close(net(StepControllerInput(other)).log_step, out, rtol=0.0, atol=0.0)
    assert (net(StepControllerInput(moved)).log_step - out).abs().min() > 0
    rebuilt = build_step_controller_net(net.config)
    rebuilt.load_state_dict(net.state_dict())
    torch.testing.assert_close(rebuilt(StepControllerInput(features)).log_step, out, rtol=0.0, atol=0.0)


def test_unknown_controller_input_names_the_valid_features() -> None:
    with pytest.raises(ConfigError, match="closest_pair_orbit_phase"):
        feature_indices(["closest_pair_phase"])
    assert feature_indices(["log_classical_timescale"]) == [0]
