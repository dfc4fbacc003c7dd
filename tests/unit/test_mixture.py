"""The mixture stream (issue 36): trajectories drawn from several systems by (seed, index) alone, the same
windows whatever the number of generator processes, exact resume, the weights respected, and mixtures one
model cannot read refused before anything runs."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from dynaforge.cli import main
from dynaforge.config import ConfigError, config_from_dict, config_to_dict, load_config
from dynaforge.data.mixture import expected_share, mixture_plan
from dynaforge.data.sources import window_sources
from dynaforge.data.stream_workers import WorkerStreamedTrajectories
from dynaforge.seeds import Rows

REPO = Path(__file__).resolve().parents[2]
MIXTURE = REPO / "tests" / "unit" / "mixture_tiny.yaml"
CPU = torch.device("cpu")


def mixture(*overrides: str) -> Any:
    return load_config(MIXTURE, list(overrides))


def test_each_trajectory_is_its_members_own_sample_and_blocks_do_not_matter() -> None:
    plan = mixture_plan(mixture())
    whole = plan.rows("train", 0, 12, CPU)
    assert torch.equal(torch.cat([plan.rows("train", lo, lo + 3, CPU) for lo in range(0, 12, 3)]), whole)
    which = plan.members_of("train", 0, 12)
    assert set(which.tolist()) == {0, 1}  # both systems appear in the first 12 (seed 0)
    for j, s in enumerate(which.tolist()):
        k = int(plan.counts_before("train", j)[s])
        member = plan.members[s]
        own = member.system.sample_rows(Rows("train", k, k + 1, member.base_seed), CPU).fields[0]
        assert torch.equal(whole[j], own)
    # The val split draws its own members and samples.
    assert not torch.equal(plan.rows("val", 0, 4, CPU), whole[:4])


def test_the_weights_are_respected_within_a_binomial_bound() -> None:
    plan = mixture_plan(mixture("mixture.0.weight=3.0", "mixture.1.weight=1.0"))
    n = 40_000  # crosses chunk boundaries (4096 per chunk)
    counts = np.bincount(plan.members_of("train", 0, n), minlength=2)
    p = expected_share(plan)[0]
    assert p == pytest.approx(0.75)
    sigma = math.sqrt(n * p * (1 - p))  # 87 draws
    assert abs(counts[0] - n * p) < 5 * sigma
    assert list(plan.counts_before("train", n)) == counts.tolist()
    # A weight of 0 is never drawn.
    never = mixture_plan(mixture("mixture.0.weight=0.0"))
    assert set(never.members_of("train", 0, 5000).tolist()) == {1}


def epoch_windows(config: Any, epoch: int, skip: int = 0) -> list[torch.Tensor]:
    """Every batch of `epoch` after `skip` windows (inputs and targets side by side), from fresh sources (a
    run started or resumed); generator processes, if any, are stopped on closing."""
    sources = window_sources(config, None, CPU, seed=0, epochs=2)
    try:
        sources.order.start(epoch, skip=skip)
        batches = [torch.cat([b.inputs.flatten(1), b.targets.flatten(1)], 1) for b in sources.train_loader]
        stream = sources.trajectories
        workers = list(stream.processes) if isinstance(stream, WorkerStreamedTrajectories) else []
        assert len(workers) == config.data.stream.workers and all(p.is_alive() for p in workers)
    finally:
        sources.close()
    assert not any(p.is_alive() for p in workers)
    return batches


@pytest.mark.slow  # spawns 3 processes that import torch: 10-25 s on 2 busy cores
def test_the_same_windows_for_0_1_and_2_workers_and_a_resumed_run_sees_the_rest() -> None:
    streams = {w: mixture(f"data.stream.workers={w}") for w in (0, 1, 2)}
    in_thread = torch.cat(epoch_windows(streams[0], epoch=1))
    assert in_thread.shape[0] == 4 * 4 * 4  # 4 rounds of 4 trajectories x 4 windows
    assert torch.equal(torch.cat(epoch_windows(streams[2], epoch=1)), in_thread)
    # A run resumed after 12 windows of epoch 1, with one generator process, draws the rest.
    assert torch.equal(torch.cat(epoch_windows(streams[1], epoch=1, skip=12)), in_thread[12:])


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["mixture.0.weight=0.0", "mixture.1.weight=0.0"], r"mixture weights sum to 0; give at least one"),
        (["mixture.1.weight=-1.0"], r"mixture\[1\]\.weight"),
        (["data.stream.workers=-1"], r"data\.stream\.workers"),
        (["data.source=store"], r"a mixture is generated while training runs: set data\.source=stream"),
    ],
)
def test_bad_mixture_configs_are_refused_on_loading(overrides: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        mixture(*overrides)


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (
            ["mixture.1.system.resolution=16"],
            r"mixture\[1\]\.system \(heat\).*grid \(16,\) != \(32,\).*resolution",
        ),
        (["mixture.1.system.steps=20"], r"11 frames != 6.*mixture\[1\]\.system\.steps"),
    ],
)
def test_mixtures_one_model_cannot_read_are_refused_before_generating(
    overrides: list[str], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        window_sources(mixture(*overrides), None, CPU, seed=0, epochs=1)


def with_systems(*systems: dict[str, Any]) -> dict[str, Any]:
    """The tiny mixture's plain data with its members' systems replaced."""
    data = config_to_dict(mixture())
    data["mixture"] = [{"weight": 1.0, "system": system} for system in systems]
    return data


def test_a_mixture_of_other_channel_counts_or_of_a_non_grid_system_is_refused() -> None:
    grid = {"resolution": 16, "steps": 10, "save_every": 2}
    two_channels = with_systems({"name": "gray_scott", **grid}, {"name": "ks2d", **grid})
    with pytest.raises(ConfigError, match=r"mixture\[1\]\.system \(ks2d\).*1 channel\(s\) != 2"):
        window_sources(config_from_dict(two_channels), None, CPU, seed=0, epochs=1)
    with pytest.raises(ConfigError, match=r"mixture\[1\]\.system\.name='nbody' is not a grid system"):
        config_from_dict(with_systems({"name": "burgers"}, {"name": "nbody"}))


def test_the_cli_refuses_a_bad_mixture_with_one_line_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(["train", str(MIXTURE), "mixture.1.system.resolution=16", "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error:") and "resolution" in err[0]
    assert not out.exists()


def test_the_universal_presets_share_one_grid_and_one_model() -> None:
    pretrain = load_config(REPO / "configs" / "universal_pretrain.yaml")
    finetune = load_config(REPO / "configs" / "universal_finetune.yaml")
    plan = mixture_plan(pretrain)
    assert plan.names == ["burgers", "heat", "ks", "advection_diffusion_bounded"]
    assert plan.shape == (64,) and plan.channels == 1
    held_out = finetune.system  # Fisher-KPP: a family (a reaction term) no member of the mixture has
    assert held_out.name == "fisher_kpp_bounded" and held_out.name not in plan.names
    assert held_out.resolution == 64
    assert {member.system.n_frames for member in pretrain.mixture} == {held_out.n_frames} == {21}
    walled = pretrain.mixture[3].system  # the mixture's walled member has the held-out case's walls
    assert walled.boundary == held_out.boundary
    assert finetune.model == pretrain.model  # what --from checks
    assert (finetune.data.history, finetune.data.horizon) == (pretrain.data.history, pretrain.data.horizon)
