"""Figures of an evaluation, rendered with matplotlib's Agg canvas (no display, no pyplot global state).

A `*_figure` function returns the matplotlib Figure (tests read its axes); `figure_to_png` makes it the PNG
bytes that the caller writes (atomically) and embeds in the report. Axes are in the dataset's units: x, y in grid
coordinates, t in the frames' time; rollout steps have integer ticks; quantities of
different units never share an axis.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

PNG_METADATA = {"Software": None}
"""No software/version stamp: the same figure gives the same bytes."""


def figure_to_png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=100, metadata=PNG_METADATA)
    return buffer.getvalue()


def error_vs_step_figure(
    rollout_nrmse: Sequence[float], one_step_nrmse: float, frame_dt: float | None
) -> Figure:
    """nRMSE of each rollout frame (log scale), with the one-step nRMSE for reference."""
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    steps = np.arange(1, len(rollout_nrmse) + 1)
    axes.semilogy(steps, rollout_nrmse, marker="o", markersize=3, label="autoregressive rollout")
    axes.axhline(one_step_nrmse, color="gray", linestyle="--", label="one step from true inputs")
    label_rollout_axes(axes, frame_dt, "Test error against rollout step")
    axes.legend()
    return figure


def members_figure(rows: Sequence[Mapping[str, Any]], frame_dt: float | None) -> Figure:
    """One run scored on each member of its mixture (`evaluate --members`): every member's rollout nRMSE
    against the step (log scale), its one-step nRMSE as a dashed line of the same colour."""
    figure = Figure(figsize=(6.5, 4.2), layout="constrained")
    axes = figure.add_subplot()
    for row in rows:
        curve = row["rollout_nrmse"]
        (line,) = axes.semilogy(
            np.arange(1, len(curve) + 1), curve, marker="o", markersize=3, label=f"{row['member']}: rollout"
        )
        axes.axhline(row["one_step_nrmse"], color=line.get_color(), linestyle="--", linewidth=1)
    label_rollout_axes(axes, frame_dt, "Test error of each mixture member (dashed: one step)")
    axes.legend(fontsize=8)
    return figure


def high_correlation_figure(summary: Mapping[str, Any]) -> Figure:
    """The correlation with the truth averaged over the test samples against rollout time (steps when the
    frame interval is unknown), with the threshold of the high-correlation time."""
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    frame_dt = summary["frame_dt"]
    curve = np.array([np.nan if v is None else v for v in summary["mean_correlation"]], dtype=np.float64)
    steps = np.arange(1, len(curve) + 1)
    axes.plot(
        steps * frame_dt if frame_dt else steps, curve, marker="o", markersize=3, label="mean over samples"
    )
    axes.axhline(
        summary["threshold"], color="gray", linestyle="--", label=f"threshold {summary['threshold']:g}"
    )
    label_axes(
        axes,
        "time after the last input frame" if frame_dt else "rollout step",
        "Pearson correlation with the truth",
        "Correlation against rollout time",
    )
    axes.legend()
    return figure


def label_axes(axes: Axes, xlabel: str, ylabel: str, title: str) -> None:
    """Name both axes and the plot, over a light grid (minor lines too where a log scale has them)."""
    axes.set_xlabel(xlabel)
    axes.set_ylabel(ylabel)
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)


def label_rollout_axes(axes: Axes, frame_dt: float | None, title: str) -> None:
    """Integer rollout steps against nRMSE, gridded; the time since the rollout's start on top when
    `frame_dt` is known."""
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    label_axes(axes, "rollout step", "nRMSE (relative L2)", title)
    if frame_dt:
        top = axes.secondary_xaxis("top", functions=(lambda s: s * frame_dt, lambda t: t / frame_dt))
        top.set_xlabel("time after the last input frame")


class FieldAxes(NamedTuple):
    """What a sample figure's axes stand for, in the dataset's units."""

    coords: tuple[np.ndarray, ...]
    """The grid coordinate of each point along each spatial axis (x, y, ...), (points,) each."""
    times: np.ndarray
    """The time of each predicted frame, (frames,)."""
    field: str
    """The plotted channel's name and unit, e.g. `u (nondimensional)`: the colorbars' label."""
    unit: str
    """How the unit of time and space reads in an axis label, e.g. `nondimensional`."""


def cell_edges(centres: np.ndarray) -> tuple[float, float]:
    """The outer edges of cells centred on evenly spaced `centres` (half a spacing beyond each end)."""
    half = 0.5 * float(centres[1] - centres[0]) if len(centres) > 1 else 0.5
    return float(centres[0]) - half, float(centres[-1]) + half


def space_time_figure(truth: np.ndarray, predicted: np.ndarray, title: str, field_axes: FieldAxes) -> Figure:
    """Truth, prediction and error as space-time images; arrays are (frames, x), time running upwards,
    x in grid coordinates and t in the dataset's time."""
    extent = (*cell_edges(field_axes.coords[0]), *cell_edges(field_axes.times))
    figure = Figure(figsize=(12, 3.8), layout="constrained")
    panels = figure.subplots(1, 3, sharey=True)
    draw_comparison_row(
        figure, panels, truth, predicted, field_axes.field, dict(aspect="auto", extent=extent)
    )
    for axes in panels:
        axes.set_xlabel(f"x ({field_axes.unit})")
    panels[0].set_ylabel(f"time t ({field_axes.unit})")
    figure.suptitle(title)
    return figure


def draw_comparison_row(
    figure: Figure,
    panels: Sequence[Axes] | np.ndarray,
    truth: np.ndarray,
    predicted: np.ndarray,
    field: str,
    image_options: dict[str, Any],
    limits: tuple[float, float] | None = None,
    bound: float | None = None,
    colorbars: bool = True,
    titles: Sequence[str] = ("truth", "prediction", "prediction - truth"),
) -> None:
    """Truth, prediction (one colour scale, `limits` or their range) and their difference (a diverging
    scale, +-`bound` or the largest error) on three axes, drawn with `imshow(origin="lower")`."""
    low, high = limits or (float(min(truth.min(), predicted.min())), float(max(truth.max(), predicted.max())))
    error = predicted - truth
    bound = bound or float(np.abs(error).max()) or 1.0
    for axes, image, name, cmap, (vmin, vmax), label in (
        (panels[0], truth, titles[0], "viridis", (low, high), field),
        (panels[1], predicted, titles[1], "viridis", (low, high), field),
        (panels[2], error, titles[2], "RdBu_r", (-bound, bound), f"error in {field}"),
    ):
        shown = axes.imshow(image, origin="lower", cmap=cmap, vmin=vmin, vmax=vmax, **image_options)
        axes.set_title(name)
        if colorbars:
            figure.colorbar(shown, ax=axes, label=label)


def last_frame_figure(truth: np.ndarray, predicted: np.ndarray, title: str, field_axes: FieldAxes) -> Figure:
    """Truth, prediction and error of the last predicted 2D frame side by side; arrays (frames, x, y) with
    x drawn across."""
    extent = (*cell_edges(field_axes.coords[0]), *cell_edges(field_axes.coords[1]))
    figure = Figure(figsize=(12, 3.8), layout="constrained")
    panels = figure.subplots(1, 3, sharey=True)
    draw_comparison_row(figure, panels, truth[-1].T, predicted[-1].T, field_axes.field, dict(extent=extent))
    for axes in panels:
        axes.set_xlabel(f"x ({field_axes.unit})")
    panels[0].set_ylabel(f"y ({field_axes.unit})")
    last = truth.shape[0]
    figure.suptitle(f"{title}, last rollout step (step {last}, t = {field_axes.times[-1]:.4g})")
    return figure


def snapshots_figure(truth: np.ndarray, predicted: np.ndarray, title: str, field_axes: FieldAxes) -> Figure:
    """Truth, prediction and error (rows) of 2D fields at up to 4 frames across the rollout (columns, time
    running to the right; one colour scale per row); arrays (frames, x, y) with x drawn across."""
    frames = snapshot_frames(truth.shape[0])
    extent = (*cell_edges(field_axes.coords[0]), *cell_edges(field_axes.coords[1]))
    figure = Figure(figsize=(2.9 * len(frames) + 1.6, 8.4), layout="constrained")
    grid = figure.subplots(3, len(frames), squeeze=False, sharex=True, sharey=True)
    limits = float(min(truth.min(), predicted.min())), float(max(truth.max(), predicted.max()))
    bound = float(np.abs(predicted - truth).max()) or 1.0
    for column, frame in enumerate(frames):
        when = f"step {frame + 1}, t = {field_axes.times[frame]:.4g}"
        draw_comparison_row(
            figure,
            grid[:, column],
            truth[frame].T,
            predicted[frame].T,
            field_axes.field,
            dict(extent=extent),
            limits,
            bound,
            colorbars=False,
            titles=(when, "", ""),
        )
        grid[-1, column].set_xlabel(f"x ({field_axes.unit})")
    for row, (name, label) in enumerate(
        (
            ("truth", field_axes.field),
            ("prediction", field_axes.field),
            ("prediction - truth", f"error in {field_axes.field}"),
        )
    ):
        grid[row, 0].set_ylabel(f"{name}\ny ({field_axes.unit})")
        figure.colorbar(grid[row, 0].images[0], ax=grid[row, :], label=label, shrink=0.9)
    figure.suptitle(title)
    return figure


def snapshot_frames(frames: int, most: int = 4) -> list[int]:
    """Up to `most` distinct frame indices spread evenly from the first predicted frame to the last."""
    return sorted({round(i * (frames - 1) / max(most - 1, 1)) for i in range(min(most, frames))})


class Panel(NamedTuple):
    """One panel of the small multiples: its title, the metrics it draws (of one unit) and its y label."""

    title: str
    names: Sequence[str]
    ylabel: str


def metric_curves_figure(
    panels: Sequence[Panel],
    curves: Mapping[str, Sequence[float]],
    labels: Mapping[str, str],
    frame_dt: float | None,
) -> Figure:
    """One panel per group of metrics of one unit: each metric's value at each rollout step, on a log scale
    when every value in the panel is > 0."""
    shown = [panel._replace(names=[n for n in panel.names if n in curves]) for panel in panels]
    shown = [panel for panel in shown if panel.names]
    columns = min(3, max(len(shown), 1))
    rows = max(1, -(-len(shown) // columns))
    figure = Figure(figsize=(4.4 * columns, 3.3 * rows))
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    # A fixed layout: constrained layout would double the drawing time of this figure.
    figure.subplots_adjust(left=0.085, right=0.98, bottom=0.08, top=0.95, wspace=0.35, hspace=0.55)
    unit = f" (1 step = {frame_dt:.3g} time units)" if frame_dt else ""
    for index, axes in enumerate(axes_grid.flat):
        if index >= len(shown):
            axes.set_axis_off()
            continue
        panel = shown[index]
        values = [np.asarray(curves[name], dtype=np.float64) for name in panel.names]
        for name, curve in zip(panel.names, values):
            axes.plot(
                np.arange(1, len(curve) + 1), curve, marker="o", markersize=3, label=labels.get(name, name)
            )
        if spans_decades(values) and "correlation" not in panel.names:
            axes.set_yscale("log")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_title(panel.title, fontsize=10)
        axes.tick_params(labelsize=8)
        axes.grid(True, which="both", alpha=0.3)
        axes.set_xlabel(f"rollout step{unit}", fontsize=9)
        axes.set_ylabel(panel.ylabel, fontsize=9)
        if len(panel.names) > 1:  # a single curve is named by the panel's title
            axes.legend(fontsize=8)
    return figure


def spans_decades(values: Sequence[np.ndarray]) -> bool:
    """Whether curves are all > 0 and spread over more than a decade: a log scale reads them, a linear
    one reads a narrower range (log ticks there are few and odd, like 2.4 x 10^0)."""
    joined = np.concatenate([np.ravel(v) for v in values]) if values else np.zeros(0)
    return bool(joined.size) and bool(np.all(joined > 0)) and float(joined.max() / joined.min()) > 10


def training_curves_figure(
    steps: Sequence[int], losses: Sequence[float], epochs: Sequence[Mapping[str, Any]]
) -> Figure:
    """The training loss of each log interval of optimizer steps (`steps`, `losses`) and, per epoch (at
    its last step), the mean training loss and the validation loss; log y. Beside it, when the epochs record
    their `elapsed` seconds, the validation loss against wall time."""
    timed = bool(epochs) and all(r.get("elapsed") is not None and r.get("val_loss") for r in epochs)
    figure = Figure(figsize=(11 if timed else 7, 4), layout="constrained")
    axes = figure.add_subplot(1, 2, 1) if timed else figure.add_subplot()
    if timed:
        wall_time_axes(figure.add_subplot(1, 2, 2), epochs)
    if len(steps):
        axes.plot(
            steps, losses, color="tab:blue", alpha=0.45, linewidth=1, label="training loss, per log interval"
        )
    at = [r["step"] for r in epochs]
    for key, color, label in (
        ("train_loss", "tab:blue", "training loss, epoch mean"),
        ("val_loss", "tab:orange", "validation loss"),
    ):
        if epochs and all(r.get(key) is not None for r in epochs):
            axes.plot(at, [r[key] for r in epochs], color=color, marker="o", markersize=4, label=label)
    if all(v > 0 for line in axes.get_lines() for v in line.get_ydata()):
        axes.set_yscale("log")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    label_axes(
        axes,
        "optimizer step (dots: end of each epoch)",
        "loss (normalised fields)",
        "Training and validation loss (metrics.jsonl)",
    )
    axes.legend(fontsize=9)
    return figure


def wall_time_axes(axes: Axes, epochs: Sequence[Mapping[str, Any]]) -> None:
    """Validation loss at the end of each epoch against the seconds the run had trained by then."""
    axes.plot(
        [r["elapsed"] for r in epochs],
        [r["val_loss"] for r in epochs],
        color="tab:orange",
        marker="o",
        markersize=4,
    )
    if all(r["val_loss"] > 0 for r in epochs):
        axes.set_yscale("log")
    label_axes(
        axes,
        "wall-clock time trained (s)",
        "validation loss (normalised fields)",
        "Validation loss against wall time",
    )


def spectra_figure(
    truth: Sequence[Sequence[float]],
    predicted: Sequence[Sequence[float]],
    frames: Sequence[int],
    floor: float | None = None,
) -> Figure:
    """Energy spectra E(k) of truth (solid) and prediction (dashed) at a few rollout steps, log-log. With
    `floor` (a fraction of the largest true shell energy k >= 1, `dynaforge.metrics.physics.SPECTRUM_FLOOR`),
    a dotted line per step marks the energy below which the spectrum error leaves a shell out."""
    figure = Figure(figsize=(7, 4.5), layout="constrained")
    axes = figure.add_subplot()
    colors = ["tab:blue", "tab:orange", "tab:green", "tab:red"]
    for i, frame in enumerate(frames):
        true = np.asarray(truth[i], dtype=np.float64)
        k = np.arange(len(true))
        color = colors[i % len(colors)]
        shown = k >= 1
        axes.plot(k[shown], true[shown], color=color, label=f"truth, step {frame + 1}")
        guess = np.asarray(predicted[i], dtype=np.float64)
        axes.plot(k[shown], guess[shown], color=color, linestyle="--", label=f"prediction, step {frame + 1}")
        if floor is not None and shown.any() and true[shown].max() > 0:
            label = f"not scored below ({floor:g} of the peak)" if i == 0 else None
            axes.axhline(floor * true[shown].max(), color=color, linestyle=":", linewidth=1, label=label)
    positive = [v for row in (*truth, *predicted) for v in row[1:] if v > 0]
    if positive:
        axes.set_xscale("log")
        axes.set_yscale("log")
    label_axes(
        axes,
        "wavenumber k (cycles per domain)",
        "E(k), mean over samples and channels",
        "Energy spectra of truth and prediction",
    )
    axes.legend(fontsize=8)
    return figure
