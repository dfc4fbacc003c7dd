"""Figures of an evaluation, rendered with matplotlib's Agg canvas (no display, no pyplot global state).

Each function returns PNG bytes; the caller writes them (atomically) and embeds them in the report.
"""

from __future__ import annotations

import io
from collections.abc import Mapping, Sequence
from typing import Any

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


def error_vs_step_png(rollout_nrmse: Sequence[float], one_step_nrmse: float, frame_dt: float | None) -> bytes:
    """nRMSE of each rollout frame (log scale), with the one-step nRMSE for reference."""
    figure = Figure(figsize=(6, 4), layout="constrained")
    axes = figure.add_subplot()
    steps = np.arange(1, len(rollout_nrmse) + 1)
    axes.semilogy(steps, rollout_nrmse, marker="o", markersize=3, label="autoregressive rollout")
    axes.axhline(one_step_nrmse, color="gray", linestyle="--", label="one step from true inputs")
    label_rollout_axes(axes, frame_dt, "Test error against rollout step")
    axes.legend()
    return figure_to_png(figure)


def label_rollout_axes(axes: Axes, frame_dt: float | None, title: str) -> None:
    """Integer rollout steps (in time units when `frame_dt` is known) against nRMSE, gridded."""
    unit = f" (x {frame_dt:.4g} time units)" if frame_dt else ""
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(f"rollout step{unit}")
    axes.set_ylabel("nRMSE (relative L2)")
    axes.set_title(title)
    axes.grid(True, which="both", alpha=0.3)


def space_time_png(truth: np.ndarray, predicted: np.ndarray, title: str) -> bytes:
    """Truth, prediction and error as space-time images; arrays are (frames, x), time running upwards."""
    extent = (0, truth.shape[1], 0.5, truth.shape[0] + 0.5)
    return comparison_png(
        truth, predicted, title, ("grid point", "rollout step"), dict(aspect="auto", extent=extent), True
    )


def comparison_png(
    truth: np.ndarray,
    predicted: np.ndarray,
    title: str,
    labels: tuple[str, str],
    image_options: dict[str, Any],
    share_y: bool = False,
) -> bytes:
    """Truth, prediction (one colour scale) and their difference (a diverging one) side by side; images
    drawn with `imshow(image, origin="lower", **image_options)`, axes labelled `labels` (x, y)."""
    figure = Figure(figsize=(12, 3.6), layout="constrained")
    panels = figure.subplots(1, 3, sharey=share_y)
    low, high = float(min(truth.min(), predicted.min())), float(max(truth.max(), predicted.max()))
    error = predicted - truth
    bound = float(np.abs(error).max()) or 1.0
    for axes, image, name, cmap, limits in (
        (panels[0], truth, "truth", "viridis", (low, high)),
        (panels[1], predicted, "prediction", "viridis", (low, high)),
        (panels[2], error, "prediction - truth", "RdBu_r", (-bound, bound)),
    ):
        shown = axes.imshow(image, origin="lower", cmap=cmap, vmin=limits[0], vmax=limits[1], **image_options)
        axes.set_title(name)
        axes.set_xlabel(labels[0])
        figure.colorbar(shown, ax=axes)
    panels[0].set_ylabel(labels[1])
    figure.suptitle(title)
    return figure_to_png(figure)


def metric_curves_png(
    panels: Sequence[tuple[str, Sequence[str]]],
    curves: Mapping[str, Sequence[float]],
    labels: Mapping[str, str],
    frame_dt: float | None,
) -> bytes:
    """One panel per group of metrics (title, metric names): each metric's value at each rollout step,
    on a log scale when every value in the panel is > 0."""
    shown = [(title, [n for n in names if n in curves]) for title, names in panels]
    shown = [(title, names) for title, names in shown if names]
    columns = min(4, max(len(shown), 1))
    rows = max(1, -(-len(shown) // columns))
    figure = Figure(figsize=(3.4 * columns, 2.8 * rows))
    axes_grid = figure.subplots(rows, columns, squeeze=False)
    # A fixed layout: constrained layout would double the drawing time of this figure.
    figure.subplots_adjust(left=0.06, right=0.98, bottom=0.1, top=0.92, wspace=0.3, hspace=0.45)
    unit = f" (x {frame_dt:.3g})" if frame_dt else ""
    for index, axes in enumerate(axes_grid.flat):
        if index >= len(shown):
            axes.set_axis_off()
            continue
        title, names = shown[index]
        values = [np.asarray(curves[name], dtype=np.float64) for name in names]
        for name, curve in zip(names, values):
            axes.plot(
                np.arange(1, len(curve) + 1), curve, marker="o", markersize=2, label=labels.get(name, name)
            )
        if all(np.all(v > 0) for v in values) and "correlation" not in names:
            axes.set_yscale("log")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_title(title, fontsize=9)
        axes.tick_params(labelsize=7)
        axes.grid(True, which="both", alpha=0.3)
        axes.set_xlabel(f"rollout step{unit}", fontsize=8)
        axes.legend(fontsize=6)
    return figure_to_png(figure)


def spectra_png(
    truth: Sequence[Sequence[float]], predicted: Sequence[Sequence[float]], frames: Sequence[int]
) -> bytes:
    """Energy spectra E(k) of truth (solid) and prediction (dashed) at a few rollout steps, log-log."""
    figure = Figure(figsize=(6, 4), layout="constrained")
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
    positive = [v for row in (*truth, *predicted) for v in row[1:] if v > 0]
    if positive:
        axes.set_xscale("log")
        axes.set_yscale("log")
    axes.set_xlabel("wavenumber k (cycles per domain)")
    axes.set_ylabel("E(k), mean over samples and channels")
    axes.set_title("Energy spectra of truth and prediction")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(fontsize=7)
    return figure_to_png(figure)


def snapshot_png(truth: np.ndarray, predicted: np.ndarray, title: str) -> bytes:
    """Truth, prediction and error of one 2D frame, arrays (x, y) with x drawn across."""
    return comparison_png(truth.T, predicted.T, title, ("x", "y"), {})
