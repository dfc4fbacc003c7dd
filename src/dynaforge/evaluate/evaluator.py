"""`dynaforge evaluate`: score a run's checkpoint on the test split and write RUN/eval/.

RUN/eval/metrics.json holds `one_step_nrmse` (one model call from true inputs, every test window) and
`rollout_nrmse` (a list: the nRMSE of each autoregressively predicted frame, from the true initial frames of
every test trajectory), both PDEBench's nRMSE; then every metric of `dynaforge.evaluate.suite` for the one-step
predictions (`one_step`), averaged over the rollout (`rollout`) and per rollout step (`rollout_per_frame`),
the geometric mean of the rollout nRMSE, The Well's time windows, the correlation time, the conserved
quantities' drift, energy spectra and the worst test samples. RUN may be the root of a staged latent
stack (`dynaforge train ... stage=all`): its operator is scored with each trajectory's conditions,
`latent_stack` holds the predictor-corrector rollouts and steady prior (`dynaforge.evaluate.stack_report`)
and `ensembles` the spread of its correctors' ensembles against their error (`dynaforge.evaluate.ensembles`:
spread-skill ratio and spread-error correlation, per rollout step and over the rollout). Evaluation is deterministic: the same run, data and device give the same
metrics.json byte for byte (no timestamps; fixed batches and order), whatever the torch thread count (each
batch, and the scoring, runs on one intra-op thread: `dynaforge.threads`).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import re
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import torch
from matplotlib.figure import Figure

from dynaforge.atomic import atomic_write_bytes, atomic_write_json, atomic_write_text
from dynaforge.config import (
    Config,
    ConfigError,
    EvaluateConfig,
    config_to_dict,
    config_to_yaml,
    load_config,
    resolve_device,
)
from dynaforge.data import DataIdentity, check_same_data, data_fingerprint, mixture_members
from dynaforge.data.boundary import split_with_boundary
from dynaforge.errors import DATA, RunError
from dynaforge.evaluate.ensembles import ENSEMBLE_MEMBERS, ensembles_section, spread_error_figure
from dynaforge.evaluate.plots import (
    FieldAxes,
    Panel,
    error_vs_step_figure,
    figure_to_png,
    high_correlation_figure,
    last_frame_figure,
    metric_curves_figure,
    snapshots_figure,
    space_time_figure,
    spectra_figure,
    training_curves_figure,
)
from dynaforge.evaluate.report import render_report
from dynaforge.evaluate.rollout import Rollouts, one_step_predictions, physical_channels, rollouts
from dynaforge.evaluate.stack_report import (
    is_stack,
    stack_ensembles,
    stack_figures,
    stack_one_step,
    stack_rollouts,
    stack_section,
    steady_prior_score,
)
from dynaforge.evaluate.suite import METRICS as METRICS_INFO
from dynaforge.evaluate.suite import PANELS, MetricSettings, score_predictions, score_rollouts
from dynaforge.evaluate.vorticity import is_flow, vorticity_figure
from dynaforge.metrics.physics import SPECTRUM_FLOOR
from dynaforge.models import ModelShape, load_surrogate
from dynaforge.models.latent_stack import LatentStack, load_stack
from dynaforge.runs import TRAIN_A_RUN, RunFolder, run_folder
from dynaforge.store import DatasetFolder, SplitArrays
from dynaforge.store.format import AXIS_NAMES, file_sha256
from dynaforge.store.labels import units_of
from dynaforge.threads import on_one_thread
from dynaforge.train.log import read_metrics

log = logging.getLogger(__name__)

METRICS = "metrics.json"
REPORT = "report.html"


PANEL_YLABELS = {
    "relative errors": "error / size of the truth",
    "absolute errors": "error (units of the field)",
    "Fourier-band RMSE (PDEBench)": "RMSE (units of the field)",
    "binned spectral MSE (The Well)": "MSE (units of the field, squared)",
    "binned spectral nMSE (The Well)": "MSE / true energy in the bin",
    "correlation with the truth": "Pearson correlation",
}
"""The y label of each panel of `dynaforge.evaluate.suite.PANELS` whose metrics share a unit."""

DIAGNOSTIC_PANELS = (
    Panel("energy-spectrum error", ("spectrum_error",), "mean |log10 E_pred(k) / E_true(k)|"),
    Panel("mass drift", ("mass_drift",), "|mean of prediction - of truth|"),
    Panel("energy drift", ("energy_drift",), "|energy drift| / energy of truth"),
)
"""The physics diagnostics, one panel each: their units differ."""

REPORT_PANELS = (
    *(Panel(title, names, PANEL_YLABELS[title]) for title, names in PANELS if title in PANEL_YLABELS),
    *DIAGNOSTIC_PANELS,
)


class ReportInputs(NamedTuple):
    """What the report draws beyond metrics.json: names, the test grid and the predicted frames' times."""

    run_name: str
    model: str
    channels: tuple[str, ...]
    units: str
    """The dataset's system of units, e.g. `nondimensional` (`dynaforge.store.labels.units_of`)."""
    coords: tuple[np.ndarray, ...]
    """The grid coordinates of every test sample along each spatial axis, (samples, points) each."""
    times: np.ndarray
    """The time of each predicted rollout frame, (frames,)."""


class EvaluationResult(NamedTuple):
    """What `evaluate` found (`metrics`, as RUN/eval/metrics.json holds them) and where its report is."""

    metrics: dict[str, Any]
    report: Path

    def __repr__(self) -> str:
        """The key figures, not the whole metrics dict (it holds spectra and per-frame curves)."""
        metrics = self.metrics
        figures = [f"{key}={metrics[key]:.4g}" for key in HEADLINE if isinstance(metrics.get(key), float)]
        rollout = metrics.get("rollout_nrmse")
        if isinstance(rollout, list) and rollout:
            figures.append(f"rollout_nrmse=<{len(rollout)} frames, {rollout[0]:.4g} to {rollout[-1]:.4g}>")
        if "checkpoint" in metrics:
            figures.append(f"checkpoint={metrics['checkpoint']!r}")
        if "test_samples" in metrics:
            figures.append(f"test_samples={metrics['test_samples']}")
        figures += [f"report={str(self.report)!r}", f"metrics=<{len(metrics)} keys>"]
        return f"EvaluationResult({', '.join(figures)})"


HEADLINE = ("one_step_nrmse", "rollout_nrmse_mean", "rollout_nrmse_gmean")
"""The single numbers an evaluation is summed up by (its printed form)."""


def evaluate(
    run: str | Path,
    data: str | Path | None = None,
    config: EvaluateConfig | None = None,
    checkpoint: str | None = None,
) -> EvaluationResult:
    """Evaluate run folder `run` on the test split of `data` (default: the dataset it was trained on).

    `config` defaults to the `evaluate` section of RUN/config.yaml; `checkpoint` (`best` or `last`)
    overrides its `checkpoint`.
    """
    folder = run_folder(run)
    config = config or evaluate_config_of(folder)
    if checkpoint is not None:
        config = dataclasses.replace(config, checkpoint=checkpoint)
    # a staged latent stack: the operator stage's checkpoint is the model, the stack's root gets eval/
    model_folder = run_folder(folder.root / "operator") if is_stack(folder.root) else folder
    checkpoint_path = model_folder.checkpoint(config.checkpoint)
    device = torch.device(resolve_device(config.device))
    model, shape, normalizer, trained, checkpoint = load_surrogate(checkpoint_path, device)
    dataset = DatasetFolder(dataset_root(checkpoint, data, folder.root))
    if "data_identity" in checkpoint:  # runs trained before it was recorded: check_compatible only
        check_same_data(DataIdentity.from_dict(checkpoint["data_identity"]), dataset, str(folder.root))
    test = dataset.read_split("test", config.test_samples)
    physical, test = test.fields.shape[-1], split_with_boundary(test, shape.boundary, shape.parameters)
    check_compatible(test.fields, shape, dataset.root)
    stride, batch_size = trained.data.stride, trained.data.batch_size
    settings = metric_settings(config, dataset, test, shape, stride)

    stack = None
    if model_folder is not folder:
        stack = load_stack(folder.root, device)._replace(operator=model)
        one_step = on_one_thread(
            lambda: stack_one_step(stack, test.fields, test.params, shape, stride, batch_size)
        )
        rolled = on_one_thread(
            lambda: stack_rollouts(
                stack, test.fields, test.params, shape, stride, config.start_frame, config.rollout_frames
            )
        )
    else:
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
    if shape.boundary or shape.parameters:  # inputs, not fields: neither scored nor drawn
        one_step, rolled = physical_channels(one_step, physical), physical_channels(rolled, physical)
        test = test._replace(fields=test.fields[..., :physical])
    # Scores reduce whole tensors: on one intra-op thread, their sums do not depend on the thread count.
    one_step_scores = on_one_thread(lambda: score_predictions(one_step, settings))
    scores = on_one_thread(lambda: score_rollouts(rolled, settings))
    rollout_nrmse = scores["curves"]["nrmse"]
    metrics = {
        "one_step_nrmse": one_step_scores["nrmse"],
        "rollout_nrmse": rollout_nrmse,
        "rollout_nrmse_mean": scores["means"]["nrmse"],
        "rollout_nrmse_gmean": scores["nrmse_gmean"],
        "gmean_horizon": scores["gmean_horizon"],
        "rollout_frames": len(rollout_nrmse),
        "frame_dt": settings.frame_dt,
        "one_step": one_step_scores,
        "rollout": scores["means"],
        "rollout_per_frame": scores["curves"],
        "rollout_windows": scores["windows"],
        "correlation_time": scores["correlation_time"],
        "high_correlation_time": scores["high_correlation_time"],
        "system": dataset.system,
        "conserved": scores["conserved"],
        "spectra": scores["spectra"],
        "worst_samples": scores["worst_samples"],
        "sample_nrmse": scores["sample_nrmse"],
        "domain_lengths": list(settings.lengths),
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
    if stack is not None:
        metrics["latent_stack"] = on_one_thread(lambda: stack_metrics(stack, rolled, test, dataset, trained))
        variants = on_one_thread(lambda: stack_ensembles(stack, rolled, test.params))
        if variants:
            metrics["ensembles"] = ensembles_section(variants, ENSEMBLE_MEMBERS)
    out = evaluation_folder(folder, checkpoint, dataset)
    inputs = report_inputs(folder, dataset, test, shape, stride, config, rolled, trained, stack is not None)
    report = write_outputs(folder, metrics, rolled, config, trained, inputs, model_folder, out)
    log.info(
        "test one-step nRMSE %.3e, rollout nRMSE at step %d %.3e; report: %s",
        metrics["one_step_nrmse"],
        metrics["rollout_frames"],
        rollout_nrmse[-1],
        report,
    )
    return EvaluationResult(metrics=metrics, report=report)


def stack_metrics(
    stack: LatentStack, rolled: Rollouts, test: SplitArrays, dataset: DatasetFolder, trained: Config
) -> dict[str, Any]:
    """The stack section of metrics.json (`dynaforge.evaluate.stack_report.stack_section`)."""
    steady = None
    if stack.steady_prior is not None:
        last_frames = min(trained.stages.steady_prior.last_frames, test.fields.shape[1])
        train_fields = dataset.read_split("train").fields
        steady = steady_prior_score(stack, test.fields, test.params, train_fields, last_frames)
    return stack_section(stack, rolled, test.params, steady=steady)


def report_inputs(
    folder: RunFolder,
    dataset: DatasetFolder,
    test: SplitArrays,
    shape: ModelShape,
    stride: int,
    config: EvaluateConfig,
    rolled: Rollouts,
    trained: Config,
    stacked: bool,
) -> ReportInputs:
    """Names, grid and frame times of the report's figures. Predicted frame k (0-based) stands for stored
    frame start_frame + (history + k) * stride."""
    frames, channels = rolled.predicted.shape[1], rolled.predicted.shape[2]
    stored = config.start_frame + (shape.history + np.arange(frames)) * stride
    if len(test.time) > int(stored[-1]):
        times = np.asarray(test.time, dtype=np.float64)[stored]
    else:  # a store without frame times for every frame: frame indices
        times = stored.astype(np.float64)
    coords = []
    for axis, points in zip(AXIS_NAMES, rolled.predicted.shape[3:]):
        grid = test.coords.get(axis)
        if grid is None or grid.shape[-1] != points:
            grid = np.broadcast_to(np.arange(points, dtype=np.float64), (rolled.predicted.shape[0], points))
        coords.append(np.asarray(grid, dtype=np.float64))
    root = folder.root.resolve()
    return ReportInputs(
        run_name=f"{root.parent.name}/{root.name}" if root.parent.name else root.name,
        model="latent stack" if stacked else trained.model.name,
        channels=channel_names(dataset, channels),
        units=units_of(dataset.system).system,
        coords=tuple(coords),
        times=times,
    )


FORMER_CHANNEL_NAMES: dict[tuple[str, tuple[str, ...]], tuple[str, ...]] = {
    ("navier_stokes", ("u",)): ("vorticity",),
}
"""(system, channel names its datasets recorded before the system named its channels) -> what the channels
hold: such a dataset still reads, trains and evaluates as it is, and its report names the quantity."""


def channel_names(dataset: DatasetFolder, channels: int) -> tuple[str, ...]:
    """The dataset's channel names (its shards' `channel_names`, or what they hold where a former version
    recorded a placeholder: `FORMER_CHANNEL_NAMES`), `channel I` where none are recorded."""
    names = list(dataset.channel_names)
    if len(names) != channels:
        names = [f"channel {i}" for i in range(channels)]
    return FORMER_CHANNEL_NAMES.get((dataset.system, tuple(names)), tuple(names))


def metric_settings(
    config: EvaluateConfig, dataset: DatasetFolder, test: SplitArrays, shape: ModelShape, stride: int
) -> MetricSettings:
    """What the metrics need beyond the fields: domain, frame interval, system, report settings and the
    channel of an obstacle mask (`obstacle`) whose cells the metrics ignore."""
    names = dataset.channel_names
    return MetricSettings(
        lengths=domain_lengths(test, shape.spatial_dims),
        fourier_bands=(config.fourier_low, config.fourier_high),
        correlation_threshold=config.correlation_threshold,
        gmean_horizon=config.gmean_horizon,
        frame_dt=frame_dt(dataset, test.time, stride),
        system=dataset.system,
        worst_samples=config.worst_samples,
        obstacle_channel=names.index("obstacle") if "obstacle" in names else None,
    )


def evaluate_config_of(folder: RunFolder) -> EvaluateConfig:
    if not folder.root.is_dir():
        raise RunError(f"{folder.root} is not a run folder; train one with `{TRAIN_A_RUN}`")
    if folder.config.exists():
        return load_config(folder.config).evaluate
    return EvaluateConfig()


def dataset_root(checkpoint: dict[str, Any], data: str | Path | None, run: Path) -> Path:
    if data is not None:
        return Path(data)
    if checkpoint.get("data") is None:
        raise RunError(no_dataset_message(checkpoint.get("data_identity"), run))
    recorded = Path(checkpoint["data"])
    if not recorded.exists():
        raise RunError(f"the dataset the run was trained on ({recorded}) is gone; pass {DATA} or FILE")
    return recorded


def no_dataset_message(identity: dict[str, Any] | None, run: Path) -> str:
    """What to pass for a run trained from the stream without a dataset folder (nothing recorded to score
    on): a dataset of its system, made from its own config; for a mixture, of one of its members."""
    systems = mixture_members(DataIdentity.from_dict(identity).system) if identity else ["its system"]
    if len(systems) > 1:
        how = "generate a config whose `system` section is one of the mixture's"
    else:
        how = f"`dynaforge generate {run / 'config.yaml'} --out DIR`"
    members = ", or --members to score it on each member's own test trajectories" if len(systems) > 1 else ""
    return (
        f"{run} was trained from the stream and has no dataset folder to score on; pass {DATA}: a dataset of "
        f"{' or '.join(systems)} on the run's grid (make one: {how}){members}"
    )


def evaluation_folder(folder: RunFolder, checkpoint: dict[str, Any], dataset: DatasetFolder) -> Path:
    """RUN/eval for the data the run was trained on (the same shards, wherever they lie now; the same path
    for runs that predate the fingerprint); RUN/eval-NAME for other data (NAME: the data's folder or file
    name), so that evaluating elsewhere never replaces the run's own evaluation."""
    if "data_fingerprint" in checkpoint:
        own = checkpoint["data_fingerprint"] == data_fingerprint(dataset)
    else:
        own = Path(checkpoint.get("data", "")).resolve() == dataset.root.resolve()
    if own:
        return folder.eval
    name = re.sub(r"[^A-Za-z0-9._-]+", "_", dataset.root.resolve().name) or "data"
    return folder.root / f"eval-{name}"


def check_compatible(fields: np.ndarray, shape: ModelShape, root: Path) -> None:
    channels, spatial_dims = fields.shape[-1], fields.ndim - 3
    if channels != shape.channels or spatial_dims != shape.spatial_dims:
        raise RunError(
            f"{root} holds {channels} channel(s) on {spatial_dims} spatial axes, but the model was trained on "
            f"{shape.channels} channel(s) on {shape.spatial_dims}; pass the matching {DATA}"
        )


def frame_dt(dataset: DatasetFolder, time: np.ndarray, stride: int) -> float | None:
    """Time between two model frames: from the dataset's dynaforge config when it has one (exact), else
    from its stored frame times (PDEBench and The Well files, converted or not); None when unknown."""
    try:
        system = dataset.config.system
    except ConfigError:  # a dataset from another tool carries no (or another) dynaforge config
        if len(time) <= stride:
            return None
        return float(time[stride] - time[0])
    return system.dt * system.save_every * stride


def domain_lengths(test: SplitArrays, spatial_dims: int) -> tuple[float, ...]:
    """Length of each spatial axis: points x grid spacing of the first test sample's coordinates (the
    domain of a periodic grid that includes its left end and excludes its right), 1 when unknown."""
    lengths = []
    for axis in AXIS_NAMES[:spatial_dims]:
        coords = test.coords.get(axis)
        if coords is None or coords.shape[-1] < 2:
            lengths.append(1.0)
            continue
        first = coords[0]
        lengths.append(float(len(first) * (first[1] - first[0])))
    return tuple(lengths)


def write_outputs(
    folder: RunFolder,
    metrics: dict[str, Any],
    rolled: Rollouts,
    config: EvaluateConfig,
    trained: Config,
    inputs: ReportInputs,
    model_folder: RunFolder | None = None,
    out: Path | None = None,
) -> Path:
    """metrics.json, the PNG figures beside it, and report.html (figures embedded), all atomically, in `out`
    (default RUN/eval). `model_folder`: where the model's training log is (a stack's operator stage;
    default `folder`)."""
    out = out or folder.eval
    out.mkdir(parents=True, exist_ok=True)
    worst, samples = drawn_trajectories(metrics, config)
    figures = report_figures(metrics, rolled, inputs, worst, samples)
    training_png = training_figure(model_folder or folder)
    if training_png is not None:
        figures["training"] = [
            ("Training and validation loss from metrics.jsonl", "training.png", training_png)
        ]
    if "latent_stack" in metrics:
        figures["stack"] = stack_figures(metrics["latent_stack"], metrics["frame_dt"])
    if "ensembles" in metrics:
        figures["ensembles"] = [
            (
                "Ensemble spread and the error of the ensemble mean against rollout time, their ratio per "
                "step, and one point per (trajectory, step)",
                "ensemble_spread_error.png",
                figure_to_png(spread_error_figure(metrics["ensembles"], metrics["frame_dt"])),
            )
        ]
    for section in figures.values():
        for _, name, png in section:
            atomic_write_bytes(out / name, png)
    atomic_write_json(out / METRICS, metrics)
    html = render_report(
        title=f"{metrics['system']} ({len(inputs.coords)}D), {inputs.model} model: run {inputs.run_name}",
        metrics=metrics,
        figures={key: [(caption, png) for caption, _, png in section] for key, section in figures.items()},
        config_yaml=config_to_yaml(trained),
        training=training_summary(model_folder or folder),
        worst=worst,
    )
    atomic_write_text(out / REPORT, html)
    return out / REPORT


def drawn_trajectories(
    metrics: dict[str, Any], config: EvaluateConfig
) -> tuple[list[dict[str, Any]], list[int]]:
    """The worst samples the report shows and the other test trajectories it draws, never the same one
    twice: `plot_samples` trajectories that are not among the worst come first (they show what a typical
    rollout looks like), so a small split shows fewer worst samples than metrics.json lists."""
    total = metrics["test_samples"]
    samples_wanted = min(config.plot_samples, total)
    worst = metrics["worst_samples"][: max(total - samples_wanted, 0)]
    taken = {w["index"] for w in worst}
    samples = [index for index in range(total) if index not in taken][:samples_wanted]
    return worst, samples


def report_figures(
    metrics: dict[str, Any],
    rolled: Rollouts,
    inputs: ReportInputs,
    worst: list[dict[str, Any]],
    samples: list[int],
) -> dict[str, list[tuple[str, str, bytes]]]:
    """Report section -> (caption, file name, PNG bytes) of every figure."""
    labels = {name: info.label for name, info in METRICS_INFO.items()}
    spectra = metrics["spectra"]
    figures: dict[str, list[tuple[str, str, Figure]]] = {
        "horizon": [
            (
                "nRMSE of each autoregressive rollout step on the test split",
                "error_vs_step.png",
                error_vs_step_figure(
                    metrics["rollout_nrmse"], metrics["one_step_nrmse"], metrics["frame_dt"]
                ),
            ),
            (
                "Every metric against the rollout step (one panel per unit)",
                "metrics_vs_step.png",
                metric_curves_figure(
                    REPORT_PANELS, metrics["rollout_per_frame"], labels, metrics["frame_dt"]
                ),
            ),
            (
                "Pearson correlation with the truth (mean over test samples) against rollout time; the "
                "high-correlation time of a sample ends where its correlation first falls below the line",
                "correlation_vs_time.png",
                high_correlation_figure(metrics["high_correlation_time"]),
            ),
        ],
        "physics": [
            (
                "Energy spectra of truth and prediction at the first, middle and last rollout step; the "
                "energy-spectrum error leaves out the shells whose true energy is below the dotted line",
                "spectra.png",
                spectra_figure(spectra["truth"], spectra["predicted"], spectra["frames"], SPECTRUM_FLOOR),
            )
        ],
        "worst": [],
        "samples": [],
    }
    channel = inputs.channels[0]
    for rank, sample in enumerate(worst):
        index = sample["index"]
        about = f"Worst sample {rank + 1}: test trajectory {index} (rollout nRMSE {sample['nrmse']:.3e}), channel {channel}"
        title = f"Worst sample {rank + 1}: test trajectory {index}"
        for suffix, what, figure in sample_figures(rolled, index, title, inputs):
            figures["worst"].append((f"{about}{what}", f"worst_{rank + 1}{suffix}.png", figure))
    for position, index in enumerate(samples):
        about = f"Test trajectory {index}: truth, rollout prediction and error, channel {channel}"
        for suffix, what, figure in sample_figures(rolled, index, f"Test trajectory {index}", inputs):
            figures["samples"].append((f"{about}{what}", f"sample_{position}{suffix}.png", figure))
    if samples and is_flow(inputs.channels, rolled.truth.ndim - 3):
        index = samples[0]
        about = f"Test trajectory {index}: vorticity dv/dx - du/dy of the truth and of the rollout prediction"
        axes = FieldAxes(tuple(c[index] for c in inputs.coords), inputs.times, "", inputs.units)
        truth, predicted = rolled.truth[index].numpy(), rolled.predicted[index].numpy()
        drawn = vorticity_figure(truth, predicted, inputs.channels, f"Test trajectory {index}", axes)
        figures["samples"].append((about, "vorticity.png", drawn))
    return {
        key: [(caption, name, figure_to_png(figure)) for caption, name, figure in section]
        for key, section in figures.items()
    }


def sample_figures(
    rolled: Rollouts, sample: int, title: str, inputs: ReportInputs
) -> list[tuple[str, str, Figure]]:
    """(file name suffix, caption suffix, figure) of channel 0 of one trajectory: space-time images for 1D
    fields; for 2D and 3D (a mid slice), the last predicted frame and 4 frames across the rollout."""
    truth, predicted = rolled.truth[sample, :, 0].numpy(), rolled.predicted[sample, :, 0].numpy()
    field_axes = FieldAxes(
        coords=tuple(c[sample] for c in inputs.coords),
        times=inputs.times,
        field=f"{inputs.channels[0]} ({inputs.units})",
        unit=inputs.units,
    )
    if truth.ndim == 2:  # (frames, x)
        return [("", "", space_time_figure(truth, predicted, title, field_axes))]
    while truth.ndim > 3:  # 3D: the middle slice along the last axis
        middle = truth.shape[-1] // 2
        truth, predicted = truth[..., middle], predicted[..., middle]
        title = f"{title}, mid-{AXIS_NAMES[truth.ndim - 1]} slice"
    return [
        ("", ", last rollout step", last_frame_figure(truth, predicted, title, field_axes)),
        (
            "_frames",
            ", frames across the rollout",
            snapshots_figure(truth, predicted, title, field_axes),
        ),
    ]


def training_figure(folder: RunFolder) -> bytes | None:
    """The loss curves of metrics.jsonl: per log interval and per epoch (None without a log)."""
    if not folder.metrics.exists():
        return None
    records = read_metrics(folder.metrics)
    intervals = [r for r in records if r.get("kind") == "train" and "loss" in r and "step" in r]
    epochs = [r for r in records if r.get("kind") == "epoch" and "step" in r]
    if not intervals and not epochs:
        return None
    return figure_to_png(
        training_curves_figure([r["step"] for r in intervals], [r["loss"] for r in intervals], epochs)
    )


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
        # `elapsed` counts validation and checkpoints too, across resumes; logs before it had epoch times
        "training_seconds": round(epochs[-1].get("elapsed") or sum(r["epoch_time"] for r in epochs), 1),
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
