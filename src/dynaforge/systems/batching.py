"""How a system cuts a batch into blocks whose numbers do not depend on the batch or the thread count.

A sample's arithmetic must be the same whether it is stepped alone, in a batch of 5 or in a batch of 256,
on one thread or on all of them (docs/format.md, "A dataset is its config"). Two things would break that:

- Library kernels take other code paths for other shapes. An elementwise kernel runs its vector loop over
  whole multiples of a few vectors and a scalar loop over the rest, and the two round differently for some
  operations (measured here: complex128 products, the vectorised and scalar `exp`). Blocks therefore hold
  a multiple of `rows_for_lanes(...)` samples, padded with copies of their last sample, so that no tensor
  of a block has a remainder: every value goes through the same instructions whatever its position.
- Threads split work at places that depend on their count (see `dynaforge.threads`). Each block runs on one
  intra-op thread; blocks run side by side on worker threads.

The block size is chosen from the sample's size alone, never from the batch or the thread count. A system
whose library calls may round differently for another batch shape (the FFTs of `systems/pde/spectral.py`)
pads every block to its full size, so that no call ever sees a shape that depends on the batch.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import sys
from collections.abc import Callable

import torch
from torch import Tensor

from dynaforge.allocator import LIBC
from dynaforge.threads import run_pieces

LANES = 16
"""Blocks hold a multiple of this many samples: 16 float64 or complex64 values, or 8 complex128 values, are
whole iterations of torch's AVX-512 elementwise loops (2 vectors each), so a block's tensors have no
scalar remainder whatever each sample's size."""


GPU_BLOCK_VALUES = 2**24
"""On a GPU a block is what one kernel launch of each operation works on, so blocks are large: about this
many state values (64 MiB in float32: 65,536 samples of a 256-point grid, 256 of a 256 x 256 grid).
CPU-sized blocks (a few hundred KiB) leave a GPU waiting on kernel launches: measured on an H100
(benchmarks/generate_pde.py --device cuda, 4,096 samples of Burgers N = 256), blocks of 128 samples ran at
0.70 M sample-steps/s, the whole batch as one block at 16.0 M. Still chosen from the sample's size alone
(and the device kind), never from the batch; on that H100 a sample's trajectory was bitwise the same in a
batch of 300 and alone (scripts/device_checks.sh, part `same`)."""


def block_values_for(device: torch.device, cpu_values: int) -> int:
    """State values per block on `device`: `cpu_values` on the CPU (cache-sized), `GPU_BLOCK_VALUES` on an
    accelerator."""
    return cpu_values if device.type == "cpu" else GPU_BLOCK_VALUES


def block_samples(values_per_sample: int, block_values: int, multiple: int = LANES) -> int:
    """Samples per block: about `block_values` state values, a multiple of `multiple` (at least one)."""
    return multiple * max(1, block_values // (multiple * max(1, values_per_sample)))


def power_of_two_block(values_per_sample: int, block_values: int, multiple: int = LANES) -> int:
    """Samples per block: `multiple` (a power of two) times the largest power of two that keeps the block
    within `block_values` state values (at least `multiple`). Batches are mostly powers of two, and a
    block padded to its full size wastes nothing on them."""
    groups = max(1, block_values // (multiple * max(1, values_per_sample)))
    return multiple * 2 ** (groups.bit_length() - 1)


def sample_blocks(batch: int, block: int) -> list[slice]:
    """Consecutive row ranges of at most `block` samples covering `batch` samples."""
    return [slice(start, min(start + block, batch)) for start in range(0, batch, block)]


def run_blocks(run_block: Callable[[slice], None], batch: int, block: int, device: torch.device) -> None:
    """`run_block(rows)` for the blocks of at most `block` samples covering `batch` samples: side by side on
    worker threads on the CPU, one after the other on an accelerator (one device stream, so the thread
    count does not touch the arithmetic). Blocks must write disjoint rows."""
    blocks = sample_blocks(batch, block)
    if device.type == "cpu":
        run_pieces(run_block, blocks)
    else:
        for rows in blocks:
            run_block(rows)


def rows_for_lanes(values_per_row: int) -> int:
    """The fewest rows whose values fill whole lane groups: LANES / gcd(LANES, values per row) (16 for an
    odd row size, 1 for a 128 x 65 spectrum)."""
    return LANES // math.gcd(LANES, values_per_row)


def pad_rows(x: Tensor, multiple: int = LANES) -> Tensor:
    """`x` with copies of its last row appended until its row count is a multiple of `multiple`."""
    missing = -x.shape[0] % multiple
    if missing == 0:
        return x
    return torch.cat([x, x[-1:].expand(missing, *x.shape[1:])])


HUGE_PAGE = 2**21
"""Linux's transparent huge page on x86-64 (2 MiB)."""

MADV_HUGEPAGE = 14
"""madvise(2) advice: back this range with transparent huge pages where possible."""


def trajectory_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> Tensor:
    """An uninitialised tensor for a rollout's trajectories, on Linux CPUs asked to be backed by transparent
    huge pages (`madvise(MADV_HUGEPAGE)`, where the kernel's THP mode is `madvise` or `always`).

    A rollout writes its frames into a fresh buffer of tens of MiB, scattered across samples; with 4 KiB
    pages the first touch of every page is a page fault, and those faults were 20% of a Burgers N = 256
    rollout (256 samples x 201 frames, one thread, Xeon-bf16: 0.106 s -> 0.085 s with huge pages, measured
    with torch's own `THP_MEM_ALLOC_ENABLE=1`). Only where the memory sits changes, never a value."""
    buffer = torch.empty(shape, dtype=dtype, device=device)
    if device.type == "cpu" and sys.platform == "linux" and buffer.nbytes >= 2 * HUGE_PAGE:
        advise_huge_pages(buffer.data_ptr(), buffer.nbytes)
    return buffer


def advise_huge_pages(address: int, size: int) -> None:
    """madvise(MADV_HUGEPAGE) on the whole pages inside [address, address + size); a refusal is ignored
    (the buffer then keeps ordinary pages)."""
    page = mmap.PAGESIZE
    start = -(-address // page) * page
    end = (address + size) // page * page
    if end > start and LIBC is not None:
        LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), ctypes.c_int(MADV_HUGEPAGE))
