"""Work whose numbers do not depend on the thread count: independent pieces, one intra-op thread each.

A library's multithreaded CPU kernels may round differently when the thread count changes: MKL splits a
batch of FFTs among its threads with code paths that differ between CPU families, a reduction split among
threads adds its partial sums in another order, an elementwise kernel split among threads runs the scalar
remainder loop at each thread's boundary, and the flush-to-zero flag of `torch.set_flush_denormal` covers
the calling thread only. Work that must give the same bytes whatever the thread count is therefore cut into
pieces whose composition the caller fixes (never the thread count), and each piece runs on one intra-op
thread: `run_pieces` runs them side by side on `workers` threads of its own, each holding one intra-op
thread, so the thread count sets the speed and nothing else.

A worker thread takes over the caller's grad mode, inference mode and flush-to-zero flag. Threads are
started per call and joined before it returns; nothing persists between calls.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from collections.abc import Callable, Iterator, Sequence
from typing import NamedTuple, TypeVar

import torch

from dynaforge.floating import denormals_flushed

Piece = TypeVar("Piece")
Result = TypeVar("Result")

_local = threading.local()
"""`in_piece`: the current thread runs a piece (a nested `run_pieces` then runs inline)."""


class ThreadModes(NamedTuple):
    """The per-thread settings a worker takes over from the thread that hands it work."""

    grad_enabled: bool
    inference_mode: bool
    flush_denormals: bool

    @classmethod
    def of_current_thread(cls) -> ThreadModes:
        return cls(torch.is_grad_enabled(), torch.is_inference_mode_enabled(), denormals_flushed())

    @contextlib.contextmanager
    def applied(self) -> Iterator[None]:
        """These modes on the calling thread for the block (a fresh worker: its flag is not restored)."""
        if self.flush_denormals:
            torch.set_flush_denormal(True)
        with torch.inference_mode(self.inference_mode), torch.set_grad_enabled(self.grad_enabled):
            yield


@contextlib.contextmanager
def one_intraop_thread() -> Iterator[None]:
    """Run the block on one intra-op thread (OpenMP and MKL of the calling thread), then restore the count.

    `torch.set_num_threads` also sets the count that threads started later begin with; it is restored too.
    """
    previous = torch.get_num_threads()
    if previous == 1:
        yield
        return
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def in_piece() -> bool:
    """True on a thread that is running a piece of `run_pieces`."""
    return getattr(_local, "in_piece", False)


def run_pieces(
    work: Callable[[Piece], Result], pieces: Sequence[Piece], workers: int | None = None
) -> list[Result]:
    """`[work(p) for p in pieces]`, each call on one intra-op thread, `workers` calls at a time.

    `workers` defaults to the caller's torch thread count (what the user allowed this process). With one
    worker, one piece, or when called from inside a piece, the pieces run in order on the calling thread
    (still on one intra-op thread). The first exception raised by a piece is re-raised here after the
    workers stop taking new pieces.
    """
    workers = torch.get_num_threads() if workers is None else workers
    if in_piece():
        return [work(piece) for piece in pieces]
    if workers <= 1 or len(pieces) <= 1:
        with one_intraop_thread(), _marked():
            return [work(piece) for piece in pieces]
    return _run_threaded(work, pieces, min(workers, len(pieces)))


@contextlib.contextmanager
def _marked() -> Iterator[None]:
    _local.in_piece = True
    try:
        yield
    finally:
        _local.in_piece = False


def _run_threaded(work: Callable[[Piece], Result], pieces: Sequence[Piece], workers: int) -> list[Result]:
    modes = ThreadModes.of_current_thread()
    caller_threads = torch.get_num_threads()
    results: list[Result | None] = [None] * len(pieces)
    errors: list[BaseException] = []
    order = itertools.count()  # next() on a count is atomic under the GIL: each index is taken once

    def worker() -> None:
        # Settle this thread's lazy thread-count initialisation before setting it: otherwise torch's first
        # parallel op here would reset the count to the process default.
        torch.get_num_threads()
        torch.set_num_threads(1)
        _local.in_piece = True
        with modes.applied():
            for index in iter(order.__next__, None):
                if index >= len(pieces) or errors:
                    return
                try:
                    results[index] = work(pieces[index])
                except BaseException as error:  # re-raised by the caller
                    errors.append(error)
                    return

    threads = [
        threading.Thread(target=worker, name=f"dynaforge-piece-{i}", daemon=True) for i in range(workers)
    ]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    except BaseException as error:  # Ctrl-C while waiting: the workers finish their piece and stop
        errors.append(error)
        raise
    finally:
        # The workers' set_num_threads(1) also set the count that threads started later begin with.
        torch.set_num_threads(caller_threads)
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]  # every slot is filled when no piece failed


def serialised(callback: Callable[[int], None] | None) -> Callable[[int], None] | None:
    """`callback` behind a lock, for calls from several worker threads (None stays None)."""
    if callback is None:
        return None
    lock = threading.Lock()

    def call(value: int) -> None:
        with lock:
            callback(value)

    return call


def on_one_thread(work: Callable[[], Result]) -> Result:
    """`work()` on one intra-op thread of the calling thread (a piece of its own): numbers that do not
    depend on the thread count, for work that is not cut into pieces."""
    (result,) = run_pieces(lambda _: work(), [None], workers=1)
    return result
