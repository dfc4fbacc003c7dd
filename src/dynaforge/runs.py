"""The run folder layout, shared by training, evaluation and the `run` pipeline.

RUN/config.yaml            the resolved config the run was trained with
RUN/metrics.jsonl          one JSON line per log interval and per epoch
RUN/checkpoints/last.pt    after every epoch
RUN/checkpoints/best.pt    the epoch with the lowest validation loss
RUN/checkpoints/epoch-N.pt kept snapshots, every `train.keep_every` epochs
RUN/eval/metrics.json      after `dynaforge evaluate`, with plots and report.html
RUN/eval-NAME/             the same for `dynaforge evaluate --data NAME` on data other than the run's own
RUN/profile/               after `dynaforge train --profile N`

A run folder holds only these (and W&B's files): training refuses a folder that holds anything else
(`dynaforge.atomic.check_output_folder`).

Checkpoints hold plain data only (tensors, numbers, strings, lists, dicts), so they load with
`torch.load(..., weights_only=True)`, and are written atomically (a killed writer never leaves a partial
file). A training checkpoint holds:
    format_version, dynaforge_version
    kind                             what trained it, when not the surrogate trainer (`model_from_checkpoint`)
    model                            the weights to evaluate: the EMA's when train.ema.evaluate, else the
                                     trained ones
    train_model                      the trained weights, when `model` holds the EMA's
    optimizer, scheduler, scaler     state dicts (scaler: fp16 only, else empty)
    ema                              the EMA's state (module, updates), when train.ema is on
    grad_clip_relative               relative clipping's running mean of gradient norms and how many
                                     steps it holds, when train.grad_clip_relative is set
    rng                              random generator states (python, numpy, torch, cuda), one per rank
    epoch                            epochs completed
    step                             optimiser steps completed
    position                         where training stands: epoch (0-based) and micro-batches done in it
    epoch_loss                       the current epoch's training loss so far: [sum, good steps]
    skipped_steps                    steps skipped for a non-finite loss or gradient, in total
    complete                         True when training has run all its epochs
    val_loss, best_val_loss          the last validation loss and the best so far
    config                           the full run config as a dict
    model_shape                      channels, history, horizon, spatial_dims
    normalization                    the per-channel mean and std the model was trained with
    data                             the dataset folder trained on
    world_size, torch_threads        processes that trained it, and their torch thread count
    elapsed                          seconds trained so far, resumes included
    budget_epochs                    a `train.time_budget` run's epochs (kept on resume)
    budget_epoch_began,              a budget run's elapsed seconds when its first epoch began and what a
    budget_checkpoint_seconds        checkpoint costs (to settle the count when resumed inside that epoch)
    budget_first_counted,            its elapsed seconds at the count after the first epoch, and whether
    budget_recount_due               the second count, a quarter of the way in, is still to come

State dicts never carry the `_orig_mod.` (torch.compile) or `module.` (DDP) prefixes; `load_checkpoint`
also strips them from files written by other tools.
"""

from __future__ import annotations

import pickle
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch

from dynaforge.atomic import atomic_path
from dynaforge.config import ConfigError, config_differences, config_from_dict, config_to_dict
from dynaforge.errors import RESUME, Blank, Option, RunError, command

TRAIN_A_RUN = command("train", Blank("CONFIG"), data=Blank("DIR"), out=Blank("RUN"))
"""What to run to make a run folder (for the errors of the verbs that need one)."""
EVALUATION_ONLY = ("evaluate", "tune")
"""Config sections that change only how a run is evaluated or searched over, not the run itself."""


RUN_ENTRIES = (
    "config.yaml",
    "metrics.jsonl",
    "checkpoints",
    "eval",
    "eval-*",
    "profile",
    "wandb.json",
    "wandb",
)
"""What training and evaluation write at the top of a run folder (see the module docstring; `wandb/` and
`wandb.json` are W&B's, when train.wandb is on)."""


class RunFolder(NamedTuple):
    """The paths of a run folder (see the module docstring); `run_folder(root)` makes one."""

    root: Path
    config: Path
    metrics: Path
    checkpoints: Path
    last: Path
    best: Path
    eval: Path

    def checkpoint(self, which: str) -> Path:
        """`best` or `last`."""
        return {"best": self.best, "last": self.last}[which]


def run_folder(path: str | Path) -> RunFolder:
    root = Path(path)
    checkpoints = root / "checkpoints"
    return RunFolder(
        root,
        root / "config.yaml",
        root / "metrics.jsonl",
        checkpoints,
        checkpoints / "last.pt",
        checkpoints / "best.pt",
        root / "eval",
    )


def holds_run(path: str | Path) -> bool:
    """True when `path` already holds (part of) a training run."""
    run = run_folder(path)
    return run.config.exists() or run.metrics.exists() or run.checkpoints.exists()


def training_differences(
    saved: Mapping[str, Any], wanted: Mapping[str, Any], ignored: tuple[str, ...] = EVALUATION_ONLY
) -> list[str]:
    """The dotted keys where two plain config dicts differ, outside the `ignored` sections (by default the
    evaluation-only ones: the keys where they train differently).

    `saved` is completed with today's defaults first (and its keys of earlier versions read where they
    live now), so a run saved before a config section existed still matches a config that leaves that
    section at its defaults.
    """
    return config_differences(
        {k: v for k, v in with_defaults(saved).items() if k not in ignored},
        {k: v for k, v in wanted.items() if k not in ignored},
    )


def check_same_run(
    saved: Mapping[str, Any],
    wanted: Mapping[str, Any],
    holder: str,
    fix: str,
    ignored: tuple[str, ...] = EVALUATION_ONLY,
) -> None:
    """The one "same run?" check: refuse to continue what `holder` names (a run folder, a stack, a study, a
    W&B artifact) with a config that differs from its `saved` one outside the `ignored` sections. The
    error lists the differing keys and ends with `fix`."""
    differences = training_differences(saved, wanted, ignored)
    if differences:
        raise RunError(
            f"{holder} holds a run of a different config; it cannot be continued with this one.\n"
            "  Differences (existing != requested):\n    " + "\n    ".join(differences[:20]) + f"\n  {fix}"
        )


def with_defaults(saved: Mapping[str, Any]) -> dict[str, Any]:
    """A saved plain config with sections and keys added since it was written filled by their defaults;
    unchanged when it no longer validates (its differences are then reported key by key)."""
    try:
        return config_to_dict(config_from_dict(saved))
    except ConfigError:
        return dict(saved)


# ---- checkpoint files ------------------------------------------------------------------------------

CHECKPOINT_VERSION = 1
WRAPPER_PREFIXES = ("_orig_mod.", "module.")
"""Key prefixes added by torch.compile's OptimizedModule and by DistributedDataParallel."""
MODEL_KEYS = ("model", "train_model")


def save_checkpoint(path: str | Path, state: dict[str, Any]) -> None:
    with atomic_path(path) as tmp:
        torch.save(state, tmp)


class CheckpointError(RunError):
    """A checkpoint file that cannot be used: damaged, unsafe, or not dynaforge's."""


class MissingCheckpoint(CheckpointError, FileNotFoundError):
    """A checkpoint file that is not there."""


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    """A checkpoint's plain data, loaded safely (weights_only: no arbitrary code runs); a file that cannot
    be read is a `CheckpointError` naming it."""
    path = Path(path)
    if not path.exists():
        raise MissingCheckpoint(f"checkpoint {path} does not exist; train first with `{TRAIN_A_RUN}`")
    if path.is_file() and path.stat().st_size > 0 and not starts_as_zip(path):
        # torch.save writes a zip archive: anything else (an ONNX model, a text file) was never a checkpoint
        # here, which "unsafe" or "truncated" would misname.
        raise CheckpointError(
            f"{path} is not a PyTorch checkpoint (torch.save writes a zip archive; this file is not one: "
            f"another file was written over it?); {REWRITE}"
        )
    try:
        state = torch.load(path, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as error:
        if "Weights only load failed" not in str(error):
            raise CheckpointError(f"{path} is damaged ({first_line(error)}); {REWRITE}") from None
        raise CheckpointError(
            f"{path} holds Python objects beyond tensors and plain data: refused for safety, nothing in it "
            "was run; use a checkpoint written by dynaforge"
        ) from None
    except (RuntimeError, EOFError, OSError, ValueError, zipfile.BadZipFile) as error:
        raise CheckpointError(
            f"{path} cannot be read: truncated or corrupt ({first_line(error) or type(error).__name__}); "
            f"{REWRITE}"
        ) from None
    version = state.get("format_version") if isinstance(state, dict) else None
    if version != CHECKPOINT_VERSION:
        raise CheckpointError(
            f"{path} is not a dynaforge checkpoint of version {CHECKPOINT_VERSION} (got {version})"
        )
    for key in MODEL_KEYS:
        if key in state:
            state[key] = strip_wrapper_prefixes(state[key])
    if isinstance(state.get("ema"), Mapping) and "module" in state["ema"]:
        state["ema"]["module"] = strip_wrapper_prefixes(state["ema"]["module"])
    return state


def starts_as_zip(path: Path) -> bool:
    """Whether the file begins as a zip archive does (its first local header), as a checkpoint written by
    torch.save does even when it was cut short."""
    with open(path, "rb") as handle:
        return handle.read(4) == b"PK\x03\x04"


REWRITE = (
    f"use the run's other checkpoint ({Option('checkpoint', 'last')} or `best`), continue training with "
    f"{RESUME}, or train again"
)


def first_line(error: BaseException) -> str:
    """The first line of an exception's message, without torch's advice that follows it."""
    return str(error).strip().split("\n", 1)[0].split(". ", 1)[0]


def strip_wrapper_prefixes(state_dict: Mapping[str, Any]) -> dict[str, Any]:
    """Keys without leading `_orig_mod.` / `module.` prefixes (in any order and number)."""
    cleaned = {}
    for key, value in state_dict.items():
        while key.startswith(WRAPPER_PREFIXES):
            key = key.split(".", 1)[1]
        cleaned[key] = value
    return cleaned
