"""`dynaforge run` end to end on the tiny 2D Navier-Stokes presets, with the 2D FNO and the 2D U-Net.

Both presets share one dataset (32 x 32, 8 train trajectories of 11 frames): the U-Net run reuses the
FNO run's data folder, which `run` recognises as complete and does not regenerate.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from matplotlib.image import imread

from dynaforge.cli import main
from dynaforge.models import ModelInput, model_from_checkpoint
from dynaforge.train.log import read_metrics

REPO = Path(__file__).resolve().parents[2]
PRESETS = {"fno": REPO / "configs" / "ns2d-tiny.yaml", "unet": REPO / "configs" / "ns2d-tiny-unet.yaml"}
SIZE = 32


@pytest.fixture(scope="module")
def roots(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """`dynaforge run PRESET --out ROOT` for both presets, the second on a copy of the first's data."""
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        base = tmp_path_factory.mktemp("ns2d")
        fno, unet = base / "fno", base / "unet"
        assert main(["-q", "run", str(PRESETS["fno"]), "--out", str(fno), "--no-progress"]) == 0
        shutil.copytree(fno / "data", unet / "data")
        manifest = (unet / "data" / "manifest.json").stat().st_mtime_ns
        assert main(["-q", "run", str(PRESETS["unet"]), "--out", str(unet), "--no-progress"]) == 0
        assert (unet / "data" / "manifest.json").stat().st_mtime_ns == manifest  # not regenerated
    finally:
        torch.set_num_threads(previous)
    return {"fno": fno, "unet": unet}


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_run_trains_a_2d_model_that_learns(roots: dict[str, Path], name: str) -> None:
    run = roots[name] / "run"
    epochs = [r for r in read_metrics(run / "metrics.jsonl") if r["kind"] == "epoch"]
    assert len(epochs) == 4 and epochs[-1]["val_loss"] < epochs[0]["val_loss"]
    checkpoint = torch.load(run / "checkpoints" / "best.pt", weights_only=True)
    assert checkpoint["config"]["model"]["name"] == name and checkpoint["model_shape"]["spatial_dims"] == 2
    model = model_from_checkpoint(checkpoint).eval()
    convolutions = [m for m in model.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convolutions and not any(isinstance(m, torch.nn.Conv1d) for m in model.modules())
    with torch.inference_mode():
        output = model(ModelInput(frames=torch.zeros(1, 2, 1, SIZE, SIZE, dtype=torch.float32))).frames
    assert output.shape == (1, 1, 1, SIZE, SIZE)


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_evaluation_of_a_2d_run_has_metrics_and_radial_spectra(roots: dict[str, Path], name: str) -> None:
    metrics = json.loads((roots[name] / "run" / "eval" / "metrics.json").read_text())
    assert 0 < metrics["one_step_nrmse"] < 1
    assert len(metrics["rollout_nrmse"]) == metrics["rollout_frames"] == 5
    assert all(np.isfinite(v) and v > 0 for v in metrics["rollout_nrmse"])
    assert metrics["rollout_nrmse"][-1] > metrics["one_step_nrmse"]  # errors grow along the rollout
    assert metrics["domain_lengths"] == pytest.approx([2 * np.pi, 2 * np.pi])
    for key in ("vrmse", "frmse_low", "spectral_nmse_high", "correlation", "spectrum_error"):
        curve = metrics["rollout_per_frame"][key]
        assert len(curve) == 5 and np.isfinite(curve).all() and np.isfinite(metrics["rollout"][key]), key
    spectra = metrics["spectra"]
    # Radially binned shells k = 0 .. 16 on a 32 x 32 grid, energy falling from the forced scales.
    assert all(len(row) == SIZE // 2 + 1 for row in (*spectra["truth"], *spectra["predicted"]))
    truth = np.asarray(spectra["truth"][0])
    assert truth[1:4].max() > 1e3 * truth[-1] > 0


@pytest.mark.parametrize("name", ["fno", "unet"])
def test_2d_report_shows_field_snapshots(roots: dict[str, Path], name: str) -> None:
    evaluation = roots[name] / "run" / "eval"
    figures = sorted(p.name for p in evaluation.glob("*.png"))
    assert {"sample_0.png", "sample_1.png", "spectra.png", "metrics_vs_step.png", "worst_1.png"} <= set(
        figures
    )
    image = imread(evaluation / "sample_0.png")  # truth | prediction | error images, side by side
    assert image.shape[1] > 2 * image.shape[0]
    rows = image[image.shape[0] // 4 : 3 * image.shape[0] // 4, :, :3]
    assert rows.std(axis=(0, 1)).min() > 0.05  # coloured fields, not a blank canvas
    report = (evaluation / "report.html").read_text()
    assert report.count("data:image/png;base64,") == len(figures)
    assert "navier_stokes" in report
