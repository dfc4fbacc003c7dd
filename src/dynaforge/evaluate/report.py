"""The evaluation report: one self-contained HTML file (figures embedded as base64 PNG), readable offline.

Sections: summary, a table of every metric (definition and source, one-step value, rollout values), the
error against the rollout step for each metric, for a staged latent stack its predictor-corrector rollouts
(`dynaforge.evaluate.stack_report`), ensembles' spread against their error (`dynaforge.evaluate.ensembles`), The Well's time windows, the correlation time, physics
diagnostics (conserved quantities, energy spectra), the worst test samples, sample figures (never the
same trajectory twice), the training summary and loss curves (from RUN/metrics.jsonl) and the run's config.
"""

from __future__ import annotations

import base64
import html
from collections.abc import Mapping, Sequence
from typing import Any

from dynaforge.evaluate.ensembles import ensemble_sentence
from dynaforge.evaluate.stack_report import variant_label
from dynaforge.evaluate.suite import METRICS

Figures = Mapping[str, Sequence[tuple[str, bytes]]]
"""Report section ("horizon", "physics", "worst", "samples", "training", "stack", "ensembles") -> (caption,
PNG bytes) figures."""


def png_to_img(png: bytes, alt: str) -> str:
    encoded = base64.b64encode(png).decode("ascii")
    return f'<img alt="{html.escape(alt)}" src="data:image/png;base64,{encoded}">'


def figures_html(figures: Sequence[tuple[str, bytes]]) -> str:
    return "".join(
        f"<figure>{png_to_img(png, caption)}<figcaption>{html.escape(caption)}</figcaption></figure>"
        for caption, png in figures
    )


class Markup(str):
    """Text already escaped for HTML."""


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.4e}"
    return html.escape(str(value))


def table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join(
        "<tr>"
        + "".join(f"<td>{cell if isinstance(cell, Markup) else number(cell)}</td>" for cell in row)
        + "</tr>"
        for row in rows
    )
    return f"<table><tr>{head}</tr>{body}</table>"


def summary_table(metrics: Mapping[str, Any]) -> str:
    timing = metrics["correlation_time"]
    when = f"{timing['frames']} step{'' if timing['frames'] == 1 else 's'}" + (
        f" = {timing['time']:.4g} time units" if timing["time"] is not None else ""
    )
    rows = [
        ("one-step nRMSE", metrics["one_step_nrmse"]),
        (f"rollout nRMSE, step 1 of {metrics['rollout_frames']}", metrics["rollout_nrmse"][0]),
        (f"rollout nRMSE, step {metrics['rollout_frames']}", metrics["rollout_nrmse"][-1]),
        ("rollout nRMSE, mean over steps", metrics["rollout_nrmse_mean"]),
        (
            f"rollout nRMSE, geometric mean over steps 1-{metrics['gmean_horizon']}",
            metrics["rollout_nrmse_gmean"],
        ),
        (
            f"correlation time (correlation >= {timing['threshold']})",
            ("at least " if timing["censored"] else "") + when,
        ),
        *high_correlation_rows(metrics.get("high_correlation_time")),
        ("test trajectories", metrics["test_samples"]),
        ("one-step windows", metrics["one_step_windows"]),
        ("checkpoint", f"{metrics['checkpoint']} (epoch {metrics['checkpoint_epoch']})"),
    ]
    return table(("quantity", "value"), rows)


def high_correlation_rows(summary: Mapping[str, Any] | None) -> list[tuple[str, str]]:
    """PDE-Refiner's high-correlation time, mean ± standard error over the samples (none in metrics.json
    written before it existed)."""
    if summary is None:
        return []
    stderr = summary["stderr_steps"]
    text = f"{summary['mean_steps']:.4g}" + (f" ± {stderr:.2g}" if stderr is not None else "") + " steps"
    if summary["mean_time"] is not None:
        stderr_time = summary["stderr_time"]
        text += f" = {summary['mean_time']:.4g}" + (
            f" ± {stderr_time:.2g}" if stderr_time is not None else ""
        )
        text += " time units"
    censored = summary["censored_samples"]
    if censored:
        text += f" (a lower bound: {censored} of {len(summary['steps'])} samples stay above it to the end)"
    label = f"high-correlation time (per-sample correlation >= {summary['threshold']}, mean ± s.e.)"
    return [(label, text)]


def metrics_table(metrics: Mapping[str, Any]) -> str:
    per_frame = metrics["rollout_per_frame"]
    rows = []
    for name, info in METRICS.items():
        if name not in per_frame:
            continue
        curve = per_frame[name]
        rows.append(
            (
                info.label,
                info.definition,
                metrics["one_step"].get(name),
                curve[0],
                curve[-1],
                metrics["rollout"][name],
            )
        )
    header = (
        "metric",
        "definition (source)",
        "one step",
        "rollout step 1",
        "rollout last step",
        "rollout mean",
    )
    return table(header, rows)


def per_frame_table(metrics: Mapping[str, Any]) -> str:
    per_frame = metrics["rollout_per_frame"]
    names = [name for name in METRICS if name in per_frame]
    rows = [
        (step + 1, *(per_frame[name][step] for name in names)) for step in range(metrics["rollout_frames"])
    ]
    return table(("step", *(METRICS[name].label for name in names)), rows)


def windows_table(metrics: Mapping[str, Any]) -> str:
    windows = metrics["rollout_windows"]
    spans = list(windows["vrmse"])
    rows = [(METRICS[name].label, *(windows[name][span] for span in spans)) for name in windows]
    return table(("metric", *(f"steps {span}" for span in spans)), rows)


def physics_html(metrics: Mapping[str, Any]) -> str:
    conserved = metrics["conserved"]
    per_frame = metrics["rollout_per_frame"]
    if not conserved:
        text = (
            f"The system <code>{html.escape(str(metrics['system']))}</code> has no conserved quantity dynaforge "
            "checks (see <code>conserved</code> on the system's class, <code>dynaforge.systems.base.SystemBase</code>)."
        )
        rows = []
    else:
        text = f"Conserved by <code>{html.escape(str(metrics['system']))}</code>: {html.escape(', '.join(conserved))}."
        rows = [
            (METRICS[f"{q}_drift"].label, per_frame[f"{q}_drift"][0], per_frame[f"{q}_drift"][-1])
            for q in conserved
        ]
    rows.append(
        (METRICS["spectrum_error"].label, per_frame["spectrum_error"][0], per_frame["spectrum_error"][-1])
    )
    return f"<p>{text}</p>" + table(("diagnostic", "rollout step 1", "rollout last step"), rows)


def worst_table(metrics: Mapping[str, Any], worst: Sequence[Mapping[str, Any]]) -> str:
    """The worst samples the report draws; a note when metrics.json lists more (a small split, whose other
    trajectories are drawn as samples instead)."""
    rows = [(rank + 1, w["index"], w["nrmse"]) for rank, w in enumerate(worst)]
    listed = len(metrics["worst_samples"])
    note = (
        ""
        if listed == len(worst)
        else f"<p>{len(worst)} of the {listed} worst samples in metrics.json are shown: the test split has "
        f"{metrics['test_samples']} trajectories and the others are drawn under Sample trajectories.</p>"
    )
    return note + table(("rank", "test trajectory", "rollout nRMSE (mean over steps)"), rows)


TRAINING_LABELS = {
    "parameters": "model parameters",
    "train_windows": "training windows",
    "epochs": "epochs",
    "steps": "optimizer steps",
    "final_train_loss": "training loss, last epoch",
    "best_val_loss": "best validation loss",
    "training_seconds": "training time (s)",
}


def training_html(training: Mapping[str, Any], figures: Sequence[tuple[str, bytes]]) -> str:
    if not training and not figures:
        return "<p>No training log (metrics.jsonl) beside the checkpoint.</p>"
    rows = [
        (TRAINING_LABELS.get(key, key), Markup(f"{value:g}") if key == "training_seconds" else value)
        for key, value in training.items()
    ]
    return (table(("quantity", "value"), rows) if rows else "") + figures_html(figures)


def stack_html(section: Mapping[str, Any] | None, figures: Sequence[tuple[str, bytes]]) -> str:
    """The staged latent stack's section (empty for a single model): predictor-corrector rollouts and the
    steady prior's score (its ensembles: `ensembles_html`)."""
    if not section:
        return ""
    steps = section["steps"]
    rows = [
        (
            variant_label(name, row),
            Markup(f"{row['network_calls_per_step']:g}"),
            row["nrmse_per_step"][min(19, steps - 1)],
            row["nrmse_mean"],
            row["spectrum_error"],
        )
        for name, row in section["rollouts"].items()
    ]
    rollouts = table(
        (
            "rollout",
            "corrector network calls per step",
            f"nRMSE at step {min(20, steps)}",
            f"nRMSE mean over {steps} steps",
            "long-horizon log10 spectrum error",
        ),
        rows,
    )
    steady = section.get("steady_prior")
    prior = (
        "<p>No steady prior in this stack: it is an opt-in stage (<code>dynaforge train CONFIG "
        "stage=steady_prior --data DATA --out RUN</code> on this stack's folder; docs/evaluation.md says when it "
        "pays).</p>"
        if not steady
        else "<p>Steady prior: log10 spectrum distance of its samples for the test parameters to the test "
        "trajectories' long-time states, against the training split's mean long-time spectrum.</p>"
        + table(
            ("steady prior", "training-set mean spectrum (baseline)", "energy of samples / truth", "samples"),
            [(steady["prior"], steady["baseline"], steady["energy_ratio"], steady["samples"])],
        )
    )
    return f"""<h2>Latent stack: predictor-corrector rollouts and ensembles</h2>
<p>The operator alone and with each corrector from the same true frames; each corrector runs every k
steps, both at the temperature the student was distilled at (noise seed 0). The long-horizon spectrum error is the mean
|log10 E_pred(k) - log10 E_true(k)| over energetic shells, spectra averaged over the trajectories and the
second half of the rollout.</p>
{rollouts}
{figures_html(figures)}
{prior}
"""


def ensembles_html(
    section: Mapping[str, Any] | None,
    figures: Sequence[tuple[str, bytes]],
    frame_dt: float | None = None,
) -> str:
    """Every ensemble of the evaluation (empty without one): its spread against the error of its mean, in
    a sentence, a table and the figure (`dynaforge.evaluate.ensembles`)."""
    if not section:
        return ""
    variants = section["variants"].values()
    sentences = "".join(f"<p>{html.escape(ensemble_sentence(row, frame_dt))}</p>" for row in variants)
    rows = [
        (
            row["label"],
            row["members"],
            row["spread_skill_ratio"],
            row["spread_error_correlation"],
            row["mean_nrmse"],
        )
        for row in variants
    ]
    summary = table(
        (
            "ensemble",
            "members",
            "spread-skill ratio (1: calibrated)",
            "spread-error correlation",
            "nRMSE of the ensemble mean (mean over steps)",
        ),
        rows,
    )
    return f"""<h2>Ensembles: spread against error</h2>
<p>Each ensemble repeats a stochastic rollout with independent noise from the same true frames. Spread: the
standard deviation across members; error: that of the ensemble mean against the truth; both RMS over channels
and space. Spread-skill ratio: RMS spread / RMS error x sqrt((M + 1) / M) (M members), 1 for a calibrated
ensemble, below 1 when the spread understates the error. Spread-error correlation: Pearson, over every
(trajectory, step). Per-step values are in metrics.json (<code>ensembles</code>).</p>
{sentences}
{summary}
{figures_html(figures)}
"""


def render_report(
    title: str,
    metrics: Mapping[str, Any],
    figures: Figures,
    config_yaml: str,
    training: Mapping[str, Any],
    worst: Sequence[Mapping[str, Any]] | None = None,
) -> str:
    """The HTML page: metrics, figures by section, training summary and curves, and the run's config.
    `worst`: the worst samples drawn (default: every one of metrics.json)."""
    worst = metrics["worst_samples"] if worst is None else worst
    return f"""<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<title>{html.escape(title)}</title>
<style>
body {{ font-family: sans-serif; max-width: 1300px; margin: 2em auto; padding: 0 1em; color: #222; }}
table {{ border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }}
th, td {{ border: 1px solid #ccc; padding: 0.25em 0.6em; text-align: left; }}
th {{ background: #f4f4f4; font-weight: normal; }}
figure {{ margin: 1.5em 0; }}
img {{ max-width: 100%; }}
pre {{ background: #f7f7f7; padding: 1em; overflow-x: auto; }}
</style>
</head>
<body>
<h1>{html.escape(title)}</h1>
<p>Test split, physical units. Only predicted frames are scored; the true input frames never are. Metrics
follow the definitions of PDEBench (<code>metric_func</code>), The Well (VRMSE, binned spectral MSE) and
APEBench (geometric mean of the nRMSE over the rollout); each is documented in
<code>dynaforge.evaluate</code> with its source.</p>
<h2>Summary</h2>
{summary_table(metrics)}
<h2>All metrics</h2>
{metrics_table(metrics)}
<h2>Error against rollout step</h2>
{figures_html(figures.get("horizon", ()))}
<details><summary>Values per rollout step</summary>
{per_frame_table(metrics)}
</details>
<h3>The Well's time windows (mean over each window of rollout steps, 0-based, end excluded)</h3>
{windows_table(metrics)}
{stack_html(metrics.get("latent_stack"), figures.get("stack", ()))}
{ensembles_html(metrics.get("ensembles"), figures.get("ensembles", ()), metrics.get("frame_dt"))}
<h2>Physics diagnostics</h2>
{physics_html(metrics)}
{figures_html(figures.get("physics", ()))}
<h2>Worst test samples</h2>
{worst_table(metrics, worst)}
{figures_html(figures.get("worst", ()))}
<h2>Sample trajectories</h2>
{figures_html(figures.get("samples", ()))}
<h2>Training</h2>
{training_html(training, figures.get("training", ()))}
<h2>Configuration</h2>
<pre>{html.escape(config_yaml)}</pre>
</body>
</html>
"""
