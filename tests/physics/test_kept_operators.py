"""A spectral system keeps the operators of a rollout whose samples share one parameter row
(`SpectralSystem.shared_operators`): the next rollout of the same row reuses them and gets the bytes a fresh
system gets; another row, another config or another autograd mode gets its own."""

from __future__ import annotations

import dataclasses
import pickle

import numpy as np
import torch
from physics_helpers import system_from_overrides

from dynaforge.systems.pde.spectral import SpectralSystem

SETTINGS = {"resolution": 64, "dt": 0.01, "steps": 20, "save_every": 5, "viscosity": 0.02}


def burgers(**changes: object) -> SpectralSystem:
    return system_from_overrides("burgers", **{**SETTINGS, **changes})


def batch(system: SpectralSystem, size: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    return system.draw_samples([np.random.default_rng([7, i]) for i in range(size)])


def fields(system: SpectralSystem, params: torch.Tensor, initial: torch.Tensor) -> bytes:
    with torch.inference_mode():
        return system.rollout(initial, params).fields.numpy().tobytes()


def test_a_second_rollout_of_the_same_row_reuses_the_operators_and_gives_a_fresh_systems_bytes() -> None:
    system = burgers()
    params, initial = batch(system)
    first = fields(system, params, initial)
    (kept,) = system.kept_operators.values()
    second = fields(system, params, initial)
    assert list(system.kept_operators.values()) == [kept]  # the same object, not set up again
    assert second == first == fields(burgers(), params, initial)


def test_another_row_or_config_is_set_up_anew() -> None:
    system = burgers()
    params, initial = batch(system)
    fields(system, params, initial)

    other_row = params.clone()
    other_row[:, system.parameter_names.index("viscosity")] = 0.05
    got = fields(system, other_row, initial)
    assert len(system.kept_operators) == 2
    assert got == fields(burgers(viscosity=0.05), other_row, initial)
    assert got != fields(burgers(), params, initial)  # a stale kept operator would have given these

    # The config a system was built from is not meant to change, but if it does its operators follow it.
    system.config = dataclasses.replace(system.config, dt=0.005)
    got = fields(system, params, initial)
    assert len(system.kept_operators) == 3
    assert got == fields(burgers(dt=0.005), params, initial)


def test_inference_and_autograd_rollouts_keep_apart_operators() -> None:
    system = burgers()
    params, initial = batch(system)
    inference = fields(system, params, initial)
    # Inference tensors cannot take part in autograd: a grad-mode rollout must not be handed them.
    initial_grad = initial.clone().requires_grad_(True)
    trajectory = system.rollout(initial_grad, params).fields
    trajectory.sum().backward()
    assert initial_grad.grad is not None and bool(torch.isfinite(initial_grad.grad).all())
    assert len(system.kept_operators) == 2
    assert trajectory.detach().numpy().tobytes() == inference


def test_a_pickled_system_leaves_its_kept_operators_behind() -> None:
    system = burgers()
    params, initial = batch(system)
    before = fields(system, params, initial)
    copy = pickle.loads(pickle.dumps(system))  # nonlinear terms are closures: they do not pickle
    assert copy.kept_operators == {} and len(system.kept_operators) == 1
    assert fields(copy, params, initial) == before
