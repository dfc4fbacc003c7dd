"""`dynaforge tune`: a 6-trial study on the tiny preset is killed mid-trial, resumed, and its best trial evaluates."""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

optuna = pytest.importorskip("optuna")

from dynaforge.cli import main  # noqa: E402
from dynaforge.config import ConfigError, load_config  # noqa: E402
from dynaforge.evaluate import evaluate  # noqa: E402
from tests.conftest import CONFIGS  # noqa: E402

SPACE = {
    "train.lr": {"kind": "log_uniform", "low": 1.0e-3, "high": 3.0e-2},
    "model.width": {"kind": "int", "low": 4, "high": 12, "step": 4},
    "model.layers": {"kind": "categorical", "choices": [1, 2]},
}


def write_config(path: Path, base: Path, overrides: dict[str, Any], tune: dict[str, Any]) -> Path:
    data = yaml.safe_load(base.read_text())
    for section, values in overrides.items():
        data.setdefault(section, {}).update(values)
    data["tune"] = tune
    path.write_text(yaml.safe_dump(data))
    return path


def tiny_study_config(tmp_path: Path) -> Path:
    # 2 epochs per trial: the kill below lands after a trial's first epoch, with one left to run.
    # startup_trials=3: trials 0-2 are never pruned, so the killed trial 2 is still running when killed.
    return write_config(
        tmp_path / "tiny_tune.yaml",
        CONFIGS / "tiny.yaml",
        {
            "train": {"epochs": 2, "device": "cpu"},
            "evaluate": {"device": "cpu", "plot_samples": 0, "worst_samples": 0},
        },
        {"space": SPACE, "pruner": {"startup_trials": 3}, "heartbeat": 1, "seed": 1},
    )


def wait_for(path: Path, process: subprocess.Popen[str], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if process.poll() is not None:
            raise AssertionError(f"tune exited ({process.returncode}) before {path} appeared")
        if time.monotonic() > deadline:
            process.kill()
            raise AssertionError(f"{path} did not appear within {timeout} s")
        time.sleep(0.005)


@pytest.mark.slow
def test_study_is_killed_resumed_and_its_best_trial_evaluates(tmp_path: Path, tiny_data: Path) -> None:
    config = tiny_study_config(tmp_path)
    study = tmp_path / "study"
    args = ["tune", str(config), "--trials", "6", "--out", str(study), "--data", str(tiny_data)]
    process = subprocess.Popen(
        [sys.executable, "-m", "dynaforge.cli", "-q", *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
        text=True,
    )
    wait_for(study / "trials" / "0002" / "checkpoints" / "last.pt", process, timeout=60)
    process.send_signal(signal.SIGKILL)
    process.wait(timeout=10)

    storage = f"sqlite:///{study / 'study.db'}"
    killed = optuna.load_study(study_name="tiny_tune", storage=storage)
    states = {t.number: t.state for t in killed.trials}
    assert states[0] == states[1] == optuna.trial.TrialState.COMPLETE
    killed_mid_trial = states.get(2) == optuna.trial.TrialState.RUNNING
    # No wait for the heartbeat: the next process on this host sees that the trial's process is gone.
    assert main(["-q", *args]) == 0

    resumed = optuna.load_study(study_name="tiny_tune", storage=storage)
    by_state = {state: [t for t in resumed.trials if t.state == state] for state in optuna.trial.TrialState}
    finished = by_state[optuna.trial.TrialState.COMPLETE] + by_state[optuna.trial.TrialState.PRUNED]
    assert len(finished) == 6
    assert not by_state[optuna.trial.TrialState.RUNNING]
    if killed_mid_trial:
        # Trial 2 failed and was retried with its values, continuing its run folder from its checkpoint.
        (failed,) = by_state[optuna.trial.TrialState.FAIL]
        assert failed.number == 2
        (retry,) = [t for t in resumed.trials if t.system_attrs.get("failed_trial") == 2]
        assert retry.params == failed.params
        assert retry.user_attrs["run"] == failed.user_attrs["run"] == "trials/0002"
        assert retry.state == optuna.trial.TrialState.COMPLETE
        assert sorted(retry.intermediate_values) == [1, 2]
        records = [
            json.loads(line) for line in (study / "trials/0002/metrics.jsonl").read_text().splitlines()
        ]
        assert [r["kind"] for r in records].count("resume") == 1
        assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2]

    # The best trial is the complete trial with the lowest best validation loss; STUDY/best holds its run.
    complete = by_state[optuna.trial.TrialState.COMPLETE]
    best = min(complete, key=lambda t: t.value)
    summary = json.loads((study / "summary.json").read_text())
    assert summary["best"][0]["number"] == best.number
    assert json.loads((study / "best" / "trial.json").read_text())["params"] == best.params
    saved = load_config(study / "best" / "config.yaml")
    assert saved.train.lr == pytest.approx(best.params["train.lr"])
    assert saved.model.width == best.params["model.width"]
    for plot in ("optimization_history", "param_importances", "parallel_coordinate"):
        assert (study / "plots" / f"{plot}.png").stat().st_size > 1000, plot
    assert "Best trial" in (study / "summary.md").read_text()

    result = evaluate(study / "best", tiny_data)
    assert math.isfinite(result.metrics["one_step_nrmse"])
    assert result.metrics["one_step_nrmse"] < 1.0  # better than predicting zero change on normalised data


def test_pruner_stops_lagging_trials_and_a_rerun_adds_nothing(
    tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    # A percentile pruner keeping the best 1 %: after one startup trial, every later trial that is not
    # the best so far at its first epoch is pruned there.
    config = write_config(
        tmp_path / "prune.yaml",
        CONFIGS / "tiny.yaml",
        {"train": {"epochs": 2, "device": "cpu"}},
        {
            "space": {"train.lr": {"kind": "log_uniform", "low": 1.0e-5, "high": 1.0e-1}},
            "pruner": {"name": "percentile", "percentile": 1.0, "startup_trials": 1},
            "sampler": "random",
            "plots": False,
        },
    )
    study = tmp_path / "study"
    args = ["-q", "tune", str(config), "--trials", "4", "--out", str(study), "--data", str(tiny_data)]
    assert main(args) == 0
    loaded = optuna.load_study(study_name="prune", storage=f"sqlite:///{study / 'study.db'}")
    states = [t.state for t in loaded.trials]
    assert len(states) == 4
    pruned = [t for t in loaded.trials if t.state == optuna.trial.TrialState.PRUNED]
    assert pruned, "no trial was pruned"
    for trial in pruned:
        assert list(trial.intermediate_values) == [1]  # stopped after its first epoch
        assert (study / trial.user_attrs["run"] / "checkpoints" / "last.pt").exists()  # its run is kept
    assert main(args) == 0
    assert len(optuna.load_study(study_name="prune", storage=f"sqlite:///{study / 'study.db'}").trials) == 4


def test_multi_objective_study_keeps_a_pareto_front(
    tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    config = write_config(
        tmp_path / "pareto.yaml",
        CONFIGS / "tiny.yaml",
        {"train": {"epochs": 1, "device": "cpu"}},
        {
            "space": {"model.width": {"kind": "categorical", "choices": [4, 8, 16]}},
            "objectives": [
                {"metric": "best_val_loss", "direction": "minimize"},
                {"metric": "parameters", "direction": "minimize"},
            ],
            "plots": False,
        },
    )
    study = tmp_path / "study"
    assert (
        main(["-q", "tune", str(config), "--trials", "3", "--out", str(study), "--data", str(tiny_data)]) == 0
    )
    summary = json.loads((study / "summary.json").read_text())
    assert summary["directions"] == ["minimize", "minimize"]
    front = summary["best"]
    assert front and all(len(record["values"]) == 2 for record in front)
    # No member of the front is dominated by another trial.
    values = [record["values"] for record in summary["all"] if record["state"] == "complete"]
    for record in front:
        assert not any(v[0] <= record["values"][0] and v[1] < record["values"][1] for v in values)
    assert (study / "best" / "checkpoints" / "best.pt").exists()


def test_controller_study_tunes_the_nbody_step_controller(tmp_path: Path, one_thread: None) -> None:
    config = write_config(
        tmp_path / "ctrl.yaml",
        CONFIGS / "nbody_tiny.yaml",
        {},
        {
            # The key the controller's learning rate had before `timestepper.train` (read there now).
            "space": {"timestepper.lr": {"kind": "log_uniform", "low": 1.0e-4, "high": 1.0e-2}},
            "objectives": [{"metric": "val_kepler_max_error"}],
            "plots": False,
        },
    )
    study = tmp_path / "study"
    assert main(["-q", "tune", str(config), "--trials", "2", "--out", str(study)]) == 0
    loaded = optuna.load_study(study_name="ctrl", storage=f"sqlite:///{study / 'study.db'}")
    assert [t.state for t in loaded.trials] == [optuna.trial.TrialState.COMPLETE] * 2
    # One intermediate value per epoch (timestepper.eval_every = 2 of 4 steps: 2 epochs).
    assert all(sorted(t.intermediate_values) == [1, 2] for t in loaded.trials)
    assert all(0 < t.value < 1e-3 for t in loaded.trials)  # a relative energy error
    for trial in loaded.trials:  # the drawn rate is what the trial trained with
        saved = load_config(study / trial.user_attrs["run"] / "config.yaml")
        assert saved.timestepper.train.lr == pytest.approx(trial.params["timestepper.train.lr"])
    assert (study / "best" / "checkpoints" / "best.pt").exists()


def test_bad_space_and_objectives_fail_before_any_trial(tmp_path: Path, tiny_data: Path) -> None:
    base = load_config(CONFIGS / "tiny.yaml")
    from dynaforge.tune.space import check_space

    cases = {
        "model.widht": "no config key 'widht'",
        "system.viscosity.low": "decide the dataset",
    }
    for key, message in cases.items():
        config = write_config(
            tmp_path / "bad.yaml",
            CONFIGS / "tiny.yaml",
            {},
            {"space": {key: {"kind": "uniform", "low": 0.01, "high": 0.02}}},
        )
        with pytest.raises(ConfigError, match=message):
            check_space(load_config(config), ("system", "dataset"))
    # A value the config itself rejects (a width of 0) names the offending bound.
    config = write_config(
        tmp_path / "zero.yaml",
        CONFIGS / "tiny.yaml",
        {},
        {"space": {"model.width": {"kind": "int", "low": 0, "high": 4}}},
    )
    with pytest.raises(ConfigError, match="width must be >= 1"):
        check_space(load_config(config))
    with pytest.raises(ConfigError, match="available: best_val_loss"):
        config = write_config(
            tmp_path / "metric.yaml",
            CONFIGS / "tiny.yaml",
            {},
            {"space": SPACE, "objectives": [{"metric": "accuracy"}]},
        )
        from dynaforge.tune import run_study

        run_study(load_config(config), 1, tmp_path / "s", "s", data=tiny_data)
    assert base.tune.space == {}


def test_tune_section_rejects_unknown_keys_and_bad_dimensions(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"Did you mean 'tune\.space'"):
        load_config(None, ["tune.spcae=1"])
    bad = {
        "categorical without choices": ({"kind": "categorical"}, "non-empty `choices`"),
        "log-uniform from zero": ({"kind": "log_uniform", "low": 0.0, "high": 1.0}, "low > 0"),
        "uniform without bounds": ({"kind": "uniform"}, "needs `low` and `high`"),
        "fractional int bounds": ({"kind": "int", "low": 0.5, "high": 3}, "integer low and high"),
        "unknown field": ({"kind": "uniform", "low": 0, "high": 1, "scale": 2}, "unknown config key"),
    }
    for label, (dimension, message) in bad.items():
        path = tmp_path / "c.yaml"
        path.write_text(yaml.safe_dump({"tune": {"space": {"train.lr": dimension}}}))
        with pytest.raises(ConfigError, match=message):
            load_config(path)
        del label


@pytest.mark.slow
def test_two_processes_share_one_study(tmp_path: Path, tiny_data: Path) -> None:
    config = write_config(
        tmp_path / "shared.yaml",
        CONFIGS / "tiny.yaml",
        {"train": {"epochs": 1, "device": "cpu"}},
        {"space": SPACE, "plots": False, "pruner": {"name": "none"}},
    )
    study = tmp_path / "study"
    args = ["-q", "tune", str(config), "--trials", "4", "--out", str(study), "--data", str(tiny_data)]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "dynaforge.cli", *args], env=env, stderr=subprocess.PIPE, text=True
        )
        for _ in range(2)
    ]
    try:
        for process in processes:
            _, errors = process.communicate(timeout=120)
            assert process.returncode == 0, errors
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
                process.communicate()
    loaded = optuna.load_study(study_name="shared", storage=f"sqlite:///{study / 'study.db'}")
    complete = [t for t in loaded.trials if t.state == optuna.trial.TrialState.COMPLETE]
    # Each process stops once the study holds 4 finished trials; one still running then may add one more.
    assert 4 <= len(complete) <= 5 and len(complete) == len(loaded.trials)
    assert loaded.user_attrs["processes"] == 2  # both joined it (and drew from their own sampler streams)
    assert len({t.user_attrs["pid"] for t in complete}) == 2  # both worked on it
    assert len({t.user_attrs["run"] for t in complete}) == len(complete)  # each trial its own run folder
    assert len({tuple(sorted(t.params.items())) for t in complete}) >= 3  # their samplers draw apart


def test_a_trial_whose_values_do_not_fit_fails_alone(
    tmp_path: Path, tiny_data: Path, one_thread: None
) -> None:
    # 40 Fourier modes do not fit the 64-point grid (33 usable): the model refuses at its first call.
    config = write_config(
        tmp_path / "misfit.yaml",
        CONFIGS / "tiny.yaml",
        {"train": {"epochs": 1, "device": "cpu"}},
        {"space": {"model.modes": {"kind": "categorical", "choices": [40]}}},
    )
    study = tmp_path / "study"
    assert (
        main(["-q", "tune", str(config), "--trials", "2", "--out", str(study), "--data", str(tiny_data)]) == 0
    )
    loaded = optuna.load_study(study_name="misfit", storage=f"sqlite:///{study / 'study.db'}")
    assert [t.state for t in loaded.trials] == [optuna.trial.TrialState.FAIL] * 2
    assert "No trial has completed yet" in (study / "summary.md").read_text()
    assert not (study / "best").exists()
