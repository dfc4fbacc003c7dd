"""Scoped flushing of subnormal floats: on inside the block, the previous setting back after it."""

from __future__ import annotations

import pytest
import torch

from dynaforge.floating import denormals_flushed, flush_denormals
from dynaforge.generate import generate
from dynaforge.systems.pde.spectral import SpectralSystem

from ..conftest import CONFIGS


def subnormal_product() -> float:
    """1e-39: below float32's smallest normal number (1.18e-38), so 0 when subnormals are flushed."""
    return float(torch.tensor([1e-30], dtype=torch.float32) * torch.tensor([1e-9], dtype=torch.float32))


@pytest.mark.parametrize("before", [False, True])
def test_flush_denormals_restores_the_previous_setting(before: bool) -> None:
    torch.set_flush_denormal(before)
    try:
        assert denormals_flushed() is before
        with flush_denormals():
            assert denormals_flushed()
            assert subnormal_product() == 0.0
        assert denormals_flushed() is before
        assert (subnormal_product() == 0.0) is before
        with pytest.raises(RuntimeError, match="boom"), flush_denormals():
            raise RuntimeError("boom")
        assert denormals_flushed() is before  # restored on the way out of an error too
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("before", [False, True])
def test_dataset_generation_flushes_subnormals_and_restores_the_setting(
    before: bool, tmp_path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynaforge.config import load_config

    seen = []
    rollout = SpectralSystem.rollout

    def watched(self, *args, **kwargs):
        seen.append(denormals_flushed())
        return rollout(self, *args, **kwargs)

    monkeypatch.setattr(SpectralSystem, "rollout", watched)
    config = load_config(CONFIGS / "tiny.yaml", ["dataset.n_val=0", "dataset.n_test=0"])
    torch.set_flush_denormal(before)
    try:
        generate(config, tmp_path / "d", progress=False)
        assert seen and all(seen)  # every batch generated with subnormals flushed
        assert denormals_flushed() is before
    finally:
        torch.set_flush_denormal(False)
