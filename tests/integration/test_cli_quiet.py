"""What the command line says besides its results: one log format on stderr (Optuna's and matplotlib's lines
included), progress bars for `nbody simulate`, `--version`, and per-verb help that lists only what the verb
takes."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

from dynaforge import __version__
from dynaforge.cli import build_parser, main
from dynaforge.config import load_config
from tests.conftest import CONFIGS, run_cli

LOG_LINE = re.compile(r"(DEBUG|INFO|WARNING|ERROR|CRITICAL) \S")
"""The format `dynaforge.cli.main` sets up: `LEVEL message`."""


def foreign_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.strip() and not LOG_LINE.match(line)]


def test_tune_logs_optuna_in_dynaforge_format(tmp_path: Path, tiny_data: Path) -> None:
    pytest.importorskip("optuna")
    config = yaml.safe_load((CONFIGS / "tiny.yaml").read_text())
    config["train"].update({"epochs": 1, "device": "cpu"})
    config.setdefault("evaluate", {}).update({"device": "cpu", "plot_samples": 0, "worst_samples": 0})
    config["tune"] = {"space": {"train.lr": {"kind": "log_uniform", "low": 1e-3, "high": 3e-2}}, "seed": 1}
    path = tmp_path / "tiny_tune.yaml"
    path.write_text(yaml.safe_dump(config))
    result = run_cli(
        "tune", str(path), "--trials", "1", "--out", str(tmp_path / "study"), "--data", str(tiny_data),
        env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert foreign_lines(result.stderr) == []
    assert re.search(r"^INFO Trial 0 finished with value", result.stderr, re.MULTILINE), result.stderr


def test_nbody_simulate_logs_no_matplotlib_info(tmp_path: Path) -> None:
    result = run_cli(
        "nbody", "simulate", str(CONFIGS / "nbody.yaml"), "system.steps=20", "--out", str(tmp_path / "sim"),
        "--animation", "gif", "--frames", "3", env={"OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert "Animation.save" not in result.stderr
    assert foreign_lines(result.stderr) == []  # not a terminal: no progress bars either
    assert (tmp_path / "sim" / "animation.gif").exists()


def test_nbody_simulate_shows_progress_of_simulation_and_animation(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], one_thread: None
) -> None:
    from dynaforge.evaluate.nbody_report import simulate

    config = load_config(CONFIGS / "nbody.yaml", ["system.steps=20"])
    simulate(config, tmp_path, 1, "gif", 3, progress=True)
    bars = capsys.readouterr().err
    assert re.search(r"simulate: 100%.*t = 0\.2 / 0\.2 time units", bars), bars
    assert re.search(r"animation: 100%.* 3/3 ", bars), bars
    simulate(config, tmp_path, 1, "gif", 3, progress=False)
    assert capsys.readouterr().err == ""


def test_version_prints_the_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"dynaforge {__version__}\n"


def verb_help(*verb: str) -> str:
    parser = build_parser()
    for name in verb:
        parser = next(action.choices[name] for action in parser._actions if isinstance(action.choices, dict))
    return parser.format_help()


@pytest.mark.parametrize(
    ("verb", "absent"),
    [
        # evaluate takes evaluate.key=value overrides only, not overrides of any section (" key=value")
        (("evaluate",), ["--no-progress", "--resume", "--threads", "--out", " key=value", "stage="]),
        (("export",), ["--no-progress", "--resume", "--threads", "key=value"]),
        (("generate",), ["--resume", "--threads", "stage="]),
        (("tune",), ["--no-progress", "--resume", "stage="]),
        (("nbody", "simulate"), ["--resume", "--data", "stage="]),
        (("twophase", "train"), ["--no-progress", "stage="]),
    ],
)
def test_verb_help_lists_only_what_the_verb_takes(verb: tuple[str, ...], absent: list[str]) -> None:
    text = verb_help(*verb)
    assert [option for option in absent if option in text] == []


def test_train_and_run_help_name_the_stage_override() -> None:
    assert "stage=all" in verb_help("train")
    assert "stage=all" in verb_help("run")
