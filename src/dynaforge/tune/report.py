"""What a study leaves besides its database: the best trial's run, plots, and a short summary."""

from __future__ import annotations

import fcntl
import json
import logging
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from dynaforge.atomic import atomic_write_json, atomic_write_text
from dynaforge.config import Config
from dynaforge.tune.folder import StudyFolder, optuna_warnings_quiet

log = logging.getLogger(__name__)

KEPT = ("config.yaml", "metrics.jsonl", "checkpoints")
"""What of the best trial's run folder is copied into STUDY/best (enough to evaluate or export it)."""


def write_outputs(study: optuna.Study, folder: StudyFolder, config: Config) -> dict[str, Any]:
    """Copy the best trial's run to STUDY/best, draw the plots, write summary.json and summary.md.

    Processes sharing the study take turns (a lock file), so their copies of best/ never interleave.
    """
    with open(folder.root / ".outputs.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        best = best_trials(study)
        if best:
            keep_best_run(folder, best[0])
        plots = draw_plots(study, folder.plots, config) if config.tune.plots else {}
        summary = summarise(study, best, plots, folder)
        atomic_write_json(folder.root / "summary.json", summary)
        atomic_write_text(folder.root / "summary.md", summary_to_markdown(summary))
    return summary


def best_trials(study: optuna.Study) -> list[FrozenTrial]:
    """The best complete trial (single objective), or the Pareto front sorted by the first objective."""
    complete = study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
    if not complete:
        return []
    if len(study.directions) == 1:
        return [study.best_trial]
    first = study.directions[0] == optuna.study.StudyDirection.MAXIMIZE
    return sorted(study.best_trials, key=lambda t: t.values[0], reverse=first)


def keep_best_run(folder: StudyFolder, trial: FrozenTrial) -> None:
    """Replace STUDY/best with the config, metrics and checkpoints of `trial`'s run folder."""
    run = folder.root / str(trial.user_attrs["run"])
    staging = Path(tempfile.mkdtemp(prefix=".best-", dir=folder.root))
    for name in KEPT:
        source = run / name
        if source.is_dir():
            shutil.copytree(source, staging / name)
        elif source.exists():
            shutil.copy2(source, staging / name)
    atomic_write_json(
        staging / "trial.json",
        {
            "number": trial.number,
            "values": trial.values,
            "params": trial.params,
            "run": str(run),
            # A study shared through a database: the run folder is on the machine that ran the trial.
            "host": trial.user_attrs.get("host"),
        },
    )
    retired = folder.root / ".best-old"
    shutil.rmtree(retired, ignore_errors=True)
    if folder.best.exists():
        folder.best.rename(retired)
    staging.rename(folder.best)
    shutil.rmtree(retired, ignore_errors=True)


def draw_plots(study: optuna.Study, out: Path, config: Config) -> dict[str, str]:
    """PNG plots (one set per objective); a plot that cannot be drawn yet is noted instead."""
    from optuna.visualization import matplotlib as vis  # lazy: loads matplotlib's pyplot, only for plots

    out.mkdir(parents=True, exist_ok=True)
    results: dict[str, str] = {}
    objectives = config.tune.objectives
    complete = len(study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)))
    if not complete:
        return {"all plots": "skipped: no trial has completed"}
    for index, objective in enumerate(objectives):
        suffix = "" if len(objectives) == 1 else f"_{objective.metric}"
        target = None if len(objectives) == 1 else (lambda t, i=index: t.values[i])
        kinds = {
            "optimization_history": vis.plot_optimization_history,
            "param_importances": vis.plot_param_importances,
            "parallel_coordinate": vis.plot_parallel_coordinate,
        }
        for kind, plot in kinds.items():
            name = f"{kind}{suffix}.png"
            if kind == "param_importances" and complete < 2:
                results[name] = "skipped: importances need 2 complete trials"
                continue
            try:
                with optuna_warnings_quiet(), warnings.catch_warnings():
                    # With few trials matplotlib warns about empty legends and flat axes: cosmetic only.
                    warnings.simplefilter("ignore", UserWarning)
                    axes = plot(study, target=target, target_name=objective.metric)
                if kind == "optimization_history":
                    integer_trial_ticks(axes)
                save_axes(axes, out / name)
                results[name] = "written"
            except (ValueError, RuntimeError, ZeroDivisionError) as error:
                results[name] = f"skipped: {error}"
                log.info("plot %s skipped: %s", name, error)
    return results


def integer_trial_ticks(axes: Any) -> None:
    """Trial numbers are integers: no tick at trial 2.5."""
    from matplotlib.ticker import MaxNLocator  # lazy: matplotlib loads only where plots are drawn

    for each in axes.flat if hasattr(axes, "flat") else (axes,):
        each.xaxis.set_major_locator(MaxNLocator(integer=True))


def save_axes(axes: Any, path: Path) -> None:
    import matplotlib.pyplot as plt  # lazy: Optuna's plots are pyplot figures; only here do they close

    first = axes.flat[0] if hasattr(axes, "flat") else axes
    figure = first.figure
    figure.set_size_inches(8, 5)
    figure.tight_layout()
    with tempfile.NamedTemporaryFile(dir=path.parent, suffix=".png", delete=False) as handle:
        figure.savefig(handle.name, dpi=100)
    Path(handle.name).replace(path)
    plt.close(figure)


def summarise(
    study: optuna.Study, best: list[FrozenTrial], plots: dict[str, str], folder: StudyFolder
) -> dict[str, Any]:
    trials = study.get_trials(deepcopy=False)
    states = {state.name.lower(): sum(t.state == state for t in trials) for state in TrialState}
    return {
        "study": study.study_name,
        "directions": [d.name.lower() for d in study.directions],
        "trials": len(trials),
        "states": {k: v for k, v in states.items() if v},
        "best": [trial_record(t) for t in best],
        "best_run": str(folder.best) if best else None,
        "plots": plots,
        "all": [trial_record(t) for t in trials],
    }


def trial_record(trial: FrozenTrial) -> dict[str, Any]:
    return {
        "number": trial.number,
        "state": trial.state.name.lower(),
        "values": trial.values,
        "params": trial.params,
        "run": trial.user_attrs.get("run"),
        "epochs_reported": len(trial.intermediate_values),
        "seconds": trial.duration.total_seconds() if trial.duration else None,
    }


def summary_to_markdown(summary: dict[str, Any]) -> str:
    states = ", ".join(f"{n} {k}" for k, n in summary["states"].items())
    lines = [
        f"# Study {summary['study']}",
        "",
        f"{plural(summary['trials'], 'trial')} ({states}); objectives {', '.join(summary['directions'])}.",
        "",
    ]
    if summary["best"]:
        label = "Best trial" if len(summary["best"]) == 1 else "Pareto front (first kept in best/)"
        lines += [f"## {label}", ""]
        for record in summary["best"]:
            params = ", ".join(f"{k}={format_value(v)}" for k, v in record["params"].items())
            values = ", ".join(format_value(v) for v in record["values"] or [])
            lines.append(f"- trial {record['number']}: values {values}; {params}; run {record['run']}")
        lines += ["", f"Its checkpoint and config: {summary['best_run']}", ""]
    else:
        lines += ["No trial has completed yet.", ""]
    lines += [
        "## Trials",
        "",
        "| trial | state | values | epochs reported | seconds |",
        "| --- | --- | --- | --- | --- |",
    ]
    for record in summary["all"]:
        values = ", ".join(format_value(v) for v in record["values"] or []) or "-"
        seconds = f"{record['seconds']:.1f}" if record["seconds"] is not None else "-"
        lines.append(
            f"| {record['number']} | {record['state']} | {values} | {record['epochs_reported']} | {seconds} |"
        )
    written = [name for name, state in summary["plots"].items() if state == "written"]
    if summary["plots"]:
        lines += ["", "## Plots", ""] + [f"- plots/{name}" for name in written]
        lines += [f"- {name}: {state}" for name, state in summary["plots"].items() if state != "written"]
    return "\n".join(lines) + "\n"


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


def format_value(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, float) else json.dumps(value)
