"""`keep_freed_memory`: training steps reuse freed tensor memory instead of faulting fresh pages in.

Each side runs in a process of its own (the setting is process-wide and cannot be undone): a few steps of
the FNO paper's Burgers FNO (batch 10, N = 1024, width 64), counting minor page faults per step. Measured
here: 3,300-4,900 per step with glibc's defaults, 0-350 with the setting (`allocator.py`).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from dynaforge.allocator import LIBC

STEPS = """
import resource, sys, torch
from dynaforge.allocator import keep_freed_memory
from dynaforge.config import FNOConfig
from dynaforge.models.base import ModelInput, ModelShape
from dynaforge.models.registry import build_model

if sys.argv[1] == "keep":
    assert keep_freed_memory()
torch.manual_seed(0)
torch.set_num_threads(1)
model = build_model(FNOConfig(width=64, modes=16, layers=4, projection=128), ModelShape(1, 1, 1, 1))
optimizer = torch.optim.AdamW(model.parameters())
x, y = torch.randn(10, 1, 1, 1024), torch.randn(10, 1, 1, 1024)

def step():
    loss = (model(ModelInput(x)).frames - y).square().mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(6):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 6)
"""


def faults_per_step(mode: str) -> float:
    done = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True, timeout=300
    )
    return float(done.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(getattr(LIBC, "mallopt", None) is None, reason="glibc's mallopt only")
def test_kept_memory_takes_the_page_faults_out_of_a_training_step() -> None:
    default, kept = faults_per_step("default"), faults_per_step("keep")
    assert kept < default / 4, (default, kept)
