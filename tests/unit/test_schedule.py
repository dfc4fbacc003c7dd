"""Learning-rate schedules: each shape with its warmup, plateau reductions, state round trips."""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch

from dynaforge.config import ConfigError, ScheduleConfig, TrainConfig, load_config
from dynaforge.train.schedule import (
    Schedule,
    epochs_in_budget,
    epochs_to_run,
    schedule_factor,
    schedule_intervals,
)


def factors(config: ScheduleConfig, total: int) -> list[float]:
    return [schedule_factor(t, config, total) for t in range(total)]


def test_constant_with_warmup() -> None:
    assert factors(ScheduleConfig(name="constant", warmup_fraction=0.2), 10) == [0.5, 1.0] + [1.0] * 8


def test_step_decay_after_warmup() -> None:
    config = ScheduleConfig(name="step", warmup_fraction=0.2, step_size=3, gamma=0.1)
    expected = [0.5, 1.0, 1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.01, 0.01]
    assert factors(config, 10) == pytest.approx(expected)


def test_cosine_reaches_its_floor_at_the_end() -> None:
    config = ScheduleConfig(name="cosine", warmup_fraction=0.25, min_lr_ratio=0.1)
    values = factors(config, 13)
    assert values[:3] == pytest.approx([1 / 3, 2 / 3, 1.0])
    assert values[3] == 1.0 and all(a >= b for a, b in itertools.pairwise(values[3:]))
    assert schedule_factor(13, config, 13) == pytest.approx(0.1)
    assert values[8] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 5 / 10)))


def test_no_warmup_starts_at_the_peak() -> None:
    for name in ("constant", "step", "cosine", "plateau"):
        assert schedule_factor(0, ScheduleConfig(name=name, warmup_fraction=0.0), 10) == 1.0


def test_plateau_lowers_the_lr_after_patience_and_stops_at_the_floor() -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    config = ScheduleConfig(name="plateau", warmup_fraction=0.0, patience=1, factor=0.5, min_lr_ratio=0.2)
    schedule = Schedule(optimizer, config, total=20)
    lrs = []
    for loss in [1.0, 0.5, 0.5, 0.5, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4, 0.4]:
        schedule.observe(loss)
        lrs.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        schedule.step()
    # improvements at 1.0, 0.5, 0.4; two epochs without improvement (> patience 1) halve the lr
    assert lrs == pytest.approx([1.0, 1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.2, 0.2, 0.2])


def test_plateau_ignores_tiny_improvements_below_the_threshold() -> None:
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    config = ScheduleConfig(name="plateau", warmup_fraction=0.0, patience=0, threshold=0.01)
    schedule = Schedule(optimizer, config, total=5)
    schedule.observe(1.0)
    schedule.observe(0.995)  # less than 1% better: no improvement
    assert optimizer.param_groups[0]["lr"] == 0.5


def test_schedule_state_round_trips_with_weights_only(tmp_path: object) -> None:
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.3)
    config = ScheduleConfig(name="plateau", warmup_fraction=0.1, patience=0)
    schedule = Schedule(optimizer, config, total=30)
    for loss in (1.0, 2.0, 3.0):
        schedule.observe(loss)
        optimizer.step()
        schedule.step()
    path = f"{tmp_path}/schedule.pt"
    torch.save(schedule.state_dict(), path)
    fresh_optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.3)
    fresh = Schedule(fresh_optimizer, ScheduleConfig(name="plateau"), total=30)
    fresh.load_state_dict(torch.load(path, weights_only=True))
    assert fresh.plateau_scale == schedule.plateau_scale == 0.25
    assert fresh.last_epoch == 3 and fresh.factor_at(5) == schedule.factor_at(5)
    fresh_optimizer.step()
    fresh.step()
    optimizer.step()
    schedule.step()
    assert fresh.get_last_lr() == schedule.get_last_lr()


def test_intervals_per_step_or_epoch_and_config_errors() -> None:
    assert schedule_intervals(ScheduleConfig(interval="step"), epochs=3, steps_per_epoch=7) == 21
    assert schedule_intervals(ScheduleConfig(interval="epoch"), epochs=3, steps_per_epoch=7) == 3
    assert (
        load_config(None, ["train.schedule.name=step", "train.schedule.gamma=0.3"]).train.schedule.gamma
        == 0.3
    )
    with pytest.raises(ConfigError, match=re.escape("train.schedule.name='linear' is not valid")):
        load_config(None, ["train.schedule.name=linear"])
    with pytest.raises(ConfigError, match="warmup_fraction must be in"):
        TrainConfig(schedule=ScheduleConfig(warmup_fraction=1.0))


def test_a_budget_is_counted_in_whole_epochs_that_fit() -> None:
    # 10 micro-batches of 0.5 s and a 1 s validation: 6 s an epoch; 100 s hold 16 of them.
    assert epochs_in_budget(100.0, 10, 0.5, 1.0) == 16
    assert epochs_in_budget(5.0, 10, 0.5, 1.0) == 1  # at least one, even when none fits
    assert epochs_in_budget(100.0, 10, 0.0, 0.0) == 1  # nothing timed: one epoch, not infinitely many


def test_a_recount_is_the_epochs_done_and_the_whole_epochs_left() -> None:
    assert epochs_to_run(1, 60.0, 6.0) == 11
    assert epochs_to_run(1, 59.9, 6.0) == 10
    assert epochs_to_run(1, 5.9, 6.0) == 1  # no room for another
    assert epochs_to_run(1, -3.0, 6.0) == 1  # the first epoch already overran the budget
    assert epochs_to_run(1, 60.0, 0.0) == 1
    assert epochs_to_run(1, math.inf, 6.0) == 1
    assert epochs_to_run(4, 60.0, 6.0) == 14  # later: those done and the ones that fit
    assert epochs_to_run(4, -1.0, 6.0) == 4
