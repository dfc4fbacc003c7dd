"""The torch thread count of a `dynaforge` command (`choose_threads`), set for the command and restored after.

Why these rules, with the measurements behind them: docs/reproducibility.md, "Thread counts".
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger("dynaforge")


def choose_threads(resumed: Path | None = None) -> tuple[int | None, str]:
    """The torch thread count for this command (None: keep torch's own) and why.

    - OMP_NUM_THREADS is set: the user's choice; torch reads it itself.
    - torch is already loaded (`main` called from a Python program): that program's setting is kept.
    - a run is being resumed and recorded the count it started with: that count, so that training continues
      bit for bit as an uninterrupted run would.
    - otherwise the cores other processes leave free: cores - round(1-minute load average), at least 1.
      torch's OpenMP threads spin while they wait for each other, so a thread whose core another process
      holds stalls every parallel region.
    Generation and evaluation give the same bytes whatever the count (`dynaforge.threads`); training
    depends on it, which its run log and checkpoints record.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None, f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    if "torch" in sys.modules:
        return None, "the calling program's torch setting"
    if resumed is not None:
        started = started_with_threads(resumed)
        if started is not None:
            return started, f"the count {resumed} started with"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = max(1, cores - round(os.getloadavg()[0]))
    if free < cores:
        return free, f"{cores - free} of {cores} cores busy with other processes"
    return cores, f"all {cores} cores"


def started_with_threads(run: Path) -> int | None:
    """The torch thread count recorded at the top of a run's log (None when there is none)."""
    log_path = Path(run) / "metrics.jsonl"
    try:
        with open(log_path) as handle:
            header = json.loads(handle.readline())
    except (OSError, json.JSONDecodeError):
        return None
    threads = header.get("torch_threads") if header.get("kind") == "header" else None
    return int(threads) if isinstance(threads, int) and threads > 0 else None


def resumed_run(args: argparse.Namespace) -> Path | None:
    """The training run this command continues, if any: `train --resume`'s --out, `run`'s ROOT/run."""
    if args.verb == "train" and getattr(args, "resume", False):
        return Path(args.out)
    if args.verb == "run":
        return Path(args.out) / "run"
    return None


@contextlib.contextmanager
def command_threads(args: argparse.Namespace) -> Iterator[None]:
    """`choose_threads` for the command, the previous count restored after it (main() may be called in a
    process that goes on); nothing for `rollout`, which runs without PyTorch."""
    if args.verb == "rollout":
        yield
        return
    threads, reason = choose_threads(resumed_run(args))
    log.debug("torch threads: %s (%s)", threads if threads is not None else "torch's own", reason)
    with torch_threads(threads):
        yield


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` torch threads (None: unchanged), restoring the previous count afterwards."""
    if threads is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)
