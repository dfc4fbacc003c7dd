"""Trainer parts: config sections, schedule, optimiser groups, checkpoints, metrics log meter."""

import itertools
import math
import re
from pathlib import Path

import pytest
import torch

from dynaforge.config import (
    ConfigError,
    ScheduleConfig,
    TrainConfig,
    config_from_dict,
    config_to_dict,
    load_config,
)
from dynaforge.models import ModelInput, ModelShape, build_model
from dynaforge.runs import CheckpointError, load_checkpoint, save_checkpoint
from dynaforge.train.log import IntervalMeter
from dynaforge.train.optim import build_optimizer, parameter_groups
from dynaforge.train.schedule import build_scheduler, warmup_cosine_factor


def test_new_config_sections_round_trip_and_dispatch_models() -> None:
    config = load_config(
        None, ["model.name=unet", "model.levels=2", "data.history=3", "train.grad_clip=null"]
    )
    assert type(config.model).__name__ == "UNetConfig" and config.model.levels == 2
    assert config.data.history == 3 and config.train.grad_clip is None
    assert config_from_dict(config_to_dict(config)) == config


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("model.widht=3", "unknown config key 'model.widht'. Did you mean 'model.width'"),
        (
            "model.name=transformer",
            "unknown model model.name='transformer'; valid models: flow, fno, latent, unet",
        ),
        ("train.lr=0", "train.lr=0.0: lr must be > 0"),
        ("data.stride=0", "data.stride=0: stride must be >= 1"),
        ("train.loss=l1", "train.loss='l1' is not valid; choose one of: mse, relative_l2"),
        ("evaluate.checkpoint=first", "evaluate.checkpoint='first' is not valid"),
        ("model.kernel_size=4", None),  # not a key of the default FNO section
    ],
)
def test_config_errors_name_the_key(override: str, message: str | None) -> None:
    with pytest.raises(ConfigError, match=None if message is None else re.escape(message)):
        load_config(None, [override])


def test_warmup_then_cosine() -> None:
    factors = [warmup_cosine_factor(s, warmup_steps=4, total_steps=14, min_ratio=0.1) for s in range(15)]
    assert factors[:4] == [0.25, 0.5, 0.75, 1.0]
    assert factors[4] == 1.0
    assert math.isclose(factors[9], 0.55)  # half-way through the decay: (1 + 0.1) / 2
    assert math.isclose(factors[14], 0.1)
    assert all(a >= b for a, b in itertools.pairwise(factors[4:]))


def test_scheduler_steps_the_optimiser_lr() -> None:
    model = torch.nn.Linear(2, 2)
    config = TrainConfig(lr=0.1, schedule=ScheduleConfig(warmup_fraction=0.25, min_lr_ratio=0.0))
    optimizer = build_optimizer(model, config)
    scheduler = build_scheduler(optimizer, config, 8)
    lrs = []
    for _ in range(8):
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert lrs[:3] == pytest.approx([0.05, 0.1, 0.1])
    assert lrs[-1] < 0.01


def test_no_weight_decay_on_biases_and_norms() -> None:
    model = build_model(load_config(None, ["model.name=unet"]).model, ModelShape(1, 1, 1))
    decay, no_decay = parameter_groups(model, 0.1)
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert all(p.ndim >= 2 for p in decay["params"]) and all(p.ndim == 1 for p in no_decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(model.parameters()))


def test_checkpoint_round_trip_with_weights_only(tmp_path: Path) -> None:
    config = load_config(None, ["model.width=4", "model.modes=2", "model.layers=1"])
    model = build_model(config.model, ModelShape(1, 1, 1))
    optimizer = build_optimizer(model, config.train)
    scheduler = build_scheduler(optimizer, config.train, 10)
    model(ModelInput(frames=torch.randn(1, 1, 1, 8, dtype=torch.float32))).frames.sum().backward()
    optimizer.step()
    state = {
        "format_version": 1,
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "config": config_to_dict(config),
        "epoch": 1,
    }
    path = tmp_path / "checkpoints" / "last.pt"
    save_checkpoint(path, state)
    assert [p.name for p in path.parent.iterdir()] == ["last.pt"]  # no temporary left behind
    raw = torch.load(path, weights_only=True)
    assert raw["config"] == config_to_dict(config)
    loaded = load_checkpoint(path)
    for key, value in model.state_dict().items():
        torch.testing.assert_close(loaded["model"][key], value)
    build_optimizer(model, config.train).load_state_dict(loaded["optimizer"])


def test_load_checkpoint_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="train first"):
        load_checkpoint(tmp_path / "missing.pt")
    torch.save({"weights": torch.zeros(1)}, tmp_path / "other.pt")
    with pytest.raises(CheckpointError, match="not a dynaforge checkpoint"):
        load_checkpoint(tmp_path / "other.pt")


def test_window_meter_means_skips_and_streaks() -> None:
    meter = IntervalMeter(torch.device("cpu"))
    good, bad = torch.tensor(False), torch.tensor(True)
    meter.add(torch.tensor(1.0), torch.tensor(4.0), good)
    meter.count(8)
    meter.add(torch.tensor(float("nan")), torch.tensor(float("inf")), bad)
    meter.count(8)
    meter.add(torch.tensor(3.0), torch.tensor(2.0), good)
    meter.count(8)
    summary = meter.read()
    assert summary["loss"] == 2.0 and summary["grad_norm"] == 3.0 and summary["steps"] == 3
    assert summary["skipped"] == 1 and summary["bad_streak"] == 1
    assert summary["samples_per_s"] > 0
    meter.reset()
    for _ in range(3):
        meter.add(torch.tensor(1.0), torch.tensor(1.0), bad)
    meter.reset()  # a streak carries over into the next window
    meter.add(torch.tensor(1.0), torch.tensor(1.0), bad)
    summary = meter.read()
    assert summary["bad_streak"] == 4 and summary["skipped"] == 1
    assert math.isnan(summary["loss"])
