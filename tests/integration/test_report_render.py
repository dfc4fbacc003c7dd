"""The evaluation report as a person sees it: rendered in headless Chromium (skipped without a chromium
binary), its HTML (title, training curves, no trajectory drawn twice) and its figures' axes."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from dynaforge.evaluate.plots import (
    FieldAxes,
    Panel,
    high_correlation_figure,
    last_frame_figure,
    metric_curves_figure,
    snapshots_figure,
    space_time_figure,
    training_curves_figure,
)
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """RUN/eval/report.html of `dynaforge run configs/tiny.yaml` (burgers, 1D, FNO)."""
    root = tmp_path_factory.mktemp("tiny-report")
    run_cli("run", TINY, "--out", str(root), "--no-progress")
    return root / "run" / "eval" / "report.html"


@pytest.fixture
def chromium() -> str:
    """The chromium binary (a skip, before the tiny run is made, when there is none)."""
    binary = shutil.which("chromium") or shutil.which("chromium-browser")
    if binary is None:
        pytest.skip("no chromium binary on PATH (install Debian's `chromium` to render the report)")
    return binary


def run_chromium(binary: str, profile: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """Headless Chromium on its own profile folder (no shared state between runs)."""
    return subprocess.run(
        [binary, "--headless", "--no-sandbox", "--disable-gpu", f"--user-data-dir={profile}", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_report_renders_in_chromium_without_console_errors(
    chromium: str, report: Path, tmp_path: Path
) -> None:
    binary = chromium
    shot = tmp_path / "report.png"
    result = run_chromium(
        binary,
        tmp_path / "profile",
        "--window-size=1400,4000",
        f"--screenshot={shot}",
        "--enable-logging=stderr",
        "--v=0",
        report.as_uri(),
    )
    assert shot.is_file() and shot.stat().st_size > 10_000, result.stderr[-2000:]
    assert shot.read_bytes().startswith(PNG_SIGNATURE)
    console_errors = [
        line
        for line in result.stderr.splitlines()
        if "CONSOLE" in line and ("ERROR" in line or "Uncaught" in line)
    ]
    assert not console_errors, console_errors


def test_rendered_title_names_system_model_and_run(chromium: str, report: Path, tmp_path: Path) -> None:
    binary = chromium
    dom = run_chromium(binary, tmp_path / "profile", "--dump-dom", report.as_uri()).stdout
    title = re.search(r"<title>(.*?)</title>", dom, re.S)
    assert title is not None, dom[:500]
    assert "burgers" in title.group(1) and "fno" in title.group(1) and "run" in title.group(1)


def test_report_html_has_training_curves_and_no_trajectory_twice(report: Path) -> None:
    page = report.read_text()
    title = re.search(r"<title>(.*?)</title>", page).group(1)  # type: ignore[union-attr]
    assert title.startswith("burgers (1D), fno model: run ")
    assert "<pre>{" not in page  # training is a table and a figure, not a JSON blob
    assert "Training and validation loss from metrics.jsonl" in page
    assert (report.parent / "training.png").read_bytes().startswith(PNG_SIGNATURE)
    worst = re.findall(r"<figcaption>Worst sample \d+: test trajectory (\d+) ", page)
    samples = re.findall(r"<figcaption>Test trajectory (\d+): truth", page)
    assert worst and samples
    assert not set(worst) & set(samples), (worst, samples)
    assert len(set(worst)) == len(worst) and len(set(samples)) == len(samples)


def test_metrics_json_and_report_have_the_high_correlation_time(report: Path) -> None:
    metrics = json.loads((report.parent / "metrics.json").read_text())
    summary = metrics["high_correlation_time"]
    samples, frames = metrics["test_samples"], metrics["rollout_frames"]
    assert summary["threshold"] == 0.8 and summary["frames"] == frames
    assert len(summary["steps"]) == len(summary["censored"]) == samples
    assert all(0 <= s <= frames for s in summary["steps"])
    assert summary["censored"] == [s == frames for s in summary["steps"]]
    assert summary["mean_steps"] == sum(summary["steps"]) / samples
    assert summary["mean_time"] == pytest.approx(summary["mean_steps"] * metrics["frame_dt"])
    assert len(summary["mean_correlation"]) == frames
    page = report.read_text()
    assert "high-correlation time" in page
    assert (report.parent / "correlation_vs_time.png").read_bytes().startswith(PNG_SIGNATURE)


def test_correlation_figure_is_against_time_with_the_threshold_line() -> None:
    summary = {"frame_dt": 0.5, "threshold": 0.8, "mean_correlation": [0.99, 0.9, None, 0.6]}
    figure = drawn(high_correlation_figure(summary))
    axes = figure.axes[0]
    curve, line = axes.lines
    np.testing.assert_allclose(curve.get_xdata(), [0.5, 1.0, 1.5, 2.0])
    assert np.isnan(curve.get_ydata()[2])
    np.testing.assert_allclose(line.get_ydata(), [0.8, 0.8])
    assert axes.get_xlabel() == "time after the last input frame"


def drawn(figure: Figure) -> Figure:
    FigureCanvasAgg(figure).draw()
    return figure


def visible_ticks(axis_ticks: np.ndarray, limits: tuple[float, float]) -> np.ndarray:
    low, high = sorted(limits)
    return axis_ticks[(axis_ticks >= low - 1e-9) & (axis_ticks <= high + 1e-9)]


def field_axes(frames: int, dims: int) -> FieldAxes:
    grid = np.arange(16, dtype=np.float64) * (2 * np.pi / 16)
    return FieldAxes(
        coords=(grid,) * dims,
        times=0.25 * np.arange(2, 2 + frames, dtype=np.float64),
        field="u (nondimensional)",
        unit="nondimensional",
    )


def test_space_time_figure_is_in_grid_and_time_units_with_a_named_colorbar() -> None:
    rng = np.random.default_rng(0)
    truth = rng.standard_normal((5, 16))
    figure = drawn(space_time_figure(truth, truth + 0.1, "sample", field_axes(5, 1)))
    images = [a for a in figure.axes if a.images]
    assert len(images) == 3
    assert all(a.get_xlabel() == "x (nondimensional)" for a in images)
    assert images[0].get_ylabel() == "time t (nondimensional)"
    low, high = images[0].get_xlim()
    assert low == pytest.approx(-np.pi / 16) and high == pytest.approx(2 * np.pi - np.pi / 16)
    colorbars = [a.get_ylabel() for a in figure.axes if not a.images and a.get_ylabel()]
    assert colorbars.count("u (nondimensional)") == 2 and "error in u (nondimensional)" in colorbars


def test_2d_rollouts_show_four_frames_across_the_rollout_and_the_last_one_wide() -> None:
    rng = np.random.default_rng(1)
    truth = rng.standard_normal((10, 16, 16))
    figure = drawn(snapshots_figure(truth, truth, "sample", field_axes(10, 2)))
    images = [a for a in figure.axes if a.images]
    assert len(images) == 12  # (truth, prediction, error) x 4 frames
    columns = [a.get_title() for a in images if a.get_title()]
    assert [title.split(",")[0] for title in columns] == ["step 1", "step 4", "step 7", "step 10"]
    assert columns[0].endswith("t = 0.5") and columns[-1].endswith("t = 2.75")
    rows = [a.get_ylabel().split("\n")[0] for a in images if a.get_ylabel()]
    assert rows == ["truth", "prediction", "prediction - truth"]
    assert all(a.get_xlabel() in ("", "x (nondimensional)") for a in images)
    last = drawn(last_frame_figure(truth, truth, "sample", field_axes(10, 2)))
    width, height = last.get_size_inches()
    assert width > 2 * height  # truth | prediction | error side by side
    assert "step 10, t = 2.75" in last.get_suptitle()


def test_metric_panels_have_integer_step_ticks_and_y_labels() -> None:
    curves = {"nrmse": [0.1, 0.2, 0.3], "mass_drift": [1e-3, 2e-3, 4e-3]}
    panels = (
        Panel("relative errors", ("nrmse",), "error / size of the truth"),
        Panel("mass drift", ("mass_drift",), "|drift|"),
    )
    figure = drawn(metric_curves_figure(panels, curves, {}, 0.02))
    shown = [a for a in figure.axes if a.lines]
    assert [a.get_ylabel() for a in shown] == ["error / size of the truth", "|drift|"]
    for axes in shown:
        ticks = visible_ticks(axes.get_xticks(), axes.get_xlim())
        assert len(ticks) and np.all(ticks == np.round(ticks)), ticks
        assert axes.get_xlabel().startswith("rollout step")


def test_training_curves_are_log_scale_against_integer_steps() -> None:
    epochs = [
        {"step": 5, "train_loss": 1e-2, "val_loss": 8e-3},
        {"step": 10, "train_loss": 4e-3, "val_loss": 5e-3},
    ]
    figure = drawn(training_curves_figure([2, 4, 6, 8, 10], [2e-2, 1e-2, 6e-3, 5e-3, 4e-3], epochs))
    axes = figure.axes[0]
    assert axes.get_yscale() == "log"
    assert len(axes.get_lines()) == 3
    ticks = visible_ticks(axes.get_xticks(), axes.get_xlim())
    assert np.all(ticks == np.round(ticks)), ticks


def test_training_curves_add_validation_against_wall_time_when_the_log_has_it() -> None:
    epochs = [
        {"step": 5, "train_loss": 1e-2, "val_loss": 8e-3, "elapsed": 1.5},
        {"step": 10, "train_loss": 4e-3, "val_loss": 5e-3, "elapsed": 3.0},
    ]
    figure = drawn(training_curves_figure([5, 10], [1e-2, 4e-3], epochs))
    assert len(figure.axes) == 2
    wall = figure.axes[1]
    assert wall.get_xlabel().startswith("wall-clock time")
    (line,) = wall.get_lines()
    assert list(line.get_xdata()) == [1.5, 3.0] and list(line.get_ydata()) == [8e-3, 5e-3]
    untimed = [{k: v for k, v in r.items() if k != "elapsed"} for r in epochs]
    assert len(drawn(training_curves_figure([5, 10], [1e-2, 4e-3], untimed)).axes) == 1


def test_tuning_history_has_integer_trial_ticks(tmp_path: Path) -> None:
    import warnings

    import optuna
    from optuna.visualization import matplotlib as vis

    from dynaforge.tune.report import integer_trial_ticks, save_axes

    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Optuna's matplotlib plots are experimental; it says so each call
        study.optimize(lambda trial: trial.suggest_float("x", -1.0, 1.0) ** 2, n_trials=4)
        axes = vis.plot_optimization_history(study)
    integer_trial_ticks(axes)
    FigureCanvasAgg(axes.figure).draw()
    ticks = visible_ticks(axes.get_xticks(), axes.get_xlim())
    assert len(ticks) and np.all(ticks == np.round(ticks)), ticks
    save_axes(axes, tmp_path / "history.png")
    assert (tmp_path / "history.png").read_bytes().startswith(PNG_SIGNATURE)
