"""Optimisers: each one's update against its formula, decay groups, the Muon + AdamW hybrid's routing,
its conv-kernel proxies, state round trips, and skipping a step on the device."""

from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from dynaforge.config import OptimizerConfig, TrainConfig, load_config
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.train.optim import (
    HybridOptimizer,
    build_optimizer,
    masked_step,
    matrix_view,
    memory_order,
    route_parameters,
    step_unless,
)
from dynaforge.train.schedule import build_scheduler

pytestmark = pytest.mark.usefixtures("one_thread")


def train_config(name: str, **optimizer: object) -> TrainConfig:
    return TrainConfig(lr=0.1, weight_decay=0.01, optimizer=OptimizerConfig(name=name, **optimizer))


class Mixed(nn.Module):
    """One of every kind of parameter the hybrid routes."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.conv = nn.Conv1d(4, 6, kernel_size=3, padding=1)
        self.norm = nn.LayerNorm(6)
        self.linear = nn.Linear(6, 3)
        self.position = nn.Parameter(torch.zeros(1, 5, 4, dtype=torch.float32))  # 3-D, not a matrix

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens) + self.position  # (B, 5, 4)
        x = self.conv(x.transpose(1, 2)).transpose(1, 2)  # (B, 5, 6)
        return self.linear(self.norm(x)).sum()


def linear_away_from_zero() -> nn.Linear:
    """A Linear whose weights all have |w| >= 0.1, so Adam's first step is a clean sign step (|g| >> eps)."""
    model = nn.Linear(3, 2)
    with torch.no_grad():
        for p in model.parameters():
            magnitudes = torch.linspace(0.1, 1.0, p.numel(), dtype=torch.float32)
            signs = torch.tensor([1.0, -1.0], dtype=torch.float32).repeat(p.numel())[: p.numel()]
            p.copy_((magnitudes * signs).reshape(p.shape))
    return model


def quadratic_grad(model: nn.Module) -> None:
    """Gradients of sum(p^2) / 2 (= p), set directly."""
    for p in model.parameters():
        p.grad = p.detach().clone()


@pytest.mark.parametrize("fused", [False, True])
def test_sgd_momentum_matches_its_formula(fused: bool) -> None:
    model = linear_away_from_zero()
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = build_optimizer(model, train_config("sgd", momentum=0.9, fused=fused))
    assert isinstance(optimizer, torch.optim.SGD) and optimizer.defaults["fused"] is fused
    for _ in range(2):
        quadratic_grad(model)
        optimizer.step()
    for p, p0 in zip(model.parameters(), start):
        decay = 0.01 if p.ndim == 2 else 0.0
        g0 = p0 + decay * p0  # L2 penalty added to the gradient, weights only
        p1 = p0 - 0.1 * g0
        buf = 0.9 * g0 + (p1 + decay * p1)
        torch.testing.assert_close(p.detach(), p1 - 0.1 * buf)


@pytest.mark.parametrize(("name", "decoupled"), [("adamw", True), ("adam", False)])
def test_adam_family_first_step_and_decay_groups(name: str, decoupled: bool) -> None:
    model = linear_away_from_zero()
    start = [p.detach().clone() for p in model.parameters()]
    optimizer = build_optimizer(model, train_config(name))
    expected_cls = torch.optim.AdamW if decoupled else torch.optim.Adam
    assert type(optimizer) is expected_cls
    assert optimizer.defaults["fused"] is True  # available on CPU: chosen by fused=null
    assert sorted(g["weight_decay"] for g in optimizer.param_groups) == [0.0, 0.01]
    quadratic_grad(model)
    optimizer.step()
    for p, p0 in zip(model.parameters(), start):
        decay = 0.01 if p.ndim == 2 else 0.0
        if decoupled:  # p <- p (1 - lr wd) - lr sign(g): Adam's first step is a sign step
            expected = p0 * (1 - 0.1 * decay) - 0.1 * torch.sign(p0)
        else:  # coupled: the penalty joins the gradient, whose sign the first step takes
            expected = p0 - 0.1 * torch.sign(p0 + decay * p0)
        torch.testing.assert_close(p.detach(), expected, atol=1e-6, rtol=1e-5)


def test_hybrid_routes_every_parameter_to_the_right_optimiser() -> None:
    model = Mixed()
    muon, adamw = route_parameters(model, OptimizerConfig(name="muon"))
    assert {n for n, _ in muon} == {"conv.weight", "linear.weight"}
    assert {n for n, _ in adamw} == {
        "embed.weight",
        "conv.bias",
        "norm.weight",
        "norm.bias",
        "linear.bias",
        "position",
    }
    excluded, _ = route_parameters(model, OptimizerConfig(name="muon", muon_exclude=["linear.*"]))
    assert {n for n, _ in excluded} == {"conv.weight"}

    optimizer = build_optimizer(model, train_config("muon"))
    assert isinstance(optimizer, HybridOptimizer)
    inner_muon, inner_adamw = optimizer.inner["muon"], optimizer.inner["adamw"]
    assert isinstance(inner_muon, torch.optim.Muon) and isinstance(inner_adamw, torch.optim.AdamW)
    muon_params = [p for g in inner_muon.param_groups for p in g["params"]]
    assert all(p.ndim == 2 for p in muon_params)
    assert any(p is model.linear.weight for p in muon_params)
    proxy = next(p for p in muon_params if p is not model.linear.weight)
    assert proxy.shape == (6, 12) and proxy.data_ptr() == model.conv.weight.data_ptr()  # the kernel's memory
    no_decay = {id(p) for g in inner_adamw.param_groups if g["weight_decay"] == 0 for p in g["params"]}
    for module_param in (model.conv.bias, model.norm.weight, model.norm.bias, model.linear.bias):
        assert id(module_param) in no_decay
    assert id(model.embed.weight) not in no_decay and id(model.position) not in no_decay


def test_fno_spectral_weights_stay_on_adamw_unless_asked() -> None:
    config = load_config(None, ["model.width=4", "model.modes=3", "model.layers=1"])
    model = build_model(config.model, ModelShape(1, 1, 1))
    muon, adamw = route_parameters(model, OptimizerConfig(name="muon"))
    assert not any("spectral" in n for n, _ in muon)
    assert {"blocks.0.spectral.weight_real", "blocks.0.spectral.weight_imag"} <= {n for n, _ in adamw}
    assert all(n.endswith("weight") for n, _ in muon)  # the 1x1 conv kernels
    with_spectral, _ = route_parameters(model, OptimizerConfig(name="muon", muon_spectral=True))
    assert "blocks.0.spectral.weight_real" in {n for n, _ in with_spectral}


def test_muon_updates_a_conv_kernel_as_torch_muon_updates_its_matrix() -> None:
    torch.manual_seed(0)
    model = Mixed()
    reference = nn.Parameter(model.conv.weight.detach().clone().reshape(6, 12))
    reference_muon = torch.optim.Muon([reference], lr=0.1, weight_decay=0.01, adjust_lr_fn="match_rms_adamw")
    optimizer = build_optimizer(model, train_config("muon"))
    for _ in range(3):
        optimizer.zero_grad()
        model(torch.randint(0, 10, (2, 5))).backward()
        reference.grad = model.conv.weight.grad.detach().reshape(6, 12).clone()
        optimizer.step()
        reference_muon.step()
    torch.testing.assert_close(model.conv.weight.detach().reshape(6, 12), reference.detach())


def test_matrix_view_follows_memory_order() -> None:
    kernel = torch.randn(8, 3, 5, 5, dtype=torch.float32).to(memory_format=torch.channels_last)
    order = memory_order(kernel)
    assert order == [0, 2, 3, 1]
    view = matrix_view(kernel, order)
    assert view.shape == (8, 75) and view.data_ptr() == kernel.data_ptr()
    torch.testing.assert_close(view, kernel.permute(0, 2, 3, 1).reshape(8, 75))


def test_hybrid_state_dict_round_trips_and_schedulers_drive_both_halves() -> None:
    torch.manual_seed(0)
    model = Mixed()
    config = train_config("muon", muon_lr=0.05)
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 10)
    tokens = torch.randint(0, 10, (2, 5))
    for _ in range(2):
        optimizer.zero_grad()
        model(tokens).backward()
        optimizer.step()
        scheduler.step()
    saved = copy.deepcopy(optimizer.state_dict())
    saved_scheduler = scheduler.state_dict()
    saved_model = copy.deepcopy(model.state_dict())

    def next_step(
        model: nn.Module, optimizer: torch.optim.Optimizer, scheduler: object
    ) -> dict[str, torch.Tensor]:
        optimizer.zero_grad()
        model(tokens).backward()
        optimizer.step()
        scheduler.step()  # type: ignore[attr-defined]
        return {k: v.clone() for k, v in model.state_dict().items()}

    expected = next_step(model, optimizer, scheduler)
    fresh = Mixed()
    fresh.load_state_dict(saved_model)
    fresh_optimizer = build_optimizer(fresh, config)
    fresh_scheduler = build_scheduler(fresh_optimizer, config, 10)
    fresh_optimizer.load_state_dict(saved)
    fresh_scheduler.load_state_dict(saved_scheduler)
    got = next_step(fresh, fresh_optimizer, fresh_scheduler)
    for key in expected:
        assert torch.equal(got[key], expected[key]), key
    # The scheduler reaches both halves, each from its own peak lr.
    muon_lr = fresh_optimizer.inner["muon"].param_groups[0]["lr"]
    adamw_lr = fresh_optimizer.inner["adamw"].param_groups[0]["lr"]
    factor = fresh_scheduler.factor_at(fresh_scheduler.last_epoch)
    assert muon_lr == pytest.approx(0.05 * factor) and adamw_lr == pytest.approx(0.1 * factor)
    with pytest.raises(ValueError, match=re.escape("another train.optimizer.name")):
        fresh_optimizer.load_state_dict(build_optimizer(Mixed(), train_config("adamw")).state_dict())


@pytest.mark.parametrize(
    ("name", "fused"), [("adamw", True), ("adamw", False), ("sgd", True), ("sgd", False), ("muon", None)]
)
def test_a_found_inf_step_changes_nothing(name: str, fused: bool | None) -> None:
    torch.manual_seed(0)
    model = Mixed()
    optimizer = build_optimizer(model, train_config(name, fused=fused))
    tokens = torch.randint(0, 10, (2, 5))

    def step(skip: bool) -> None:
        optimizer.zero_grad()
        model(tokens).backward()
        step_unless(optimizer, torch.tensor(float(skip)))

    step(skip=True)  # the very first step: no state yet
    step(skip=False)
    params = {k: v.clone() for k, v in model.state_dict().items()}
    state = copy.deepcopy(optimizer.state_dict())
    for p in model.parameters():  # a poisoned gradient must not leak into parameters or state
        p.grad = torch.full_like(p, float("nan"))
    step_unless(optimizer, torch.tensor(1.0))
    for key, value in model.state_dict().items():
        assert torch.equal(value, params[key]), key
    after = optimizer.state_dict()
    flat_before = torch.nn.utils.parameters_to_vector(
        [
            v
            for s in _states(state)
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
    )
    flat_after = torch.nn.utils.parameters_to_vector(
        [
            v
            for s in _states(after)
            for v in s.values()
            if isinstance(v, torch.Tensor) and v.is_floating_point()
        ]
    )
    assert torch.equal(flat_before, flat_after)
    step(skip=False)  # and a good step still moves
    assert any(not torch.equal(v, params[k]) for k, v in model.state_dict().items())


@pytest.mark.parametrize(
    ("name", "fused"), [("sgd", True), ("sgd", False), ("adamw", True), ("adamw", False), ("muon", None)]
)
def test_a_skipped_first_step_leaves_the_optimiser_as_fresh(name: str, fused: bool | None) -> None:
    # Fused SGD would leave its momentum buffers uninitialised after a skipped first step.
    torch.manual_seed(0)
    skipped, fresh = Mixed(), Mixed()
    fresh.load_state_dict(skipped.state_dict())
    optimizers = [build_optimizer(m, train_config(name, fused=fused)) for m in (skipped, fresh)]
    tokens = torch.randint(0, 10, (2, 5))

    def step(model: nn.Module, optimizer: torch.optim.Optimizer, skip: bool) -> None:
        optimizer.zero_grad()
        model(tokens).backward()
        step_unless(optimizer, torch.tensor(float(skip)))

    step(skipped, optimizers[0], skip=True)
    for model, optimizer in zip((skipped, fresh), optimizers):
        for _ in range(2):
            step(model, optimizer, skip=False)
    for a, b in zip(skipped.parameters(), fresh.parameters()):
        assert torch.equal(a, b)


def _states(state_dict: dict) -> list[dict]:
    if "state" in state_dict:
        return list(state_dict["state"].values())
    return [s for inner in state_dict.values() for s in inner["state"].values()]


def test_masked_step_resets_state_created_by_a_skipped_first_step() -> None:
    model = nn.Linear(2, 2)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.1, foreach=True)
    for p in model.parameters():
        p.grad = torch.full_like(p, float("inf"))
    before = [p.detach().clone() for p in model.parameters()]
    masked_step(optimizer, torch.tensor(1.0))
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before))
    for state in optimizer.state.values():
        assert torch.count_nonzero(state["exp_avg"]) == 0 and float(state["step"]) == 0.0


def test_fno_trains_with_every_optimiser() -> None:
    config = load_config(None, ["model.width=8", "model.modes=4", "model.layers=2"])
    frames = torch.sin(torch.linspace(0, 6.28, 16, dtype=torch.float32)).expand(4, 1, 1, 16).contiguous()
    target = torch.roll(frames, 1, dims=-1)
    for name in ("adamw", "adam", "sgd", "muon"):
        torch.manual_seed(0)
        model = build_model(config.model, ModelShape(1, 1, 1))
        lr = 0.5 if name == "sgd" else 0.01
        optimizer = build_optimizer(model, TrainConfig(lr=lr, optimizer=OptimizerConfig(name=name)))
        losses = []
        for _ in range(30):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(ModelInput(frames=frames)).frames, target)
            loss.backward()
            optimizer.step()
            losses.append(loss.item())
        assert losses[-1] < 0.5 * losses[0], name
