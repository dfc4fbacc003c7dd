"""`dynaforge.threads`: pieces on one intra-op thread each, side by side, with the caller's thread modes."""

from __future__ import annotations

import threading

import pytest
import torch

from dynaforge.floating import denormals_flushed, flush_denormals
from dynaforge.threads import in_piece, one_intraop_thread, run_pieces


def test_results_come_back_in_order_from_several_workers() -> None:
    seen: set[str] = set()

    def work(i: int) -> int:
        seen.add(threading.current_thread().name)
        return i * i

    assert run_pieces(work, list(range(20)), workers=2) == [i * i for i in range(20)]
    assert any(name.startswith("dynaforge-piece-") for name in seen)


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_every_piece_runs_on_one_intraop_thread_and_the_callers_count_is_kept(workers: int) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        counts = run_pieces(lambda _: (torch.get_num_threads(), in_piece()), list(range(5)), workers)
        assert counts == [(1, True)] * 5
        assert torch.get_num_threads() == 2
        assert not in_piece()
        # a thread started afterwards begins with the caller's count, not the workers' one
        later: list[int] = []
        thread = threading.Thread(target=lambda: later.append(torch.get_num_threads()))
        thread.start()
        thread.join()
        assert later == [2]
    finally:
        torch.set_num_threads(previous)


def test_workers_take_over_inference_mode_grad_mode_and_the_subnormal_flag() -> None:
    def modes(_: int) -> tuple[bool, bool, bool]:
        return torch.is_inference_mode_enabled(), torch.is_grad_enabled(), denormals_flushed()

    with torch.inference_mode(), flush_denormals():
        inside = run_pieces(modes, [0, 1, 2], workers=2)
    assert inside == [(True, False, True)] * 3
    with torch.no_grad():
        assert run_pieces(modes, [0, 1], workers=2) == [(False, False, denormals_flushed())] * 2
    # writing into a caller's inference tensor from a worker is allowed (the worker is in inference mode)
    with torch.inference_mode():
        buffer = torch.zeros(4)

        def fill(i: int) -> None:
            buffer[i] = i  # in place on purpose: what a rollout's trajectory buffer does

        run_pieces(fill, [0, 1, 2, 3], workers=2)
    assert buffer.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_the_first_error_of_a_piece_reaches_the_caller() -> None:
    def work(i: int) -> int:
        if i == 3:
            raise ValueError("piece 3 failed")
        return i

    with pytest.raises(ValueError, match="piece 3 failed"):
        run_pieces(work, list(range(8)), workers=2)
    assert torch.get_num_threads() >= 1 and not in_piece()


def test_a_nested_call_runs_inline() -> None:
    def outer(i: int) -> list[int]:
        return run_pieces(lambda j: j + i, [10, 20], workers=2)

    assert run_pieces(outer, [1, 2], workers=2) == [[11, 21], [12, 22]]


def test_one_intraop_thread_restores_the_count() -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        with one_intraop_thread():
            assert torch.get_num_threads() == 1
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(previous)
