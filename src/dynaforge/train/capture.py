"""Compilation and capture: torch.compile with an eager fallback, CUDA-graph capture of the whole training
step, and CUDA memory clean-up when the allocator is really short.

CUDA graphs (`StepGraph`): the step (forward, backward, clip, optimiser, EMA, device meters) reads its
batch from static input buffers. The first `warmup` steps run eagerly on a side stream (lazy state such
as optimiser moments and cuBLAS workspaces is created outside the capture); the next step is captured
once and every step after that is a copy into the static buffers and one `replay()`. Gradients are
freed before capture and then live in the graph's memory pool, where each replay overwrites them. If
capture fails, the error is logged and the step stays eager from then on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import torch
from torch import Tensor, nn

from dynaforge.config import CompileConfig, TrainConfig
from dynaforge.train.checkpoint import restore_rng_state, rng_state

log = logging.getLogger(__name__)

StepFunction = Callable[[Tensor, Tensor], None]


def compiled_or_eager(
    trial: Callable[[], nn.Module | None], model: nn.Module, settings: TrainConfig
) -> nn.Module | None:
    """The compiled stepped model `trial` returns (a task compiling it and trying its step on the shapes
    training will see, so that compilation fails here if it fails at all), or None when it does not compile
    (logged; training stays eager). Leaves no trace: gradients freed, buffers and random generators
    restored."""
    buffers = [b.detach().clone() for b in model.buffers()]
    generators = rng_state()
    try:
        compiled = trial()
        if compiled is not None:
            log.info("model compiled (mode %s, backend %s)", settings.compile.mode, settings.compile.backend)
        return compiled
    except Exception as error:  # any compilation failure: eager, logged
        first_line = str(error).splitlines()[0] if str(error) else ""
        log.warning("torch.compile failed (%s: %s); training runs eagerly", type(error).__name__, first_line)
        return None
    finally:
        model.zero_grad(set_to_none=True)
        with torch.no_grad():
            for buffer, saved in zip(model.buffers(), buffers):
                buffer.copy_(saved)
        restore_rng_state(generators)


def compile_model(model: nn.Module, config: CompileConfig) -> nn.Module:
    """`torch.compile(model)` with the configured mode and backend (compilation happens at the first call)."""
    mode = config.mode if config.backend == "inductor" else None
    return torch.compile(model, mode=mode, backend=config.backend, dynamic=config.dynamic)


class StepGraph:
    """The whole training step, captured in a CUDA graph after a warmup (see the module docstring)."""

    def __init__(self, step: StepFunction, warmup: int, free_gradients: Callable[[], None]) -> None:
        self.step = step
        self.warmup = warmup
        self.free_gradients = free_gradients
        self.graph: torch.cuda.CUDAGraph | None = None
        self.inputs: Tensor | None = None
        self.targets: Tensor | None = None
        self.eager_steps = 0
        self.failed = False

    def run(self, inputs: Tensor, targets: Tensor) -> None:
        """One training step on this batch: warmup, capture then replay, or eager (after a failure)."""
        if self.failed:
            self.free_gradients()
            self.step(inputs, targets)
            return
        if self.inputs is None:
            self.inputs, self.targets = inputs.clone(), targets.clone()
        if inputs.shape != self.inputs.shape or targets.shape != self.targets.shape:
            # An invariant (a bug if hit): the engine captures only tasks whose loaders drop partial batches.
            raise ValueError(
                f"a captured step needs batches of one shape, got {tuple(inputs.shape)} after "
                f"{tuple(self.inputs.shape)}; the train loader must drop the last partial batch"
            )
        # In place on purpose: the captured kernels read these exact buffers.
        self.inputs.copy_(inputs, non_blocking=True)
        self.targets.copy_(targets, non_blocking=True)
        if self.graph is not None:
            self.graph.replay()
        elif self.eager_steps < self.warmup:
            self.run_on_side_stream()
        else:
            self.capture()

    def run_on_side_stream(self) -> None:
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            self.free_gradients()
            self.step(self.inputs, self.targets)
        torch.cuda.current_stream().wait_stream(side)
        self.eager_steps += 1

    def capture(self) -> None:
        graph = torch.cuda.CUDAGraph()
        self.free_gradients()
        try:
            # thread_local: the DataLoader's pin-memory thread may allocate while this thread captures.
            with torch.cuda.graph(graph, capture_error_mode="thread_local"):
                self.step(self.inputs, self.targets)
        except Exception as error:  # any capture failure: eager, logged
            log.warning(
                "CUDA graph capture failed (%s: %s); the step stays eager", type(error).__name__, error
            )
            self.failed = True
            torch.cuda.synchronize()
            self.free_gradients()
            self.step(self.inputs, self.targets)
            return
        log.info("training step captured in a CUDA graph after %d warmup steps", self.eager_steps)
        self.graph = graph
        graph.replay()  # capture records without running: run this batch's step now


def release_memory_if_short(device: torch.device, free_fraction: float = 0.05) -> bool:
    """Return cached CUDA blocks to the driver only when the device is nearly full and the cache is large.

    Emptying the cache costs later allocations a slow cudaMalloc, so it is done only when less than
    `free_fraction` of the device is free and the cache holds more than that much unused memory.
    """
    if device.type != "cuda":
        return False
    free, total = torch.cuda.mem_get_info(device)
    cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
    if free >= free_fraction * total or cached < free_fraction * total:
        return False
    torch.cuda.empty_cache()
    log.info(
        "CUDA memory short (%.1f%% free): released %.2f GiB of cached blocks",
        100 * free / total,
        cached / 2**30,
    )
    return True
