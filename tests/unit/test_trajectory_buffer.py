"""`trajectory_buffer`: rollout buffers asked to sit on transparent huge pages, and nothing else changed."""

from __future__ import annotations

import mmap

import pytest
import torch

from dynaforge.systems import batching


class MadviseRecorder:
    def __init__(self) -> None:
        self.calls: list[tuple[int, int, int]] = []

    def madvise(self, start: object, length: object, advice: object) -> int:
        self.calls.append((start.value, length.value, advice.value))  # type: ignore[attr-defined]
        return 0


def test_a_large_cpu_buffer_is_advised_over_whole_pages_inside_it(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = MadviseRecorder()
    monkeypatch.setattr(batching, "LIBC", recorder)
    monkeypatch.setattr(batching.sys, "platform", "linux")
    buffer = batching.trajectory_buffer((128, 51, 1, 256), torch.float32, torch.device("cpu"))
    assert buffer.shape == (128, 51, 1, 256) and buffer.dtype == torch.float32
    ((start, length, advice),) = recorder.calls
    page = mmap.PAGESIZE
    assert advice == batching.MADV_HUGEPAGE
    assert start % page == 0 and length % page == 0 and length > 0
    assert buffer.data_ptr() <= start and start + length <= buffer.data_ptr() + buffer.nbytes
    assert buffer.data_ptr() + buffer.nbytes - (start + length) < page  # no whole page left out at the end


def test_a_small_buffer_is_left_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    recorder = MadviseRecorder()
    monkeypatch.setattr(batching, "LIBC", recorder)
    batching.trajectory_buffer((4, 11, 1, 64), torch.float32, torch.device("cpu"))
    assert recorder.calls == []
