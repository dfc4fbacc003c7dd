"""The vorticity rollout of a flow surrogate's report: w = dv/dx - du/dy of the true and the predicted
velocity, drawn as truth / prediction / error at a few frames across the rollout (`snapshots_figure`).

A dataset counts as a flow when its frames are 2D and hold channels named `u` and `v` (the cavity and the
cylinder, `dynaforge.systems.flow`). The derivatives are second-order central differences on the stored cell
centres (one-sided at the walls, `numpy.gradient`); inside an obstacle (a channel `obstacle` at least 1/2)
the vorticity is drawn as 0, the fluid there being held at rest.
"""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from dynaforge.evaluate.plots import FieldAxes, snapshots_figure
from dynaforge.store.format import OBSTACLE_CHANNEL


def is_flow(channels: tuple[str, ...], spatial_dims: int) -> bool:
    """Whether a report draws a vorticity rollout for frames of these channels and spatial axes."""
    return spatial_dims == 2 and "u" in channels and "v" in channels


def vorticity(u: np.ndarray, v: np.ndarray, x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """dv/dx - du/dy of velocity frames (frames, x, y) on cell centres `x` (x,) and `y` (y,)."""
    return np.gradient(v, x, axis=1) - np.gradient(u, y, axis=2)


def frames_vorticity(
    frames: np.ndarray, channels: tuple[str, ...], x: np.ndarray, y: np.ndarray
) -> np.ndarray:
    """The vorticity (frames, x, y) of one trajectory's frames (frames, channels, x, y), 0 in obstacles."""
    w = vorticity(frames[:, channels.index("u")], frames[:, channels.index("v")], x, y)
    if OBSTACLE_CHANNEL in channels:
        w = np.where(frames[:, channels.index(OBSTACLE_CHANNEL)] >= 0.5, 0.0, w)
    return w


def vorticity_figure(
    truth: np.ndarray,
    predicted: np.ndarray,
    channels: tuple[str, ...],
    title: str,
    field_axes: FieldAxes,
) -> Figure:
    """Truth, prediction and error of the vorticity of one trajectory's rollout (frames, channels, x, y)
    at up to 4 frames; `field_axes.coords` are its cell centres along x and y."""
    x, y = field_axes.coords
    return snapshots_figure(
        frames_vorticity(truth, channels, x, y),
        frames_vorticity(predicted, channels, x, y),
        f"{title}: vorticity",
        field_axes._replace(field=f"vorticity (1/time, {field_axes.unit})"),
    )
