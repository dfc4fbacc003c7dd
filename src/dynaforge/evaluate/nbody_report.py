"""`dynaforge nbody simulate`: run N-body systems with a step controller, then write invariants, plots and
an animation.

Output folder:
    invariants.json          per system: initial and final invariants, largest and final relative drifts,
                             steps, force evaluations, wall time; plus the controller and config used
    energy_error.png         |E - E0| / |E0| against time (log scale)
    momentum.png             |P - P0| / sum m|v0| against time
    angular_momentum.png     |L - L0| / sum m|x0||v0| against time
    dt.png                   the step size against time
    orbit.png                the bodies' paths in the xy plane (first system)
    animation.gif | .mp4     the bodies moving (first system); MP4 when ffmpeg is available
Relative drifts are defined in `dynaforge.systems.nbody.Drifts`. Plots are written with matplotlib's
object API (no pyplot, no global backend switch); every file is written atomically. Lengths and times are in
the simulation's own units (G = 1; N-body units for the `plummer` and `cluster` families, the orbit's own a
and masses for `kepler`: `dynaforge.systems.nbody.physics`), so the axes say "length unit" and "time unit".
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from matplotlib.animation import FFMpegWriter, FuncAnimation, PillowWriter, writers
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from tqdm import tqdm

from dynaforge.atomic import atomic_path, atomic_write_json, check_output_folder
from dynaforge.config import Config, ConfigError, config_to_dict
from dynaforge.errors import Option, RunError
from dynaforge.models.loading import controller_for
from dynaforge.seeds import sample_rng, sample_seed
from dynaforge.systems.nbody.control import Integrator, RunState, StepInfo
from dynaforge.systems.nbody.physics import invariants, relative_drifts
from dynaforge.systems.nbody.system import NBody, channels_to_state

LENGTH = "length unit"
TIME = "time unit"
"""Axis units: the simulation is dimensionless (G = 1), so a length or time is a multiple of its unit."""

MAX_RECORDS = 20_000
"""Recorded points per run; beyond it the recording keeps every second point (the stride doubles)."""


class Trace(NamedTuple):
    """Recorded diagnostics of a run (T recorded points, B systems)."""

    time: np.ndarray  # (T, B)
    dt: np.ndarray  # (T, B), the step that led to the point (0 at t = 0)
    energy_error: np.ndarray  # (T, B)
    momentum_drift: np.ndarray  # (T, B)
    angular_momentum_drift: np.ndarray  # (T, B)
    positions: np.ndarray  # (T, B, bodies, 3)


class Recorder:
    """Collects diagnostics at every step, halving its density whenever it holds `MAX_RECORDS` points."""

    def __init__(self, integrator: Integrator, run: RunState) -> None:
        self.integrator = integrator
        self.stride = 1
        self.calls = 0
        self.rows: list[dict[str, np.ndarray]] = []
        self.add(run, torch.zeros_like(run.time))

    def __call__(self, run: RunState, info: StepInfo) -> None:
        self.calls += 1
        if self.calls % self.stride == 0:
            self.add(run, info.dt)
        if len(self.rows) >= MAX_RECORDS:
            self.rows = self.rows[::2]
            self.stride *= 2

    def add(self, run: RunState, dt: torch.Tensor) -> None:
        current = invariants(run.state, self.integrator.params, run.gravity.potential)
        drifts = relative_drifts(current, run.reference, run.drift_scales)
        self.rows.append(
            {
                "time": run.time.cpu().numpy(),
                "dt": dt.cpu().numpy(),
                "energy_error": drifts.energy.cpu().numpy(),
                "momentum_drift": drifts.momentum.cpu().numpy(),
                "angular_momentum_drift": drifts.angular_momentum.cpu().numpy(),
                "positions": run.state.positions.cpu().numpy(),
            }
        )

    def trace(self, run: RunState, info: StepInfo | None) -> Trace:
        if info is not None and self.calls % self.stride:
            self.add(run, info.dt)  # always keep the final state
        return Trace(*(np.stack([row[name] for row in self.rows]) for name in Trace._fields))


OUTPUTS = ("invariants.json", "*.png", "animation.gif", "animation.mp4")
"""What `simulate` writes (see the module docstring)."""


def simulate(
    config: Config,
    out: str | Path,
    systems: int = 1,
    animation: Literal["auto", "gif", "mp4", "none"] = "auto",
    frames: int = 120,
    progress: bool | None = None,
) -> dict[str, Any]:
    """Run `systems` systems drawn from `config.system` (test-split seeds) to t = steps * dt; write the
    outputs listed in the module docstring into `out`; return the invariants summary.

    `progress=None` shows progress bars (simulated time, animation frames) only on a terminal.
    """
    if config.system.name != "nbody":
        raise ConfigError(f"`nbody simulate` needs system.name=nbody, got system.name={config.system.name}")
    if systems < 1:
        raise ConfigError(f"--systems must be >= 1, got {systems}")
    if frames < 2:
        raise ConfigError(
            f"{Option('frames')} must be 2 or more (an animation shows at least the first and the last "
            f"state), got {frames}"
        )
    check_output_folder(out, OUTPUTS, "an N-body simulation's folder", RunError)
    nbody = NBody(config.system)
    seeds = [sample_seed(config.dataset.seed, "test", i) for i in range(systems)]
    rows, initial = nbody.draw_samples([sample_rng(s) for s in seeds])
    device = torch.device(config.dataset.device if config.dataset.device != "auto" else "cpu")
    params = nbody.params_from_rows(rows.to(device))
    state = channels_to_state(initial.to(device=device, dtype=nbody.dtype))
    control = config.system.control
    controller = controller_for(control, config.system.dt, str(device))
    reversible = control.reversible and control.kind != "fixed"
    integrator = Integrator(params, controller, nbody.scheme, reversible, control.dt_max)
    t_end = config.system.dt * config.system.steps
    disabled = None if progress is None else not progress
    started = time.perf_counter()
    last: list[StepInfo] = []
    with torch.inference_mode(), simulated_time_bar(t_end, disabled) as bar:
        run = integrator.start(state)
        recorder = Recorder(integrator, run)

        def on_step(r: RunState, info: StepInfo) -> None:
            recorder(r, info)
            last[:] = [info]
            # The recorder's latest time is already on the host: the bar adds no device read.
            reached = float(recorder.rows[-1]["time"].min())
            if reached > bar.n:
                bar.update(reached - bar.n)

        run = integrator.advance(run, t_end, control.max_steps, on_step)
        trace = recorder.trace(run, last[0] if last else None)
    seconds = time.perf_counter() - started
    summary = summarise(config, run, trace, seeds, integrator, seconds)
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    atomic_write_json(folder / "invariants.json", summary)
    write_plots(folder, trace)
    if animation != "none":
        summary["animation"] = write_animation(folder, trace, animation, frames, disabled)
    return summary


def simulated_time_bar(t_end: float, disabled: bool | None) -> tqdm:
    """A progress bar over simulated time, 0 to `t_end` (the slowest system's time)."""
    return tqdm(
        total=t_end,
        desc="simulate",
        disable=disabled,
        bar_format="{desc}: {percentage:3.0f}%|{bar}| t = {n:.4g} / {total:.4g} "
        + TIME
        + "s [{elapsed}<{remaining}]",
    )


def summarise(
    config: Config, run: RunState, trace: Trace, seeds: list[int], integrator: Integrator, seconds: float
) -> dict[str, Any]:
    current = invariants(run.state, integrator.params, run.gravity.potential)
    final = relative_drifts(current, run.reference, run.drift_scales)
    per_system = []
    for b, seed in enumerate(seeds):
        per_system.append(
            {
                "seed": seed,
                "t_end": float(run.time[b]),
                "reached_end": bool(run.time[b] >= config.system.dt * config.system.steps * (1 - 1e-12)),
                "steps": int(run.steps[b]),
                "force_evaluations": int(run.evaluations[b]),
                "initial": {
                    "energy": float(run.reference.energy[b]),
                    "momentum": run.reference.momentum[b].tolist(),
                    "angular_momentum": run.reference.angular_momentum[b].tolist(),
                },
                "final": {
                    "energy": float(current.energy[b]),
                    "momentum": current.momentum[b].tolist(),
                    "angular_momentum": current.angular_momentum[b].tolist(),
                },
                "max_relative_drift": {
                    "energy": float(run.max_energy_error[b]),
                    "momentum": float(trace.momentum_drift[:, b].max()),
                    "angular_momentum": float(trace.angular_momentum_drift[:, b].max()),
                },
                "final_relative_drift": {
                    "energy": float(final.energy[b]),
                    "momentum": float(final.momentum[b]),
                    "angular_momentum": float(final.angular_momentum[b]),
                },
                "dt": {"min": float(positive(trace.dt[:, b]).min()), "max": float(trace.dt[:, b].max())},
            }
        )
    control = config.system.control
    return {
        "controller": {
            "kind": control.kind,
            "reversible": integrator.reversible,
            "dt": config.system.dt if control.kind == "fixed" else None,
            "eta": control.eta if control.kind == "adaptive" else None,
            "model": control.model if control.kind == "learned" else None,
            "scale": control.scale if control.kind == "learned" else None,
        },
        "integrator": config.system.integrator,
        "wall_seconds": seconds,
        "systems": per_system,
        "config": config_to_dict(config.system),
    }


def positive(values: np.ndarray) -> np.ndarray:
    kept = values[values > 0]
    return kept if kept.size else np.zeros(1)


# --------------------------------------------------------------------------------------------------
# Figures


def new_figure(width: float = 6.4, height: float = 4.0) -> Figure:
    figure = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(figure)
    return figure


def save_figure(figure: Figure, path: Path) -> None:
    with atomic_path(path) as tmp:
        figure.savefig(tmp, format="png", dpi=110)


def write_plots(folder: Path, trace: Trace) -> None:
    series = [
        ("energy_error.png", trace.energy_error, "|E - E0| / |E0|", "relative energy error"),
        ("momentum.png", trace.momentum_drift, "|P - P0| / sum m|v0|", "relative momentum drift"),
        (
            "angular_momentum.png",
            trace.angular_momentum_drift,
            "|L - L0| / sum m|x0||v0|",
            "relative angular momentum drift",
        ),
        ("dt.png", trace.dt, f"step size dt ({TIME})", "step size"),
    ]
    for name, values, label, title in series:
        figure = new_figure()
        axes = figure.add_subplot()
        start = 1 if name == "dt.png" else 0  # no step leads to t = 0
        for b in range(values.shape[1]):
            y = values[start:, b]
            axes.plot(trace.time[start:, b], np.where(y > 0, y, np.nan), lw=0.8, label=f"system {b}")
        axes.set_yscale("log")  # every series spans decades; zeros are left out
        axes.set_xlabel(f"time ({TIME})")
        axes.set_ylabel(label)
        axes.set_title(title)
        if values.shape[1] > 1 and values.shape[1] <= 8:
            axes.legend(fontsize=7)
        save_figure(figure, folder / name)
    figure = new_figure(5.5, 5.5)
    axes = figure.add_subplot()
    positions = trace.positions[:, 0]  # (T, bodies, 3)
    for body in range(positions.shape[1]):
        (line,) = axes.plot(positions[:, body, 0], positions[:, body, 1], lw=0.6)
        axes.plot(positions[-1, body, 0], positions[-1, body, 1], "o", ms=3, color=line.get_color())
    axes.set_aspect("equal", adjustable="datalim")
    axes.set_xlabel(f"x ({LENGTH})")
    axes.set_ylabel(f"y ({LENGTH})")
    axes.set_title("orbits (system 0, xy plane, G = 1)")
    save_figure(figure, folder / "orbit.png")


def write_animation(folder: Path, trace: Trace, kind: str, frames: int, disabled: bool | None = None) -> str:
    """Animate system 0 in the xy plane; returns the file name written. `disabled`: tqdm's (None: a
    progress bar only on a terminal)."""
    use_mp4 = kind == "mp4" or (kind == "auto" and writers.is_available("ffmpeg"))
    if kind == "mp4" and not writers.is_available("ffmpeg"):
        raise ConfigError("--animation mp4 needs ffmpeg on PATH; install it or use --animation gif")
    name = "animation.mp4" if use_mp4 else "animation.gif"
    times = trace.time[:, 0]
    picks = np.searchsorted(times, np.linspace(times[0], times[-1], frames))
    picks = np.clip(picks, 0, len(times) - 1)
    positions = trace.positions[:, 0]
    figure = new_figure(4.5, 4.5)
    axes = figure.add_subplot()
    span = np.nanmax(np.abs(positions[..., :2])) * 1.05 or 1.0
    axes.set_xlim(-span, span)
    axes.set_ylim(-span, span)
    axes.set_aspect("equal")
    axes.set_xlabel(f"x ({LENGTH})")
    axes.set_ylabel(f"y ({LENGTH})")
    axes.set_title(f"{positions.shape[1]} bodies (system 0, xy plane, G = 1)", fontsize=9)
    trails = [axes.plot([], [], lw=0.6)[0] for _ in range(positions.shape[1])]
    dots = axes.plot([], [], "o", ms=4, color="k")[0]
    label = axes.text(0.02, 0.96, "", transform=axes.transAxes, va="top", fontsize=8)

    def draw(k: int) -> list[Any]:
        i = picks[k]
        lo = picks[max(0, k - 20)]
        for body, line in enumerate(trails):
            line.set_data(positions[lo : i + 1, body, 0], positions[lo : i + 1, body, 1])
        dots.set_data(positions[i, :, 0], positions[i, :, 1])
        label.set_text(f"t = {times[i]:.3g} {TIME}s")
        return [*trails, dots, label]

    # Lay the figure out once: the axes do not move between frames, and constrained layout on every
    # frame is most of a frame's drawing time.
    figure.draw_without_rendering()
    figure.set_layout_engine("none")
    movie = FuncAnimation(figure, draw, frames=len(picks), blit=False)
    writer = FFMpegWriter(fps=24) if use_mp4 else PillowWriter(fps=24)
    # Writers pick the format from the file name, so write under the real name in a temporary folder
    # beside the target, then rename it into place (atomic on one file system).
    with tempfile.TemporaryDirectory(dir=folder, prefix=".animation-") as tmp:
        path = Path(tmp) / name
        with tqdm(total=len(picks), desc="animation", unit="frame", disable=disabled) as bar:
            movie.save(str(path), writer=writer, progress_callback=lambda _frame, _total: bar.update())
        os.replace(path, folder / name)
    return name
