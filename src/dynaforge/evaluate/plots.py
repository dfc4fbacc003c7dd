"""Figures of an evaluation, rendered with matplotlib's Agg canvas (no display, no pyplot global state).

Each function returns PNG bytes; the caller writes them (atomically) and embeds them in the report.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

import numpy as np
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
    unit = f" (x {frame_dt:.4g} time units)" if frame_dt else ""
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel(f"rollout step{unit}")
    axes.set_ylabel("nRMSE (relative L2)")
    axes.set_title("Test error against rollout step")
    axes.grid(True, which="both", alpha=0.3)
    axes.legend()
    return figure_to_png(figure)


def space_time_png(truth: np.ndarray, predicted: np.ndarray, title: str) -> bytes:
    """Truth, prediction and error as space-time images; arrays are (frames, x), time running upwards."""
    figure = Figure(figsize=(12, 3.6), layout="constrained")
    panels = figure.subplots(1, 3, sharey=True)
    low, high = float(min(truth.min(), predicted.min())), float(max(truth.max(), predicted.max()))
    error = predicted - truth
    bound = float(np.abs(error).max()) or 1.0
    extent = (0, truth.shape[1], 0.5, truth.shape[0] + 0.5)
    for axes, image, name, cmap, limits in (
        (panels[0], truth, "truth", "viridis", (low, high)),
        (panels[1], predicted, "prediction", "viridis", (low, high)),
        (panels[2], error, "prediction - truth", "RdBu_r", (-bound, bound)),
    ):
        shown = axes.imshow(
            image, origin="lower", aspect="auto", cmap=cmap, vmin=limits[0], vmax=limits[1], extent=extent
        )
        axes.set_title(name)
        axes.set_xlabel("grid point")
        figure.colorbar(shown, ax=axes)
    panels[0].set_ylabel("rollout step")
    figure.suptitle(title)
    return figure_to_png(figure)
