"""Run logging: metrics.jsonl (always), device-side meters per log interval, optional Weights & Biases.

metrics.jsonl lines carry a `kind`: `header` (code version and environment, first line), `train` (one per
log interval: loss, lr, grad norm, skipped steps, throughput), `epoch` (train and validation loss, epoch
time, best so far), `resume` (where a resumed run picked up), `budget` (a `train.time_budget` run's plan:
epochs, and the timed seconds per micro-batch, validation and checkpoints; then one `settled` record per
count made from measured epochs, `after_epoch` 1 and a later one, with the new count and the `epoch_seconds`
it was made from). `train` and `epoch` lines carry `elapsed`: the seconds the run has trained so far, resumes
included (error against wall time).

The meters add on the device, in place, and are read back once per log interval: no host sync per step.
"""

from __future__ import annotations

import json
import logging
import math
import netrc
import os
import platform
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import dynaforge
from dynaforge.atomic import atomic_write_bytes, atomic_write_text, check_output_folder
from dynaforge.config import WandbConfig, config_to_dict, save_config
from dynaforge.errors import OUT, RESUME, RunError
from dynaforge.runs import RUN_ENTRIES, check_same_run, load_checkpoint, run_folder

log = logging.getLogger(__name__)


class MetricsLog:
    """Appends JSON lines to a file, flushed line by line (a killed run keeps every line written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def start(self, header: dict[str, Any]) -> None:
        """Begin a fresh log with its header line."""
        self.path.write_text("")
        self.write({"kind": "header", **header})

    def resume(self, step: int, record: dict[str, Any]) -> None:
        """Keep the lines up to optimiser step `step` (what the checkpoint holds), then add `record`."""
        kept = [r for r in read_metrics(self.path) if r.get("step", 0) <= step] if self.path.exists() else []
        atomic_write_text(self.path, "".join(json.dumps(r) + "\n" for r in kept))
        self.write(record)

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file (a line cut short by a kill is ignored)."""
    records = []
    for line in Path(path).read_text().splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return records


class TrainingDiverged(RunError):
    """Training produced non-finite losses or gradients it could not skip past."""


class RunLog:
    """A training run's records: metrics.jsonl always, Weights & Biases when enabled. Only the main process
    writes (`main`); every process logs to the console."""

    def __init__(self, path: Path, main: bool) -> None:
        self.metrics = MetricsLog(path)
        self.main = main
        self.wandb: WandbLogger | None = None

    def start(self, header: dict[str, Any]) -> None:
        if self.main:
            self.metrics.start(header)

    def resume(self, step: int, record: dict[str, Any]) -> None:
        if self.main:
            self.metrics.resume(step, record)

    def open_wandb(self, settings: WandbConfig, root: Path, config: dict[str, Any], key: str) -> None:
        if self.main and settings.enabled:
            self.wandb = WandbLogger(settings, root, config, key)

    def write(self, record: dict[str, Any]) -> None:
        if self.main:
            self.metrics.write(record)
            if self.wandb is not None:
                self.wandb.log(record)

    def interval(self, record: dict[str, Any], key: str, max_bad_steps: int) -> None:
        """Write a log interval's record; stop on `max_bad_steps` skipped steps in a row (the settings
        section `key` names the fix), warn on skipped ones."""
        self.write(record)
        if record["bad_streak"] >= max_bad_steps:
            raise TrainingDiverged(
                f"{record['bad_streak']} optimiser steps in a row had a non-finite loss or gradient (by step "
                f"{record['step']}); stopping after {key}.max_bad_steps={max_bad_steps}. Lower {key}.lr, set "
                f"{key}.grad_clip, use {key}.precision=fp32, or check the data for NaN/Inf. "
                "checkpoints/last.pt holds the last good state."
            )
        if record["skipped"]:
            log.warning(
                "%d step(s) skipped for a non-finite loss or gradient by step %d",
                record["skipped"],
                record["step"],
            )

    def checkpoint(self, path: Path, aliases: list[str], metadata: dict[str, Any]) -> None:
        """Log the checkpoint at `path` to W&B, when W&B is on and asked to keep checkpoints."""
        if self.main and self.wandb is not None and self.wandb.config.log_checkpoints:
            self.wandb.log_checkpoint(path, aliases, metadata)

    def finish(self) -> None:
        if self.wandb is not None:
            self.wandb.finish()


def epoch_metrics(path: str | Path, upto: int) -> list[tuple[int, dict[str, float]]]:
    """The metrics of each epoch up to `upto` in a run's metrics.jsonl, as epoch callbacks receive them."""
    best = math.inf
    found = []
    for record in read_metrics(path):
        if record.get("kind") == "epoch" and record["epoch"] <= upto:
            best = min(best, record["val_loss"])
            metrics = {k: v for k, v in record.items() if k.startswith("val_")}
            metrics["best_val_loss"] = best
            metrics["train_loss"] = record.get("train_loss", math.nan)
            found.append((record["epoch"], metrics))
    return found


class IntervalMeter:
    """Sums over a log interval (`train.log_every` steps), on the device: loss and grad norm of good steps, skipped steps, and the
    longest run of consecutive skipped steps; and the epoch's loss sum and good steps. Step and sample
    counts are kept on the host (`count`).

    `add` is a handful of in-place device operations (no host sync), so it can run inside a captured
    CUDA graph.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        # loss sum, grad-norm sum, good steps, bad steps, current bad streak, longest bad streak
        self.sums = torch.zeros(6, dtype=torch.float64, device=device)
        self.epoch = torch.zeros(2, dtype=torch.float64, device=device)  # loss sum, good steps
        self.details: dict[str, Tensor] = {}  # sums over the interval's good steps of a task's own measures
        self.reset()

    def reset(self) -> None:
        """Start a new interval (a streak of bad steps carries over into it)."""
        self.sums[:4].zero_()
        self.sums[5:].copy_(self.sums[4:5])
        for total in self.details.values():
            total.zero_()
        self.steps = 0
        self.samples = 0
        self.started = time.perf_counter()

    def add(
        self, loss: Tensor, grad_norm: Tensor, bad: Tensor, details: dict[str, Tensor] | None = None
    ) -> None:
        """Account one optimiser step; `bad` is a 0-dim bool tensor (the step was skipped); `details` are a
        task's own 0-dim measures of the step (`StepLoss.details`), averaged over the interval's good steps."""
        for name, value in (details or {}).items():
            if name not in self.details:
                self.details[name] = torch.zeros((), dtype=torch.float64, device=self.device)
            # In place on purpose, like the sums below.
            self.details[name].add_(torch.where(bad, 0.0, value.detach().to(torch.float64)))
        bad64 = bad.to(torch.float64).reshape(1)
        values = torch.where(bad, 0.0, torch.stack([loss.detach(), grad_norm.detach()]).to(torch.float64))
        increments = torch.cat([values, 1.0 - bad64, bad64])  # loss, norm, good, bad
        # In place on purpose: persistent accumulators, updated every step without a host sync.
        self.sums[:4].add_(increments)
        self.sums[4:5].add_(1.0).mul_(bad64)  # the streak grows by one on a bad step, else restarts
        torch.maximum(self.sums[5:], self.sums[4:5], out=self.sums[5:])
        self.epoch.add_(increments[0::2])

    def restart_clock(self) -> None:
        """Throughput counts from now (after validation, checkpoints or compilation)."""
        self.started = time.perf_counter()

    def count(self, samples: int) -> None:
        self.steps += 1
        self.samples += samples

    def read(self, sum_ranks: Callable[[Tensor], Tensor] | None = None, ranks: int = 1) -> dict[str, Any]:
        """Interval means and throughput: the one host sync of the interval.

        Under DDP `sum_ranks` sums the meters over the `ranks` processes: the loss becomes the mean of the
        ranks' batch means (the global batch mean, the batches being of equal size); the other meters
        are the same on every rank (they follow the all-reduced gradients).
        """
        seconds = max(time.perf_counter() - self.started, 1e-9)
        names = sorted(self.details)
        meters = torch.cat([self.sums, *(self.details[name].reshape(1) for name in names)])
        meters = meters if sum_ranks is None else sum_ranks(meters) / ranks
        loss_sum, norm_sum, good, bad, _, longest, *detail_sums = meters.tolist()
        return {
            "loss": loss_sum / good if good else float("nan"),
            **{name: total / good if good else float("nan") for name, total in zip(names, detail_sums)},
            "grad_norm": norm_sum / good if good else float("nan"),
            "skipped": int(bad),
            "bad_streak": int(longest),
            "samples_per_s": self.samples * ranks / seconds,
            "steps": self.steps,
        }


def environment() -> dict[str, Any]:
    """Code version and environment, for the top of every run log."""
    return {
        "dynaforge_version": dynaforge.__version__,
        **code_version(),
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "gpus": [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())],
        "argv": sys.argv,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def code_version() -> dict[str, Any]:
    """The git commit of the dynaforge source (and whether it has uncommitted changes), when in a checkout."""
    source = Path(dynaforge.__file__).resolve().parent
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=source,
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return {"git_commit": None}
    return {"git_commit": commit, "git_dirty": bool(status.strip())}


# ---- Weights & Biases (optional) --------------------------------------------------------------------


def wandb_key_configured() -> bool:
    """True when W&B has an API key: WANDB_API_KEY, or an api.wandb.ai entry in ~/.netrc (`wandb login`)."""
    if os.environ.get("WANDB_API_KEY"):
        return True
    try:
        return netrc.netrc().authenticators("api.wandb.ai") is not None
    except (OSError, netrc.NetrcParseError):
        return False


class WandbLogger:
    """Mirrors metrics.jsonl records to a W&B run (offline when no key is configured).

    The run id is kept in RUN/wandb.json so that a resumed training continues the same W&B run.
    """

    def __init__(
        self, config: WandbConfig, run_root: Path, full_config: dict[str, Any], key: str = "train.wandb"
    ) -> None:
        """`key` is the config key of `config` (named in the error when wandb is missing)."""
        self.config = config
        try:
            import wandb  # lazy: an optional extra (dynaforge[wandb])
        except ImportError as error:
            raise RunError(
                f"{key}.enabled=true needs the optional wandb package: pip install 'dynaforge[wandb]' "
                f"(or set {key}.enabled=false)"
            ) from error
        mode = config.mode
        if mode == "auto":
            mode = "online" if wandb_key_configured() else "offline"
        id_file = run_root / "wandb.json"
        run_id = json.loads(id_file.read_text())["id"] if id_file.exists() else None
        self.run = wandb.init(
            project=config.project,
            entity=config.entity,
            group=config.group,
            name=config.name or run_root.name,
            tags=list(config.tags),
            config=full_config,
            dir=str(run_root),
            mode=mode,
            id=run_id,
            resume="allow",
        )
        self.mode = mode
        if run_id is None and getattr(self.run, "id", None):
            atomic_write_text(id_file, json.dumps({"id": self.run.id}))

    def log(self, record: dict[str, Any]) -> None:
        values = {f"{record['kind']}/{k}": v for k, v in record.items() if numeric(v) and k != "step"}
        self.run.log(values, step=int(record.get("step", 0)))

    def log_checkpoint(self, path: Path, aliases: list[str], metadata: dict[str, Any]) -> None:
        """Upload a checkpoint file as a `model` artifact of this run (queued for `wandb sync` offline)."""
        import wandb  # lazy: an optional extra (dynaforge[wandb])

        artifact = wandb.Artifact(f"checkpoint-{self.run.id}", type="model", metadata=metadata)
        artifact.add_file(str(path), name=ARTIFACT_FILE)
        self.run.log_artifact(artifact, aliases=aliases)

    def finish(self) -> None:
        self.run.finish()


ARTIFACT_FILE = "checkpoint.pt"
"""The checkpoint's file name inside a W&B checkpoint artifact."""


def download_checkpoint_artifact(reference: str, destination: Path) -> Path:
    """Download the checkpoint of W&B artifact `reference` (`entity/project/checkpoint-ID:alias`) to
    `destination`, atomically. Needs the wandb package and access to the W&B server."""
    try:
        import wandb  # lazy: an optional extra (dynaforge[wandb])
    except ImportError as error:
        raise RunError(
            "--resume-from-artifact needs the optional wandb package: pip install 'dynaforge[wandb]'"
        ) from error
    with tempfile.TemporaryDirectory() as folder:
        try:
            artifact = wandb.Api().artifact(reference, type="model")
            downloaded = Path(artifact.download(root=folder)) / ARTIFACT_FILE
        except Exception as error:  # wandb raises its own errors for bad names, access and network
            raise RunError(f"cannot download W&B artifact {reference!r}: {error}") from error
        if not downloaded.exists():
            raise RunError(
                f"W&B artifact {reference!r} holds no {ARTIFACT_FILE}; it was not logged by dynaforge"
            )
        atomic_write_bytes(destination, downloaded.read_bytes())
    return destination


def start_from_artifact(reference: str, run_root: str | Path, config: Any) -> None:
    """Make run folder `run_root` continue from W&B checkpoint artifact `reference`: its checkpoint becomes
    RUN/checkpoints/last.pt (for `resume`) after checking it was trained with the same `config`."""
    run = run_folder(run_root)
    check_output_folder(run.root, RUN_ENTRIES, "a run folder", RunError)
    if run.last.exists():
        raise RunError(
            f"{run.root} already holds a checkpoint; continue it with {RESUME}, or download the artifact "
            f"into a new {OUT} folder"
        )
    download_checkpoint_artifact(reference, run.last)
    saved = load_checkpoint(run.last).get("config", {})
    try:
        check_same_run(
            saved,
            config_to_dict(config),
            f"W&B artifact {reference!r}",
            "Pass the config it was trained with.",
        )
    except RunError:
        run.last.unlink()
        raise
    save_config(config, run.config)


def numeric(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
