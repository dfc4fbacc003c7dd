"""Each bounded preset goes to a trained, evaluated surrogate with `dynaforge run` (issue 35, item 5): the
presets themselves, shrunk by overrides to a few seconds each (coarse grids, few samples and frames, one or
two epochs). The cylinder's obstacle mask reaches the model as a held input channel (not predicted), and the
evaluation scores the fluid cells only."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.cli import main

REPO = Path(__file__).resolve().parents[2]
SMALL = [
    "dataset.n_train=2",
    "dataset.n_val=1",
    "dataset.n_test=1",
    "dataset.shard_size=2",
    "dataset.batch_size=2",
    "data.batch_size=2",
    "train.time_budget=null",
    "train.epochs=2",
    "train.log_every=1",
    "evaluate.plot_samples=1",
]
PRESETS = {
    "cylinder": [
        "system.resolution=16",
        "system.spin_up=4",
        "system.steps=8",
        "system.save_every=2",
        "model.channels=4",
        "model.levels=2",
        "evaluate.rollout_frames=2",
    ],
    "cavity": [
        "system.resolution=16",
        "system.steps=40",
        "system.save_every=10",
        "model.width=8",
        "model.modes=4",
        "model.layers=2",
        "evaluate.rollout_frames=2",
    ],
    "darcy": [
        "system.resolution=17",
        "system.refinement=2",
        "system.modes=16",
        "model.width=8",
        "model.modes=4",
        "model.layers=2",
        "model.projection=8",
    ],
    "heat_bounded_1d": [
        "system.steps=80",
        "system.save_every=20",
        "model.width=8",
        "model.modes=4",
        "model.layers=2",
        "model.projection=8",
        "data.batch_size=4",
        "evaluate.rollout_frames=2",
    ],
}


HELD = {"cylinder": [2], "heat_bounded_1d": [1, 2, 3, 4]}


@pytest.mark.parametrize("preset", sorted(PRESETS))
def test_a_bounded_preset_runs_to_an_evaluated_surrogate(
    tmp_path: Path, preset: str, one_thread: None
) -> None:
    config = REPO / "configs" / f"{preset}.yaml"
    arguments = ["-q", "run", "--out", str(tmp_path), "--no-progress", str(config), *SMALL, *PRESETS[preset]]
    assert main(arguments) == 0
    metrics = json.loads((tmp_path / "run" / "eval" / "metrics.json").read_text())
    assert np.isfinite(metrics["one_step_nrmse"]) and metrics["one_step_nrmse"] > 0
    checkpoint = torch.load(tmp_path / "run" / "checkpoints" / "best.pt", weights_only=True)
    held = list(checkpoint["model_shape"].get("held", ()))
    # the obstacle mask is an input, not an output; so are the heated rod's boundary values (its preset
    # gives them as channels: its left end's value, amplitude and frequency, its right end's flux)
    assert held == HELD.get(preset, [])
    evaluation = tmp_path / "run" / "eval"
    flow = preset in ("cavity", "cylinder")  # u and v on a 2D grid: the report draws their vorticity
    assert (evaluation / "vorticity.png").exists() == flow
    assert ("vorticity" in (evaluation / "report.html").read_text()) == flow
