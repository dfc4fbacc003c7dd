"""Floating-point environment helpers: flushing subnormal numbers to zero, scoped.

Subnormal (denormal) floats are handled in microcode on x86 and cost about a hundred times a normal
operation; a decaying field (Gray-Scott, the noise-free tail of an operator) can fill a tensor with them and
slow a rollout down ~100x. Flushing them to zero changes values below ~1.2e-38 (float32) only.
`torch.set_flush_denormal` sets the flag of the calling thread only (x86 MXCSR; threads it starts later
inherit it, an OpenMP pool already running keeps its own: with several intra-op threads, the share of the
work done on the pool's other threads is not flushed) and has no getter, so `denormals_flushed` probes the
calling thread with one multiplication.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

SUBNORMAL_PROBE = 1e-30
"""1e-30 * 1e-9 = 1e-39 lies below float32's smallest normal (1.18e-38): flushed to 0 when the flag is on."""


def denormals_flushed() -> bool:
    """Whether float32 operations on this thread currently flush subnormal results to zero."""
    probe = torch.tensor([SUBNORMAL_PROBE], dtype=torch.float32) * torch.tensor([1e-9], dtype=torch.float32)
    return bool(probe[0] == 0)


@contextlib.contextmanager
def flush_denormals() -> Iterator[None]:
    """Flush subnormals to zero inside the block, then restore the previous setting (no global change)."""
    previous = denormals_flushed()
    supported = torch.set_flush_denormal(True)
    try:
        yield
    finally:
        if supported:
            torch.set_flush_denormal(previous)
