"""CUDA-only paths of the two-phase trainer: the whole window captured in a CUDA graph after warmup, against
the eager window. Skipped (cleanly) on machines without a GPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from dynaforge.config import load_config
from dynaforge.runs import load_checkpoint
from dynaforge.train.log import read_metrics
from dynaforge.train.two_phase import two_phase_engine

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TINY = Path(__file__).resolve().parents[2] / "configs" / "two_phase_tiny.yaml"
ON_GPU = ["train.device=cuda", "train.optimizer.name=adam", "train.log_every=1"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_captured_window_trains_like_the_eager_window(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    graph_config = load_config(TINY, [*ON_GPU, "train.cuda_graph.enabled=true", "train.cuda_graph.warmup=2"])
    with caplog.at_level(logging.INFO):
        trainer = two_phase_engine(graph_config, tmp_path / "graph")
        trainer.fit()
    assert "training step captured in a CUDA graph after 2 warmup steps" in caplog.text
    assert trainer.graph is not None and trainer.graph.graph is not None and not trainer.graph.failed
    two_phase_engine(load_config(TINY, ON_GPU), tmp_path / "eager").fit()
    for name, value in weights(tmp_path / "eager").items():
        torch.testing.assert_close(weights(tmp_path / "graph")[name], value, rtol=1e-4, atol=1e-5)
    graph_windows = [r for r in read_metrics(tmp_path / "graph" / "metrics.jsonl") if r["kind"] == "train"]
    eager_windows = [r for r in read_metrics(tmp_path / "eager" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["loss"] for r in graph_windows] == pytest.approx([r["loss"] for r in eager_windows], rel=1e-4)


def test_capture_is_refused_with_a_reason_for_an_optimizer_without_a_capturable_mode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    config = load_config(TINY, [*ON_GPU, "train.cuda_graph.enabled=true", "train.optimizer.name=sgd"])
    with caplog.at_level(logging.INFO):
        trainer = two_phase_engine(config, tmp_path / "run")
    assert trainer.graph is None
    assert "optimizer sgd has no capturable mode" in caplog.text
