"""DataLoaders over window datasets, with worker, pinning and start-method settings for the device."""

from __future__ import annotations

import multiprocessing
from collections.abc import Sequence

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from dynaforge.config import DataConfig


def safe_start_method(requested: str) -> str:
    """The requested start method if this platform has it, else `spawn` (available everywhere)."""
    return requested if requested in multiprocessing.get_all_start_methods() else "spawn"


def make_loader(
    dataset: Dataset,
    config: DataConfig,
    device: torch.device,
    shuffle: bool,
    seed: int = 0,
    drop_last: bool = False,
    sampler: Sampler[int] | Sequence[int] | None = None,
) -> DataLoader:
    """A DataLoader for `dataset`: shuffled with its own seeded generator (the global RNG is untouched),
    or in the order of `sampler`, a sampler or a sequence of indices (then `shuffle` must be False).

    Pinned memory only helps copies to a GPU, so `pin_memory: null` pins exactly when training on CUDA.
    Workers start with `config.start_method` (forkserver by default; fork is unsafe with threads and CUDA)
    and stay alive between epochs.
    """
    workers = config.num_workers
    pin = config.pin_memory if config.pin_memory is not None else device.type == "cuda"
    generator = torch.Generator()
    generator.manual_seed(seed)
    return DataLoader(
        dataset,
        batch_size=config.batch_size,
        shuffle=shuffle,
        sampler=sampler,
        drop_last=drop_last,
        num_workers=workers,
        pin_memory=pin,
        generator=generator,
        persistent_workers=workers > 0,
        multiprocessing_context=safe_start_method(config.start_method) if workers > 0 else None,
    )
