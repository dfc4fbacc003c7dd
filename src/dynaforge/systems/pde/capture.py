"""A block's ETD steps captured as one CUDA graph and replayed (`spectral.SpectralSystem.rollout` on a GPU)."""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor

from dynaforge.systems.pde.nonlinear import ZERO_PADDED

log = logging.getLogger(__name__)


class CapturedSteps:
    """`steps` ETD steps of a block and the physical field after them, captured as one CUDA graph.

    Stepped eagerly, a block on a GPU waits on Python: an ETDRK2 step is about 15 kernels of a few
    microseconds each (Burgers N = 256, 4,096 samples: 4 MiB spectra), each launched from Python at about
    the same cost. A replay launches all of a chunk's kernels at once. The state lives in a static buffer
    that each replay advances in place (the graph ends by copying the new state into it); the physical
    field is a buffer of the graph's memory pool, valid until the next replay.

    One eager step runs first on a side stream, outside the capture, so that cuFFT plans and the
    zero-padded spectra (`zero_padded`) exist before the capture; those buffers are kept alive with the
    graph, which writes into them. If capture fails, the failure is logged and `capture` returns None: the
    block is stepped eagerly, with the same numbers.
    """

    def __init__(
        self, graph: torch.cuda.CUDAGraph, state: Tensor, physical: Tensor, kept: list[Tensor]
    ) -> None:
        self.graph = graph
        self.state = state
        self.physical = physical
        self.kept = kept

    @classmethod
    def capture(
        cls, step: Callable[[Tensor], Tensor], steps: int, observe: Callable[[Tensor], Tensor], state: Tensor
    ) -> CapturedSteps | None:
        static = state.clone()
        current = torch.cuda.current_stream(state.device)
        side = torch.cuda.Stream(state.device)
        side.wait_stream(current)
        with torch.cuda.stream(side):
            observe(step(static))  # warm-up: plans and padded buffers; the result is dropped
        current.wait_stream(side)
        kept = list(ZERO_PADDED.buffers.values())
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                v = static
                for _ in range(steps):
                    v = step(v)
                static.copy_(v)  # in place on purpose: the next replay starts from this buffer
                physical = observe(static)
        except Exception as error:  # any capture failure: eager steps, logged
            log.warning(
                "CUDA graph capture of the rollout failed (%s: %s); stepping eagerly",
                type(error).__name__,
                error,
            )
            torch.cuda.synchronize(state.device)
            return None
        return cls(graph, static, physical, kept)

    def replay(self) -> Tensor:
        """Advance `state` by the captured steps; the physical field after them (overwritten next replay)."""
        self.graph.replay()
        return self.physical
