"""Relative gradient clipping (`train.grad_clip_relative`, `dynaforge.train.clip`)."""

from __future__ import annotations

import math

import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.train.clip import DECAY, WARMUP_STEPS, RelativeClip
from tests.conftest import CONFIGS

CPU = torch.device("cpu")


def test_the_first_steps_are_not_clipped_then_the_limit_is_a_multiple_of_their_mean() -> None:
    clip = RelativeClip(2.0, CPU)
    for _ in range(WARMUP_STEPS):
        limit = clip.limit()
        assert math.isinf(limit.item())
        clip.observe(torch.tensor(5.0), limit)
    # Ten norms of 5: the bias-corrected mean is 5 (to rounding), the limit twice that.
    assert clip.limit().item() == pytest.approx(10.0, rel=1e-5)


def test_a_spike_is_cut_and_does_not_raise_the_limit_much() -> None:
    clip = RelativeClip(2.0, CPU)
    for _ in range(50):
        clip.observe(torch.tensor(1.0), clip.limit())
    before, raw = clip.limit(), clip.mean.item()
    assert before.item() == pytest.approx(2.0, rel=1e-5)
    clip.observe(torch.tensor(1000.0), before)  # folded in as clipped: 2, not 1000
    expected = 2.0 * (DECAY * raw + (1 - DECAY) * 2.0) / (1 - DECAY**51)  # bias-corrected after 51 steps
    assert clip.limit().item() == pytest.approx(expected, rel=1e-5)
    assert clip.limit().item() < 1.05 * before.item()


def test_non_finite_norms_are_left_out() -> None:
    clip = RelativeClip(3.0, CPU)
    for _ in range(20):
        clip.observe(torch.tensor(4.0), clip.limit())
    state = clip.state_dict()
    for bad in (math.nan, math.inf):
        clip.observe(torch.tensor(bad), clip.limit())
    assert torch.equal(clip.mean, state["mean"]) and torch.equal(clip.count, state["count"])


def test_the_limit_follows_a_loss_of_any_scale() -> None:
    # The same sequence of norms times 1000: the same decisions (what an absolute limit cannot do).
    norms = torch.rand(200, generator=torch.Generator().manual_seed(0)) + 0.5
    norms[[40, 90, 150]] *= 20  # spikes
    decisions = []
    for scale in (1.0, 1000.0):
        clip, cut = RelativeClip(2.0, CPU), []
        for norm in norms * scale:
            limit = clip.limit()
            cut.append(bool(norm > limit))
            clip.observe(norm, limit)
        decisions.append(cut)
    assert decisions[0] == decisions[1]
    assert [i for i, c in enumerate(decisions[0]) if c] == [40, 90, 150]


def test_a_factor_below_one_is_refused_with_the_key() -> None:
    with pytest.raises(ConfigError, match="grad_clip_relative"):
        load_config(CONFIGS / "tiny.yaml", ["train.grad_clip_relative=0.5"])
