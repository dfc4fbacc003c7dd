"""Run folders and datasets written before the one-engine redesign (main at 48c4532) still load and give
the numbers they gave then.

tests/fixtures/main-48c4532/ holds a tiny Burgers dataset, a surrogate trained on it (best.pt), a step
controller (best.pt) and a two-phase energy model (last.pt), with the figures that code measured in
expected.json (the commands that made them are listed there). Measured here (Xeon with AMX, 1 and 2
threads) the figures are reproduced exactly; the float32 allowance below covers another CPU's kernels.
"""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch

from dynaforge.config import config_from_dict, load_config
from dynaforge.evaluate import evaluate
from dynaforge.models.loading import energy_model_from_checkpoint, load_learned_controller, load_model
from dynaforge.runs import load_checkpoint
from dynaforge.store import DatasetFolder, validate_dataset
from dynaforge.systems.nbody.control import Integrator
from dynaforge.systems.nbody.initial import kepler_orbit
from dynaforge.systems.nbody.physics import BodyState, make_params
from dynaforge.train.two_phase import two_phase_engine

OLD = Path(__file__).resolve().parents[1] / "fixtures" / "main-48c4532"
EXPECTED = json.loads((OLD / "expected.json").read_text())
FLOAT32 = 1e-4
"""Relative allowance on float32 evaluation figures across CPUs (0 difference measured on this one)."""

pytestmark = pytest.mark.usefixtures("one_thread")


def test_an_old_dataset_validates_and_reads() -> None:
    result = validate_dataset(OLD / "dataset", checksums=True)
    assert result.ok, result.errors
    fields = DatasetFolder(OLD / "dataset").read_split("train").fields
    assert fields.shape == (8, 11, 64, 1)
    assert load_config(OLD / "dataset" / "config.yaml").system.name == "burgers"


def test_an_old_run_config_keeps_the_clipping_it_was_trained_with() -> None:
    """Written before relative clipping (its resolved `grad_clip: 1.0`, no relative key): resuming it with
    its own config clips as it did, at 1 alone, not with the later relative default on top."""
    train = load_config(OLD / "surrogate" / "config.yaml").train
    assert (train.grad_clip, train.grad_clip_relative) == (1.0, None)


def test_an_old_surrogate_run_evaluates_to_the_figures_it_had(tmp_path: Path) -> None:
    run = tmp_path / "surrogate"
    shutil.copytree(OLD / "surrogate", run)
    metrics = evaluate(run, data=OLD / "dataset").metrics
    expected = EXPECTED["surrogate"]
    assert metrics["one_step_nrmse"] == pytest.approx(expected["one_step_nrmse"], rel=FLOAT32)
    assert metrics["rollout_nrmse"] == pytest.approx(expected["rollout_nrmse"], rel=FLOAT32)


def test_an_old_controller_steps_an_orbit_as_it_did() -> None:
    controller = load_learned_controller(OLD / "controller")
    orbit = EXPECTED["controller_orbit"]
    bodies = kepler_orbit(1.0, orbit["eccentricity"], 0.5, 0.5, orbit["from_mean_anomaly"])
    x = torch.as_tensor(bodies.positions, dtype=torch.float64).unsqueeze(0)
    v = torch.as_tensor(bodies.velocities, dtype=torch.float64).unsqueeze(0)
    params = make_params(torch.as_tensor(bodies.masses, dtype=torch.float64).unsqueeze(0), 0.0)
    integrator = Integrator(params, controller, "leapfrog", reversible=True)
    with torch.inference_mode():
        run = integrator.advance(integrator.start(BodyState(x, v)), orbit["time"], max_steps=100_000)
    assert int(run.steps[0]) == orbit["steps"]
    torch.testing.assert_close(
        run.state.positions[0].flatten(),
        torch.tensor(orbit["positions"], dtype=torch.float64),
        rtol=1e-9,
        atol=1e-12,
    )


def test_an_old_two_phase_model_validates_to_its_recorded_loss(tmp_path: Path) -> None:
    state = load_checkpoint(OLD / "two_phase" / "checkpoints" / "last.pt")
    model = energy_model_from_checkpoint(OLD / "two_phase")
    engine = two_phase_engine(config_from_dict(state["config"]), tmp_path / "unused")
    with torch.inference_mode():
        value = engine.task.validate(model)
    assert math.isclose(value, state["val_loss"], rel_tol=1e-9)  # float64 throughout


def test_every_old_checkpoint_goes_through_the_one_loader() -> None:
    kinds = {"surrogate": None, "controller": "nbody_step_controller", "two_phase": "two_phase"}
    for name, kind in kinds.items():
        order = ("last",) if name == "two_phase" else ("best",)
        model = load_model(OLD / name, kind, order=order)
        assert not model.training and sum(p.numel() for p in model.parameters()) > 0
