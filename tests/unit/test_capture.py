"""The control flow of CUDA-graph capture (`StepGraph`), on the CPU with stand-ins for the CUDA stream and
graph API: warmup steps, one capture, replays on the static buffers, the eager fallback. (The real
capture is covered by tests/integration/test_cuda_paths.py on machines with a GPU.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from dynaforge.train.capture import StepGraph


class FakeCuda:
    """Streams that do nothing; a graph whose replay reruns what was captured on the static buffers."""

    def __init__(self, fail_capture: bool = False) -> None:
        self.fail_capture = fail_capture
        self.capturing = False
        self.captures = 0
        self.owner: StepGraph | None = None

    class Stream:
        def wait_stream(self, other: Any) -> None:
            pass

    def graph_class(self) -> type:
        fake = self

        class Graph:
            def replay(self) -> None:
                assert fake.owner is not None
                fake.owner.step(fake.owner.inputs, fake.owner.targets)

        return Graph

    @contextlib.contextmanager
    def graph(self, graph: Any, capture_error_mode: str = "global") -> Iterator[None]:
        assert capture_error_mode == "thread_local"
        self.captures += 1
        self.capturing = True
        try:
            if self.fail_capture:
                raise RuntimeError("operation not permitted when stream is capturing")
            yield
        finally:
            self.capturing = False


@pytest.fixture
def fake_cuda(monkeypatch: pytest.MonkeyPatch) -> FakeCuda:
    fake = FakeCuda()
    monkeypatch.setattr(torch.cuda, "Stream", FakeCuda.Stream)
    monkeypatch.setattr(torch.cuda, "current_stream", lambda: FakeCuda.Stream())
    monkeypatch.setattr(torch.cuda, "stream", lambda s: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "CUDAGraph", fake.graph_class())
    monkeypatch.setattr(torch.cuda, "graph", fake.graph)
    monkeypatch.setattr(torch.cuda, "synchronize", lambda: None)
    return fake


def recording_step(fake: FakeCuda, log: list[tuple[str, float]]) -> Any:
    def step(inputs: torch.Tensor, targets: torch.Tensor) -> None:
        log.append(("capture" if fake.capturing else "run", float(inputs.sum() + targets.sum())))

    return step


def batch(value: float) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.full((2, 3), value, dtype=torch.float32), torch.zeros(2, 1, dtype=torch.float32)


def test_warmup_then_one_capture_then_replays_on_static_buffers(fake_cuda: FakeCuda) -> None:
    log: list[tuple[str, float]] = []
    freed: list[int] = []
    graph = StepGraph(recording_step(fake_cuda, log), warmup=2, free_gradients=lambda: freed.append(1))
    fake_cuda.owner = graph
    static = None
    for value in (1.0, 2.0, 3.0, 4.0, 5.0):
        graph.run(*batch(value))
        static = static if static is not None else graph.inputs
    # two eager warmup steps, the capture (recorded, not run), its replay for batch 3, replays for 4 and 5
    assert log == [
        ("run", 6.0),
        ("run", 12.0),
        ("capture", 18.0),
        ("run", 18.0),
        ("run", 24.0),
        ("run", 30.0),
    ]
    assert fake_cuda.captures == 1 and graph.graph is not None and not graph.failed
    assert graph.inputs is static  # the same buffers throughout: the captured kernels read them
    assert len(freed) == 3  # before each warmup step and before the capture, never between replays


def test_a_failed_capture_falls_back_to_eager_and_says_so(
    fake_cuda: FakeCuda, caplog: pytest.LogCaptureFixture
) -> None:
    fake_cuda.fail_capture = True
    log: list[tuple[str, float]] = []
    graph = StepGraph(recording_step(fake_cuda, log), warmup=1, free_gradients=lambda: None)
    fake_cuda.owner = graph
    for value in (1.0, 2.0, 3.0):
        graph.run(*batch(value))
    assert graph.failed and graph.graph is None and fake_cuda.captures == 1
    assert [entry for entry in log if entry[0] == "run"] == [("run", 6.0), ("run", 12.0), ("run", 18.0)]
    assert "CUDA graph capture failed (RuntimeError: operation not permitted" in caplog.text


def test_a_batch_of_another_shape_is_refused(fake_cuda: FakeCuda) -> None:
    graph = StepGraph(lambda x, y: None, warmup=1, free_gradients=lambda: None)
    graph.run(*batch(1.0))
    with pytest.raises(ValueError, match="drop the last partial batch"):
        graph.run(torch.zeros(1, 3, dtype=torch.float32), torch.zeros(1, 1, dtype=torch.float32))
