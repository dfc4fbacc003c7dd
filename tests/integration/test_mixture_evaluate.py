"""Evaluating runs trained from the stream (issue 36: one model across families). A run pretrained on a
mixture is scored on a member's stored dataset (and zero-shot on another system of its grid and channels);
a streamed run that kept no dataset folder names what to pass instead of failing inside; a mixture config
is refused by `generate` and `run` before anything is written (they would store the `system` section the
mixture leaves at its defaults)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from dynaforge.cli import main

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


@pytest.mark.parametrize("command", ["generate", "run"])
def test_generate_and_run_refuse_a_mixture_config_before_writing(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([command, MIXTURE, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "mixture (burgers, heat)" in err and "dynaforge train" in err
    assert not out.exists()
