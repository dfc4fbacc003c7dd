"""Trials whose process is gone: failed and retried by the next process that joins the study on that host.

Each trial records the process running it as its `process` user attribute: the trial's number, the host
name, the PID and, on Linux, its PID namespace and start (the boot id and the start time in clock ticks from
/proc/PID/stat), so that a PID the system has since given to another process does not count as the trial's.
A process joining the study fails every RUNNING trial of its own host and PID namespace whose process no
longer exists and hands it to the study's retry callback at once; trials of other hosts (or of containers
that share the host name but not the PIDs) are left to their heartbeat.

A retry inherits its failed trial's user attributes, this record included; the record counts only for the
trial whose number it carries, so a retry is judged by its own record once it writes one.
"""

from __future__ import annotations

import logging
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
from optuna.exceptions import UpdateFinishedTrialError
from optuna.trial import FrozenTrial, TrialState

log = logging.getLogger(__name__)

PROCESS_ATTR = "process"
"""The user attribute of a trial that names the process running it."""


def this_process(trial_number: int) -> dict[str, Any]:
    """The record of the running process, for trial `trial_number`."""
    pid = os.getpid()
    return {
        "trial": trial_number,
        "host": socket.gethostname(),
        "namespace": pid_namespace(),
        "pid": pid,
        "started": process_start(pid),
    }


def pid_namespace() -> str | None:
    """The PID namespace of this process (`pid:[INODE]`, Linux), or None where /proc does not tell."""
    try:
        return os.readlink("/proc/self/ns/pid")
    except OSError:
        return None


def process_start(pid: int) -> str | None:
    """`BOOT_ID:START_TICKS` of process `pid` (Linux), or None where /proc does not tell (or it is gone)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        return None
    # Field 22 (starttime) counted after the command name, which is in parentheses and may hold spaces.
    fields = stat[stat.rindex(")") + 2 :].split()
    return f"{boot}:{fields[19]}"


def process_is_gone(record: dict[str, Any]) -> bool:
    """True when `record` names a process of this host that no longer runs (or whose PID was reused)."""
    if record.get("host") != socket.gethostname() or record.get("namespace") != pid_namespace():
        return False  # another machine's (or container's) process: its heartbeat tells
    pid = int(record["pid"])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        pass  # a process of another user holds the PID; its start time below tells whether it is ours
    started = record.get("started")
    return started is not None and process_start(pid) != started


def fail_trials_of_gone_processes(
    study: optuna.Study, retry: Callable[[optuna.Study, FrozenTrial], None]
) -> list[int]:
    """Fail each RUNNING trial whose process (on this host) is gone and pass it to `retry`; their numbers."""
    failed = []
    for trial in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        record = trial.user_attrs.get(PROCESS_ATTR)
        if not isinstance(record, dict) or record.get("trial") != trial.number or not process_is_gone(record):
            continue
        try:
            frozen = study.tell(trial.number, state=TrialState.FAIL)
        except (UpdateFinishedTrialError, ValueError):
            continue  # another process finished or failed it first (and retried it, if it failed it)
        log.warning(
            "trial %d: its process %s on %s is gone; marked failed and retried",
            trial.number,
            record["pid"],
            record["host"],
        )
        retry(study, frozen)
        failed.append(trial.number)
    return failed
