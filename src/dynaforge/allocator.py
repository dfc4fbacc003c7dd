"""The process's C allocator, set for tensors that are freed and allocated again every step.

torch's CPU tensors come from the C library's `malloc`. glibc serves blocks above its mmap threshold
(128 KiB at first, raised as such blocks are freed) with fresh `mmap` pages, and gives the top of its heap
back to the system whenever more than twice that lies free, so a training step that frees and allocates
the same activations again and again touches fresh pages each time: every first touch of a 4 KiB page is a
page fault. Measured on the FNO paper's Burgers FNO (batch 10, N = 1024, width 64; one thread, Xeon-bf16):
3,300-4,900 page faults per optimiser step, about 15 % of its time.

`keep_freed_memory` raises the mmap threshold to its largest (32 MiB: larger blocks, such as a rollout's
trajectory buffer, are still mapped and unmapped) and the trim threshold to 256 MiB, so freed blocks are
reused from the heap: 0-350 faults per step of that FNO, and its epochs (`dynaforge train
configs/fno_paper_burgers.yaml train.time_budget=null train.epochs=4`, alternated twice with the call patched
out) 6.07 s -> 4.37 s on average, the same validation loss to the last bit. Set before a dataset is read into
memory, the heap kept the freed reads and the in-memory path's peak resident size rose from 3,461 to 4,483
MiB (`benchmarks/data_scale.py`'s 1 GiB case): the engine therefore sets it once its task has read its data
(peak 3,464 MiB then). Only where the values sit changes, never a value. Elsewhere than glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

M_TRIM_THRESHOLD = -1
"""mallopt(3) parameter: free memory at the top of the heap above this many bytes goes back to the system."""

M_MMAP_THRESHOLD = -3
"""mallopt(3) parameter: blocks of at least this many bytes are served by mmap (setting it also stops
glibc's dynamic adjustment of both thresholds)."""

LARGEST_MMAP_THRESHOLD = 32 * 2**20
"""glibc's upper bound on the mmap threshold on 64-bit systems (HEAP_MAX_SIZE / 2)."""

TRIM_THRESHOLD = 256 * 2**20
"""Free memory at the top of the heap beyond this goes back to the system: far above a training step's churn
of heap blocks (each under the mmap threshold), far below a dataset's worth of freed reads."""


def load_libc() -> ctypes.CDLL | None:
    """The C library (for madvise and mallopt), or None off Linux."""
    name = ctypes.util.find_library("c") if sys.platform == "linux" else None
    if name is None:
        return None
    libc = ctypes.CDLL(name, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


LIBC = load_libc()
"""The C library, or None off Linux."""


def keep_freed_memory() -> bool:
    """Let glibc reuse freed tensor memory instead of returning it and faulting fresh pages in (see the
    module docstring); idempotent. True where it was set (glibc's `mallopt` accepted both values)."""
    mallopt = getattr(LIBC, "mallopt", None)  # glibc only (musl has no mallopt)
    if mallopt is None:
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, LARGEST_MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
