"""What the engine settles before training starts: which checkpoint a run continues from, whether the
environment allows the asked-for determinism, whether the step can be captured in a CUDA graph, and the
process-wide flags and seeds of the run. Functions of their arguments only (`dynaforge.train.engine` calls
them)."""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

from dynaforge.atomic import atomic_path, check_output_folder
from dynaforge.config import Config, ConfigError, TrainConfig, config_to_dict, load_config, save_config
from dynaforge.errors import OUT, RESUME, Option, RunError
from dynaforge.runs import (
    RUN_ENTRIES,
    CheckpointError,
    RunFolder,
    check_same_run,
    holds_run,
    load_checkpoint,
)
from dynaforge.train.task import Task

log = logging.getLogger(__name__)


OVERWRITE = Option("overwrite", True, cli="delete it first")
"""Replace a run folder's run (the command line has no flag for it)."""


def checkpoint_to_resume(run: RunFolder, config: Config, resume: bool, overwrite: bool) -> Path | None:
    """The last checkpoint of `run` to continue from (a run of the same config), None for a fresh run;
    refuses to clobber another run, and a folder that holds something else."""
    check_output_folder(run.root, RUN_ENTRIES, "a run folder", RunError)
    if resume and run.config.exists():
        check_same_run(
            config_to_dict(load_config(run.config)),
            config_to_dict(config),
            str(run.root),
            f"Pass the run's own config ({run.config}), or train into another {OUT} folder.",
        )
    if resume and run.last.exists():
        return run.last
    if holds_run(run.root) and not (overwrite or resume):
        raise RunError(
            f"{run.root} already holds a run: continue it ({RESUME}), replace it ({OVERWRITE}) or write "
            f"another run (another {OUT} folder)"
        )
    return None


def resume_state(run: RunFolder, path: Path, device: torch.device) -> tuple[Path, dict[str, Any]]:
    """The checkpoint to continue from and its state: `path` (last.pt), or best.pt when last.pt cannot be
    read (copied over it; the epochs after best.pt's are then trained again, and the log says so)."""
    try:
        return path, load_checkpoint(path, map_location=device)
    except CheckpointError as error:
        if path != run.last or not run.best.exists():
            raise
        try:
            state = load_checkpoint(run.best, map_location=device)
        except CheckpointError as second:
            raise CheckpointError(
                f"neither checkpoint of {run.root} can be read ({error.message}; {second.message}); train "
                f"again into a new {OUT} folder"
            ) from None
        # The damaged file is kept aside; last.pt becomes the newest readable state.
        path.replace(path.with_name(path.name + ".damaged"))
        with atomic_path(path) as tmp:
            shutil.copyfile(run.best, tmp)
        log.warning(
            "%s\nresuming from %s instead (epoch %d, step %d): the training after it is done again; the "
            "damaged file is kept as %s.damaged",
            error,
            run.best,
            state.get("epoch", 0),
            state.get("step", 0),
            path.name,
        )
        return path, state


class TrainingInterrupted(RunError):
    """Training stopped by Ctrl-C at a safe point, its state saved in last.pt."""


class StopRequest:
    """Ctrl-C (SIGINT) during training: the first asks the engine to stop after the current optimiser step
    (it writes last.pt and raises `TrainingInterrupted`, which says how to continue); a second stops at
    once (KeyboardInterrupt). Only in the main thread of a single process: ranks of a distributed run
    could see the signal at different steps and would wait on each other."""

    def __init__(self) -> None:
        self.asked = False

    @contextlib.contextmanager
    def listening(self, enabled: bool) -> Iterator[None]:
        if not enabled or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.getsignal(signal.SIGINT)

        def ask(signum: int, frame: Any) -> None:
            self.asked = True
            signal.signal(signal.SIGINT, signal.default_int_handler)
            log.warning(
                "Ctrl-C: stopping after this step and saving a checkpoint (Ctrl-C again: stop at once)"
            )

        signal.signal(signal.SIGINT, ask)
        try:
            yield
        finally:
            signal.signal(signal.SIGINT, previous)

    def stop_if_asked(self, checkpoint: Path, step: int) -> None:
        if self.asked:
            raise TrainingInterrupted(
                f"interrupted at step {step}; {checkpoint} holds the run: continue it with the same command "
                f"and {RESUME}"
            )


def start_run_folder(run: RunFolder, config: Config) -> None:
    """A fresh run in `run`: what an earlier attempt left removed, the config saved."""
    for stale in (run.checkpoints, run.eval, run.root / "profile"):
        shutil.rmtree(stale, ignore_errors=True)
    (run.root / "wandb.json").unlink(missing_ok=True)
    run.checkpoints.mkdir(parents=True, exist_ok=True)
    save_config(config, run.config)


def check_determinism_environment(settings: TrainConfig, device: torch.device, key: str = "train") -> None:
    """Deterministic CUDA training needs cuBLAS's workspace setting before the process starts."""
    if settings.deterministic and device.type == "cuda" and not os.environ.get("CUBLAS_WORKSPACE_CONFIG"):
        raise ConfigError(
            f"{key}.deterministic=true on CUDA needs CUBLAS_WORKSPACE_CONFIG=:4096:8 in the environment "
            f"(cuBLAS reads it at start-up): export it before training, or set {key}.deterministic=false"
        )


def cuda_graph_possible(settings: TrainConfig, device: torch.device, task: Task, distributed: bool) -> bool:
    """Whether the step can be captured; says why not when capture was asked for but cannot be."""
    if not settings.cuda_graph.enabled:
        return False
    reasons = []
    if device.type != "cuda":
        reasons.append(f"training runs on {device.type}")
    if settings.accumulate > 1:
        reasons.append("accumulate > 1")
    if not task.capturable:
        reasons.append(f"{type(task).__name__}'s step is not capturable")
    if distributed:
        reasons.append("training runs in several processes")
    if settings.precision == "fp16":
        reasons.append("fp16's gradient scaler is not capturable")
    if settings.optimizer.name not in ("adam", "adamw"):
        reasons.append(f"optimizer {settings.optimizer.name} has no capturable mode")
    if settings.compile.enabled and settings.compile.mode == "reduce-overhead":
        reasons.append("compile mode reduce-overhead already uses CUDA graphs")
    if reasons:
        log.info("CUDA graph capture off: %s", "; ".join(reasons))
        return False
    return True


@contextlib.contextmanager
def determinism(deterministic: bool, device: torch.device) -> Iterator[None]:
    """Deterministic algorithms and cuDNN flags for the run, restored afterwards."""
    previous = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
        torch.backends.cudnn.deterministic,
        torch.backends.cudnn.benchmark,
    )
    torch.use_deterministic_algorithms(deterministic)
    torch.backends.cudnn.deterministic = deterministic
    torch.backends.cudnn.benchmark = not deterministic and device.type == "cuda"
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(previous[0], warn_only=previous[1])
        torch.backends.cudnn.deterministic, torch.backends.cudnn.benchmark = previous[2], previous[3]


def warn_if_threads_changed(root: Path, started_with: int | None) -> None:
    """A run continued on another torch thread count differs in the last bits from an uninterrupted one."""
    if started_with is not None and started_with != torch.get_num_threads():
        log.warning(
            "%s was trained with %d torch thread(s) and continues with %d: the result will differ in the "
            "last bits from an uninterrupted run (set OMP_NUM_THREADS=%d to continue it exactly)",
            root,
            started_with,
            torch.get_num_threads(),
            started_with,
        )


def seed_everything(seed: int) -> None:
    """Seed python's, numpy's and torch's global generators (all devices)."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)
