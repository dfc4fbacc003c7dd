"""Helpers shared by the physics tests (imported by name: pytest puts this folder on sys.path)."""

from __future__ import annotations

import torch

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import SpectralSystem


def system_from_overrides(name: str, **fields: object) -> SpectralSystem:
    """A system built exactly as the CLI would, from `system.<key>=<value>` overrides."""
    overrides = [f"system.name={name}"] + [f"system.{key}={value}" for key, value in fields.items()]
    return build_system(load_config(None, overrides).system)


def parameter_table(system: SpectralSystem, rows: list[dict[str, float]]) -> torch.Tensor:
    """(batch, P) float64 parameters in the system's column order, from one dict per sample."""
    names = system.parameter_names
    for row in rows:
        if set(row) != set(names):
            raise ValueError(f"parameters must name exactly {names}, got {sorted(row)}")
    return torch.tensor([[row[name] for name in names] for row in rows], dtype=torch.float64)


def grid(n: int, length: float) -> torch.Tensor:
    """x_j = j L / n, j = 0 .. n-1 (the solver's grid convention), float64."""
    return torch.arange(n, dtype=torch.float64) * (length / n)


def assert_same_bytes_in_any_batch(
    system: object, params: torch.Tensor, alone: tuple[int, ...]
) -> torch.Tensor:
    """That `system.rollout(params)` gives each sample the same bytes in the whole batch at 2 threads, in the
    batch without its first 3 rows at 1 thread, and alone (rows `alone`); returns the whole batch's fields."""
    previous = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        together = system.rollout(params).fields
        torch.set_num_threads(1)
        shifted = system.rollout(params[3:]).fields
        single = [system.rollout(params[i : i + 1]).fields for i in alone]
    finally:
        torch.set_num_threads(previous)
    assert torch.equal(together[3:], shifted)
    for i, fields in zip(alone, single, strict=True):
        assert torch.equal(together[i : i + 1], fields), f"sample {i}"
    return together
