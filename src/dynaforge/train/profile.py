"""`dynaforge train ... --profile N`: the first N optimiser steps (after one warmup step) run under
torch.profiler; RUN/profile/trace.json (Chrome trace: chrome://tracing or https://ui.perfetto.dev) and
RUN/profile/operators.txt (the top operators by self time) are written, and training goes on.
"""

from __future__ import annotations

import logging
from pathlib import Path

import torch
from torch.profiler import ProfilerActivity, profile, schedule

from dynaforge.atomic import atomic_path, atomic_write_text

log = logging.getLogger(__name__)

TOP_OPERATORS = 30


class StepProfiler:
    """Profiles optimiser steps 2..N+1 of a run; `step()` after every optimiser step, `stop()` at the end."""

    def __init__(self, steps: int, folder: Path, device: torch.device) -> None:
        self.folder = folder
        self.device = device
        self.steps = steps
        self.written = False
        activities = [ProfilerActivity.CPU]
        if device.type == "cuda":
            activities.append(ProfilerActivity.CUDA)
        self.profiler = profile(
            activities=activities,
            schedule=schedule(wait=0, warmup=1, active=steps, repeat=1),
            on_trace_ready=self.write,
            record_shapes=True,
            # One cycle (repeat=1), so nothing to accumulate; False makes torch warn at start on CUDA (seen
            # on an H100), which a warnings-as-errors test run turns into a failure.
            acc_events=True,
        )
        self.profiler.start()
        self.running = True

    def step(self) -> None:
        if self.running:
            self.profiler.step()
            if self.written:
                self.stop()

    def stop(self) -> None:
        if self.running:
            self.running = False
            self.profiler.stop()

    def write(self, profiler: profile) -> None:
        self.folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(self.folder / "trace.json") as tmp:
            profiler.export_chrome_trace(str(tmp))
        sort_by = "self_device_time_total" if self.device.type == "cuda" else "self_cpu_time_total"
        table = profiler.key_averages().table(sort_by=sort_by, row_limit=TOP_OPERATORS)
        atomic_write_text(
            self.folder / "operators.txt",
            f"Top {TOP_OPERATORS} operators over {self.steps} optimiser steps, by self time\n{table}\n",
        )
        self.written = True
        log.info("profile of %d steps written to %s (trace.json, operators.txt)", self.steps, self.folder)
