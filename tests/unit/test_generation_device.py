"""Which device generation and training run on: under torchrun, rank r's `cuda`/`auto` is cuda:LOCAL_RANK; a
GPU is named by its index (no GPU needed)."""

from __future__ import annotations

import pytest
import torch

from dynaforge.generate.stage import generation_device
from dynaforge.machine import indexed_device, local_rank_device


@pytest.fixture
def cuda_available(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)


@pytest.mark.parametrize("name", ["cuda", "auto"])
def test_torchrun_rank_generates_on_its_own_gpu(
    name: str, cuda_available: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert local_rank_device(name) == "cuda:3"
    assert generation_device(name) == torch.device("cuda", 3)


def test_explicit_devices_are_kept_under_torchrun(
    cuda_available: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert generation_device("cuda:1") == torch.device("cuda", 1)
    assert generation_device("cpu") == torch.device("cpu")


def test_without_a_launcher_cuda_is_the_current_gpu(
    cuda_available: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert generation_device("cuda") == torch.device("cuda")
    assert generation_device("auto") == torch.device("cuda")


def test_auto_without_cuda_is_the_cpu_on_every_rank(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert generation_device("auto") == torch.device("cpu")


def test_training_names_its_gpu_by_index(monkeypatch: pytest.MonkeyPatch) -> None:
    # Found on an H100: torch.cuda.set_device(torch.device("cuda")) raises, so `train.device=cuda` failed
    # before the first step. The engine names the current GPU by its index.
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 2)
    assert indexed_device(torch.device("cuda")) == torch.device("cuda", 2)
    assert indexed_device(torch.device("cuda", 1)) == torch.device("cuda", 1)
    assert indexed_device(torch.device("cpu")) == torch.device("cpu")
