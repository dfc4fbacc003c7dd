"""What the incompressible-flow systems (`cavity`, `cylinder`) share: a 2D staggered grid of three stored
channels, parameters drawn per sample from the config's ranges, and blocks sized from the grid alone.

A subclass sets `config_class` (a config with a `grid_shape`: cells along x and along y) and `stored` (its
channel names), and gives what a block of samples starts from, how it steps and what it stores through
`block_stepping(params)`; `rollout` here runs the blocks (the cavity from rest, the cylinder from its inflow after `spin_up_steps()` unstored).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.seeds import Rows, sample_rng
from dynaforge.systems.base import SampleRows, SystemBase, Trajectories
from dynaforge.systems.batching import (
    block_values_for,
    pad_rows,
    power_of_two_block,
    run_blocks,
    trajectory_buffer,
)
from dynaforge.systems.pde.initial import draw_from_range
from dynaforge.threads import serialised

BLOCK_VALUES = 2**15
"""A CPU rollout steps its batch in blocks of about this many cell values (three channels of each sample:
8 samples of 32 x 32, 2 of 64 x 64, 1 of 128 x 128), padded to the full block with copies, so that every
matrix product a sample goes through has a shape that comes from the grid alone (`systems/batching.py`)."""


class BlockStepping(NamedTuple):
    """A block of samples ready to step: its state, one step, and the stored frame of a state."""

    state: Any
    advance: Callable[[Any], Any]
    frame: Callable[[Any], Float[Tensor, "batch 3 nx ny"]]


class FlowSystem(SystemBase):
    """A 2D flow on the staggered grid of `mac.py`, three channels stored at the cell centres."""

    channels: ClassVar[int] = 3
    stored: ClassVar[tuple[str, str, str]]
    """The names of the three stored channels."""
    conserved: ClassVar[tuple[str, ...]] = ()
    """Nothing: the walls, a moving lid, an inflow or an obstacle put momentum in or take it out."""
    rows_per_unit: ClassVar[int] = 1
    ndim: int = 2

    def __init__(self, config: SystemConfig) -> None:
        if not isinstance(config, self.config_class):
            raise TypeError(
                f"{type(self).__name__} needs a {self.config_class.__name__}, got {type(config).__name__}"
            )
        self.config: Any = config
        self.shape: tuple[int, int] = config.grid_shape
        self.real_dtype = torch.float64 if config.dtype == "float64" else torch.float32

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    @property
    def channel_names(self) -> tuple[str, ...]:
        return self.stored

    @property
    def axis_names(self) -> tuple[str, ...]:
        return ("x", "y")

    def draw_parameters(self, rngs: Sequence[np.random.Generator]) -> Float[Tensor, "batch n_params"]:
        """One parameter row per generator, in `parameter_names` order (float64)."""
        rows = [
            [draw_from_range(getattr(self.config, name), rng) for name in self.parameter_names]
            for rng in rngs
        ]
        return torch.tensor(rows, dtype=torch.float64).view(len(rngs), len(self.parameter_names))

    def sample_rows(
        self, rows: Rows, device: torch.device, on_steps: Callable[[int], Any] | None = None
    ) -> SampleRows:
        params = self.draw_parameters([sample_rng(seed) for seed in rows.seeds()])
        result = self.rollout(params.to(device), on_step=on_steps)
        fields = result.fields.to(torch.float32)  # (rows, T, 3, nx, ny), rounded to float32 where made
        return SampleRows(fields, params.numpy(), result.time.cpu().numpy(), {})

    def block_samples(self, device: torch.device) -> int:
        """Samples per block on `device`: from the grid and the device kind alone, a power of two."""
        return power_of_two_block(3 * math.prod(self.shape), block_values_for(device, BLOCK_VALUES), 1)

    def block_stepping(self, params: Float[Tensor, "batch n_params"]) -> BlockStepping:
        """The start, the step and the stored frame of a block of samples (`params` padded to the block)."""
        raise NotImplementedError

    def spin_up_steps(self) -> int:
        """Steps run before the first stored frame (none by default)."""
        return 0

    def rollout(
        self,
        params: Float[Tensor, "batch n_params"],
        steps: int | None = None,
        save_every: int | None = None,
        on_step: Callable[[int], None] | None = None,
    ) -> Trajectories:
        """Step the batch a block at a time: `spin_up_steps()` unstored, then keep that frame and every
        `save_every`-th of `steps` more. `on_step(samples)` is called after every stored step of a block."""
        steps = self.config.steps if steps is None else steps
        save_every = self.config.save_every if save_every is None else save_every
        self.check_params(params)
        device, batch = params.device, params.shape[0]
        n_frames = steps // save_every + 1
        # Preallocated trajectory buffer, filled frame by frame (in-place writes on purpose; blocks write
        # disjoint rows).
        frames = trajectory_buffer((batch, n_frames, self.channels, *self.shape), self.real_dtype, device)
        report = serialised(on_step)
        block = self.block_samples(device)
        padded = block if device.type == "cpu" else 1
        spin_up = self.spin_up_steps()

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            state, advance, frame = self.block_stepping(pad_rows(params[rows], padded))
            for _ in range(spin_up):
                state = advance(state)
            frames[rows, 0] = frame(state)[:count]
            for n in range(1, steps + 1):
                state = advance(state)
                if n % save_every == 0:
                    frames[rows, n // save_every] = frame(state)[:count]
                if report is not None:
                    report(count)

        run_blocks(run_block, batch, block, device)
        time = (spin_up + torch.arange(n_frames, dtype=torch.float64) * save_every) * self.config.dt
        return Trajectories(frames, time)
