"""`dynaforge evaluate`: score a run's checkpoint on the test split and write RUN/eval/.

RUN/eval/metrics.json holds at least `one_step_nrmse` (one model call from true inputs, every test window)
and `rollout_nrmse` (a list: the nRMSE of each autoregressively predicted frame, from the true initial
frames of every test trajectory). Evaluation is deterministic: the same run, data and device give the same
metrics.json byte for byte (no timestamps; fixed batches and order).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch

from dynaforge.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from dynaforge.config import (
    Config,
    ConfigError,
    EvaluateConfig,
    config_from_dict,
    config_to_dict,
    config_to_yaml,
    load_config,
    resolve_device,
)
from dynaforge.data import Normalizer
from dynaforge.evaluate.metrics import nrmse, nrmse_per_frame
from dynaforge.evaluate.plots import error_vs_step_png, space_time_png
from dynaforge.evaluate.report import render_report
from dynaforge.evaluate.rollout import Rollouts, one_step_predictions, rollouts
from dynaforge.models import ModelShape, model_from_checkpoint
from dynaforge.runs import RunError, RunFolder, run_folder
from dynaforge.store import DatasetFolder
from dynaforge.store.format import file_sha256
from dynaforge.train.checkpoint import load_checkpoint
from dynaforge.train.log import read_metrics

log = logging.getLogger(__name__)

METRICS = "metrics.json"
REPORT = "report.html"


class EvaluationResult(NamedTuple):
    metrics: dict[str, Any]
    report: Path


def evaluate(
    run: str | Path, data: str | Path | None = None, config: EvaluateConfig | None = None
) -> EvaluationResult:
    """Evaluate run folder `run` on the test split of `data` (default: the dataset it was trained on).

    `config` defaults to the `evaluate` section of RUN/config.yaml.
    """
    folder = run_folder(run)
    config = config or evaluate_config_of(folder)
    checkpoint_path = folder.checkpoint(config.checkpoint)
    device = torch.device(resolve_device(config.device))
    checkpoint = load_checkpoint(checkpoint_path, map_location=device)
    model = model_from_checkpoint(checkpoint).to(device).eval()
    shape = ModelShape(**checkpoint["model_shape"])
    normalizer = Normalizer.from_stats(checkpoint["normalization"])
    trained = config_from_dict(checkpoint["config"])
    dataset = DatasetFolder(dataset_root(checkpoint, data))
    test = dataset.read_split("test")
    check_compatible(test.fields, shape, dataset.root)
    stride, batch_size = trained.data.stride, trained.data.batch_size

    one_step = one_step_predictions(model, normalizer, test.fields, shape, stride, batch_size, device)
    rolled = rollouts(
        model,
        normalizer,
        test.fields,
        shape,
        stride,
        config.start_frame,
        config.rollout_frames,
        batch_size,
        device,
    )
    rollout_nrmse = [float(v) for v in nrmse_per_frame(rolled.predicted, rolled.truth)]
    metrics = {
        "one_step_nrmse": float(nrmse(one_step.predicted, one_step.truth)),
        "rollout_nrmse": rollout_nrmse,
        "rollout_nrmse_mean": float(np.mean(rollout_nrmse)),
        "rollout_frames": len(rollout_nrmse),
        "frame_dt": frame_dt(dataset, stride),
        "test_samples": int(test.fields.shape[0]),
        "one_step_windows": int(one_step.predicted.shape[0]),
        "history": shape.history,
        "horizon": shape.horizon,
        "stride": stride,
        "checkpoint": config.checkpoint,
        "checkpoint_epoch": int(checkpoint["epoch"]),
        "checkpoint_sha256": file_sha256(checkpoint_path),
        "data": str(dataset.root),
        "evaluate_config": config_to_dict(config),
    }
    report = write_outputs(folder, metrics, rolled, config, trained)
    log.info(
        "test one-step nRMSE %.3e, rollout nRMSE at step %d %.3e; report: %s",
        metrics["one_step_nrmse"],
        metrics["rollout_frames"],
        rollout_nrmse[-1],
        report,
    )
    return EvaluationResult(metrics=metrics, report=report)


def evaluate_config_of(folder: RunFolder) -> EvaluateConfig:
    if not folder.root.is_dir():
        raise RunError(
            f"{folder.root} is not a run folder; train one with `dynaforge train CONFIG --data DIR --out RUN`"
        )
    if folder.config.exists():
        return load_config(folder.config).evaluate
    return EvaluateConfig()


def dataset_root(checkpoint: dict[str, Any], data: str | Path | None) -> Path:
    if data is not None:
        return Path(data)
    recorded = Path(checkpoint.get("data", ""))
    if not recorded.is_dir():
        raise RunError(f"the dataset the run was trained on ({recorded}) is gone; pass --data DIR")
    return recorded


def check_compatible(fields: np.ndarray, shape: ModelShape, root: Path) -> None:
    channels, spatial_dims = fields.shape[-1], fields.ndim - 3
    if channels != shape.channels or spatial_dims != shape.spatial_dims:
        raise RunError(
            f"{root} holds {channels} channel(s) on {spatial_dims} spatial axes, but the model was trained on "
            f"{shape.channels} channel(s) on {shape.spatial_dims}; pass the matching --data DIR"
        )


def frame_dt(dataset: DatasetFolder, stride: int) -> float | None:
    """Time between two model frames, when the dataset's config says it."""
    try:
        system = dataset.config.system
    except ConfigError:  # a dataset from another tool may carry no (or another) dynaforge config
        return None
    return system.dt * system.save_every * stride


def write_outputs(
    folder: RunFolder, metrics: dict[str, Any], rolled: Rollouts, config: EvaluateConfig, trained: Config
) -> Path:
    """metrics.json, the PNG figures beside it, and report.html (figures embedded), all atomically."""
    out = folder.eval
    out.mkdir(parents=True, exist_ok=True)
    figures = [
        (
            "nRMSE of each autoregressive rollout step on the test split",
            "error_vs_step.png",
            error_vs_step_png(metrics["rollout_nrmse"], metrics["one_step_nrmse"], metrics["frame_dt"]),
        )
    ]
    if rolled.truth.ndim == 4:  # 1D fields: (N, frames, C, x) -> space-time images of channel 0
        for sample in range(min(config.plot_samples, rolled.truth.shape[0])):
            figures.append(
                (
                    f"Test trajectory {sample}: truth, rollout prediction and error (channel 0)",
                    f"sample_{sample}.png",
                    space_time_png(
                        rolled.truth[sample, :, 0].numpy(),
                        rolled.predicted[sample, :, 0].numpy(),
                        f"test trajectory {sample}",
                    ),
                )
            )
    for _, name, png in figures:
        atomic_write_bytes(out / name, png)
    atomic_write_json(out / METRICS, metrics)
    html = render_report(
        title=f"dynaforge evaluation: {folder.root.name or folder.root}",
        metrics=metrics,
        figures=[(caption, png) for caption, _, png in figures],
        config_yaml=config_to_yaml(trained),
        training=training_summary(folder),
    )
    atomic_write_text(out / REPORT, html)
    return out / REPORT


def training_summary(folder: RunFolder) -> dict[str, Any]:
    """Epochs, steps, losses and time from metrics.jsonl (empty when the log is missing)."""
    if not folder.metrics.exists():
        return {}
    records = read_metrics(folder.metrics)
    epochs = [r for r in records if r.get("kind") == "epoch"]
    header = next((r for r in records if r.get("kind") == "header"), {})
    if not epochs:
        return {}
    return {
        "parameters": header.get("parameters"),
        "train_windows": header.get("train_windows"),
        "epochs": len(epochs),
        "steps": epochs[-1]["step"],
        "final_train_loss": epochs[-1]["train_loss"],
        "best_val_loss": min(r["val_loss"] for r in epochs),
        "training_seconds": round(sum(r["epoch_time"] for r in epochs), 1),
    }


def evaluation_is_current(folder: RunFolder, config: EvaluateConfig) -> bool:
    """True when RUN/eval holds a report made with `config` from the current checkpoint."""
    metrics_path, report = folder.eval / METRICS, folder.eval / REPORT
    checkpoint = folder.checkpoint(config.checkpoint)
    if not (metrics_path.exists() and report.exists() and checkpoint.exists()):
        return False
    try:
        metrics = json.loads(metrics_path.read_text())
    except json.JSONDecodeError:
        return False
    return metrics.get("evaluate_config") == config_to_dict(config) and metrics.get(
        "checkpoint_sha256"
    ) == file_sha256(checkpoint)
