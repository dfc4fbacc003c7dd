"""Evaluating runs trained from the stream (issue 36: one model across families). A run pretrained on a
mixture is scored on a member's stored dataset (and zero-shot on another system of its grid and channels);
a streamed run that kept no dataset folder names what to pass instead of failing inside; a mixture config
is refused by `generate` and `run` before anything is written (they would store the `system` section the
mixture leaves at its defaults). `evaluate --members` scores a mixture run on each member's own test
trajectories, generated into the run folder."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.data.mixture import mixture_plan
from dynaforge.pipeline import shared_frame_dt
from dynaforge.seeds import Rows
from dynaforge.store import DatasetFolder

REPO = Path(__file__).resolve().parents[2]
MIXTURE = str(REPO / "tests" / "unit" / "mixture_tiny.yaml")
TINY = str(REPO / "configs" / "tiny.yaml")
SMALL = ["dataset.n_train=2", "dataset.n_val=1", "dataset.n_test=2"]
MEMBER = ["system.resolution=32", "system.dt=0.01", "system.steps=10", "system.save_every=2"]
"""mixture_tiny.yaml's Burgers member: its grid, step and frames."""


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch on the tiny Burgers + heat mixture, from the stream (no dataset folder)."""
    out = tmp_path_factory.mktemp("mixture") / "run"
    assert main(["-q", "train", MIXTURE, "--out", str(out), "--no-progress"]) == 0
    return out


def generated(folder: Path, config: str, overrides: list[str]) -> Path:
    assert main(["-q", "generate", config, *overrides, "--out", str(folder), "--no-progress"]) == 0
    return folder


def test_a_mixture_run_is_scored_on_a_members_dataset(pretrained: Path, tmp_path: Path) -> None:
    data = generated(tmp_path / "burgers", TINY, [*MEMBER, *SMALL])
    assert main(["-q", "evaluate", str(pretrained), "--data", str(data)]) == 0
    metrics = json.loads((pretrained / "eval-burgers" / "metrics.json").read_text())
    assert metrics["test_samples"] == 2
    assert np.all(np.isfinite(metrics["rollout_nrmse"])) and np.isfinite(metrics["one_step_nrmse"])


def test_a_mixture_run_is_scored_zero_shot_on_another_system_of_its_grid(
    pretrained: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = tmp_path / "ks.yaml"  # Kuramoto-Sivashinsky, not in the mixture, on its grid and frames
    config.write_text(
        "system: {name: ks, resolution: 32, domain_length: 22.0, dt: 0.01, steps: 10, save_every: 2}\n"
    )
    data = generated(tmp_path / "ks", str(config), SMALL)
    with caplog.at_level("INFO", logger="dynaforge.data.identity"):
        assert main(["-q", "evaluate", str(pretrained), "--data", str(data)]) == 0
    assert "zero-shot" in caplog.text and "ks" in caplog.text
    assert (pretrained / "eval-ks" / "metrics.json").exists()


def test_a_mixture_run_refuses_data_on_another_grid(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = generated(tmp_path / "coarse", TINY, ["system.resolution=16", *SMALL])
    capsys.readouterr()
    assert main(["evaluate", str(pretrained), "--data", str(data)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "space: (16,)" in err and "(32,)" in err
    assert not (pretrained / "eval-coarse").exists()


def test_a_mixture_run_without_data_names_its_members_and_writes_nothing(
    pretrained: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in pretrained.iterdir())
    assert main(["evaluate", str(pretrained)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--data" in err and "burgers or heat" in err
    assert "Traceback" not in err
    assert sorted(p.name for p in pretrained.iterdir()) == before


def test_a_streamed_run_without_data_is_told_the_command_that_makes_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    args = ["-q", "train", TINY, "data.source=stream", "system.resolution=32", *SMALL, "train.epochs=1"]
    assert main([*args, "--out", str(run), "--no-progress"]) == 0
    capsys.readouterr()
    assert main(["evaluate", str(run)]) == 2
    err = capsys.readouterr().err
    command = f"dynaforge generate {run / 'config.yaml'} --out DIR"
    assert err.count("error:") == 1 and command in err
    # the command it names makes data the run is scored on
    data = generated(tmp_path / "made", str(run / "config.yaml"), [])
    assert main(["-q", "evaluate", str(run), "--data", str(data)]) == 0


def test_generate_refuses_a_mixture_config_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["generate", MIXTURE, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "mixture (burgers, heat)" in err and "dynaforge train" in err
    assert not out.exists()


def test_run_of_a_mixture_trains_from_the_stream_and_scores_every_member(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "root"
    assert main(["run", MIXTURE, "--out", str(root), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "burgers" in out and "heat" in out and "eval-members.png" in out
    assert sorted(p.name for p in root.iterdir()) == ["run"]  # no dataset: the mixture streams
    run = root / "run"
    summary = json.loads((run / "eval-members.json").read_text())
    assert [row["member"] for row in summary] == ["burgers", "heat"]
    # the same config and seed as the module's `dynaforge train` run: the same weights, so the same scores
    trained = tmp_path / "trained"
    shutil.copytree(pretrained, trained)
    assert main(["-q", "evaluate", str(trained), "--members"]) == 0
    assert json.loads((trained / "eval-members.json").read_text()) == [
        {
            **row,
            "data": row["data"].replace(str(run), str(trained)),
            "evaluation": row["evaluation"].replace(str(run), str(trained)),
        }
        for row in summary
    ]
    # a second run skips training (the run is complete) and reuses the members' data
    checkpoint = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
    assert main(["-q", "run", MIXTURE, "--out", str(root), "--no-progress"]) == 0
    assert (run / "checkpoints" / "last.pt").stat().st_mtime_ns == checkpoint


def test_run_of_a_mixture_refuses_a_stage_and_an_empty_test_split(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main(["run", MIXTURE, "stage=all", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "stage=all" in err and "mixture" in err
    assert main(["run", MIXTURE, "dataset.n_test=0", "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "dataset.n_test" in err
    assert not out.exists()


def test_members_scores_the_run_on_each_members_own_test_trajectories(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    shutil.copytree(pretrained, run)  # the module's run stays as the other tests expect it
    assert main(["evaluate", str(run), "--members"]) == 0
    out = capsys.readouterr().out
    assert "burgers" in out and "heat" in out and "eval-members.json" in out
    summary = json.loads((run / "eval-members.json").read_text())
    assert [row["member"] for row in summary] == ["burgers", "heat"]
    figure = (run / "eval-members.png").read_bytes()
    assert figure.startswith(b"\x89PNG") and len(figure) > 10_000
    config = load_config(run / "config.yaml")
    plan = mixture_plan(config)
    for row, member in zip(summary, plan.members, strict=True):
        metrics = json.loads((run / f"eval-{row['member']}" / "metrics.json").read_text())
        assert metrics["system"] == row["system"] == row["member"]
        assert metrics["test_samples"] == row["test_samples"] == config.dataset.n_test
        assert metrics["one_step_nrmse"] == row["one_step_nrmse"] and np.isfinite(row["one_step_nrmse"])
        assert metrics["rollout_nrmse"] == row["rollout_nrmse"]
        # the stored test split is exactly what the stream draws for this member's test split
        stored = DatasetFolder(run / "members" / row["member"]).read_split("test").fields
        rows = Rows("test", 0, config.dataset.n_test, member.base_seed)
        streamed = member.system.sample_rows(rows, torch.device("cpu")).fields  # (N, T, C, *space)
        assert np.array_equal(stored, streamed.movedim(2, -1).numpy()), row["member"]
    # a second call generates nothing and gives the same figures
    shards = {p: p.stat().st_mtime_ns for p in (run / "members").rglob("*.h5")}
    assert main(["-q", "evaluate", str(run), "--members"]) == 0
    assert {p: p.stat().st_mtime_ns for p in (run / "members").rglob("*.h5")} == shards
    assert json.loads((run / "eval-members.json").read_text()) == summary
    assert (run / "eval-members.png").read_bytes() == figure


def test_members_is_refused_with_data_and_for_a_run_of_one_system(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    before = sorted(p.name for p in pretrained.iterdir())
    assert main(["evaluate", str(pretrained), "--members", "--data", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "--members" in err and "--data" in err and "Traceback" not in err
    assert sorted(p.name for p in pretrained.iterdir()) == before
    single = tmp_path / "single"
    single.mkdir()
    shutil.copy(TINY, single / "config.yaml")
    assert main(["evaluate", str(single), "--members"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "not on a mixture" in err and f"dynaforge evaluate {single}" in err
    assert sorted(p.name for p in single.iterdir()) == ["config.yaml"]


def test_the_members_figure_has_a_time_axis_only_when_the_members_frames_are_alike() -> None:
    assert shared_frame_dt([0.05, 0.05]) == 0.05
    assert shared_frame_dt([0.05, 1.0, 0.05]) is None  # the universal preset: Burgers 0.05, KS 1.0 apart
    assert shared_frame_dt([None, None]) is None
