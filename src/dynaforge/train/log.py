"""Run logging: metrics.jsonl (one JSON object per line), window meters that read the device once per window.

Lines carry a `kind`: `header` (code version and environment, first line), `train` (one per logging
window: loss, lr, grad norm, throughput), `epoch` (train and validation loss, epoch time, best so far).
"""

from __future__ import annotations

import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

import dynaforge


class MetricsLog:
    """Appends JSON lines to a file, flushed line by line (a killed run keeps every line written)."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)

    def start(self, header: dict[str, Any]) -> None:
        """Begin a fresh log with its header line."""
        self.path.write_text("")
        self.write({"kind": "header", **header})

    def write(self, record: dict[str, Any]) -> None:
        with open(self.path, "a", encoding="utf-8") as handle:
            handle.write(json.dumps(record) + "\n")
            handle.flush()


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """Every record of a metrics.jsonl file."""
    return [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]


class WindowMeter:
    """Sums of loss and grad norm over a logging window, kept on the device (no host sync per step)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.reset()

    def reset(self) -> None:
        self.loss_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.grad_norm_sum = torch.zeros((), dtype=torch.float64, device=self.device)
        self.steps = 0
        self.samples = 0
        self.started = time.perf_counter()

    def add(self, loss: Tensor, grad_norm: Tensor, samples: int) -> None:
        self.loss_sum = self.loss_sum + loss.detach().to(torch.float64)
        self.grad_norm_sum = self.grad_norm_sum + grad_norm.detach().to(torch.float64)
        self.steps += 1
        self.samples += samples

    def summary(self) -> dict[str, float]:
        """Window means and throughput; the one host sync of the window."""
        seconds = max(time.perf_counter() - self.started, 1e-9)
        values = torch.stack([self.loss_sum, self.grad_norm_sum]).cpu().tolist()
        return {
            "loss": values[0] / max(self.steps, 1),
            "grad_norm": values[1] / max(self.steps, 1),
            "samples_per_s": self.samples / seconds,
            "steps": self.steps,
        }


def environment() -> dict[str, Any]:
    """Code version and environment, for the top of every run log."""
    return {
        "dynaforge_version": dynaforge.__version__,
        "torch": torch.__version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.cuda.is_available(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
