"""CUDA-only paths of the trainer: CUDA-graph capture of the step, fp16 with a gradient scaler, pinned
non-blocking copies, memory clean-up. Skipped (cleanly) on machines without a GPU."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from dynaforge.config import load_config
from dynaforge.runs import load_checkpoint
from dynaforge.train import train, window_engine
from dynaforge.train.capture import release_memory_if_short
from dynaforge.train.log import read_metrics

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
ON_GPU = ["train.device=cuda", "train.epochs=3"]


def weights(run: Path) -> dict[str, torch.Tensor]:
    return load_checkpoint(run / "checkpoints" / "last.pt")["model"]


def test_captured_step_trains_like_the_eager_step(
    tiny_data: Path, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # 72 windows in batches of 8: no partial batch, which a captured graph (one batch shape) would drop.
    common = [*ON_GPU, "data.batch_size=8", "train.ema.decay=0.9", "train.log_every=1"]
    graph_config = load_config(TINY, [*common, "train.cuda_graph.enabled=true", "train.cuda_graph.warmup=2"])
    with caplog.at_level(logging.INFO):
        trainer = window_engine(graph_config, tiny_data, tmp_path / "graph", progress=False)
        trainer.fit()
    assert "training step captured in a CUDA graph after 2 warmup steps" in caplog.text
    assert trainer.graph is not None and trainer.graph.graph is not None and not trainer.graph.failed
    train(load_config(TINY, common), tiny_data, tmp_path / "eager", progress=False)
    for name, value in weights(tmp_path / "eager").items():
        torch.testing.assert_close(weights(tmp_path / "graph")[name], value, rtol=1e-4, atol=1e-5)
    graph_windows = [r for r in read_metrics(tmp_path / "graph" / "metrics.jsonl") if r["kind"] == "train"]
    eager_windows = [r for r in read_metrics(tmp_path / "eager" / "metrics.jsonl") if r["kind"] == "train"]
    assert [r["loss"] for r in graph_windows] == pytest.approx([r["loss"] for r in eager_windows], rel=1e-4)


def test_fp16_trains_with_a_gradient_scaler(tiny_data: Path, tmp_path: Path) -> None:
    summary = train(
        load_config(TINY, [*ON_GPU, "train.precision=fp16"]), tiny_data, tmp_path / "run", progress=False
    )
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")
    assert state["scaler"]["scale"] > 0 and summary.skipped_steps < summary.steps
    epochs = [r["val_loss"] for r in read_metrics(tmp_path / "run" / "metrics.jsonl") if r["kind"] == "epoch"]
    assert epochs[-1] < epochs[0]


def test_batches_are_pinned_and_copied_without_blocking(tiny_data: Path, tmp_path: Path) -> None:
    task = window_engine(load_config(TINY, ON_GPU), tiny_data, tmp_path / "run", progress=False).task
    assert task.train_loader.pin_memory
    batch = next(iter(task.train_loader))
    assert batch.inputs.is_pinned()
    inputs, *_ = task.to_device(batch)
    assert inputs.device.type == "cuda"


def test_memory_is_released_only_when_short() -> None:
    assert not release_memory_if_short(torch.device("cuda"), free_fraction=0.0)
    assert not release_memory_if_short(torch.device("cpu"))


def test_bf16_autocast_on_cuda_keeps_ffts_in_fp32(tiny_data: Path, tmp_path: Path) -> None:
    summary = train(
        load_config(TINY, [*ON_GPU, "train.precision=bf16"]), tiny_data, tmp_path / "run", progress=False
    )
    assert summary.skipped_steps == 0 and summary.last_val_loss < 1.0


def test_profile_on_cuda_records_device_time(tiny_data: Path, tmp_path: Path) -> None:
    from dynaforge.cli import main

    run = tmp_path / "run"
    args = ["-q", "train", str(TINY), *ON_GPU, "--data", str(tiny_data), "--out", str(run), "--profile", "2"]
    assert main([*args, "--no-progress"]) == 0
    table = (run / "profile" / "operators.txt").read_text()
    assert "CUDA" in table and "aten::" in table


def test_resume_on_cuda_restores_every_generator(tiny_data: Path, tmp_path: Path) -> None:
    config = load_config(TINY, [*ON_GPU, "train.checkpoint_every=2"])
    train(config, tiny_data, tmp_path / "run", progress=False)
    state = load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt", map_location="cuda")
    assert "cuda" in state["rng"][0]
    trainer = window_engine(config, tiny_data, tmp_path / "run", progress=False, resume=True)
    trainer.fit()  # a finished run: restores and returns
    assert trainer.step == state["step"]
