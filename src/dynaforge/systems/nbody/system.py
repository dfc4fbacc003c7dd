"""The N-body system behind `dynaforge generate`: draws systems, rolls them out in blocks, returns frames.

Dataset layout: fields (batch, time, channels, bodies) with channels (x, y, z, vx, vy, vz), the body axis in
the place of space (channels first, like every system's); the store keeps them channels last, (N, T, bodies, 6). Conventions of the physics: `dynaforge.systems.nbody.physics`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import NBodyConfig
from dynaforge.systems.base import BlockSteppedSystem, InitialStates, RolloutRun
from dynaforge.systems.batching import LANES, block_samples, pad_rows
from dynaforge.systems.nbody.control import StepController, build_controller, rollout_to_times
from dynaforge.systems.nbody.initial import draw_system
from dynaforge.systems.nbody.physics import (
    CHANNEL_NAMES,
    DTYPES,
    BodyParams,
    BodyState,
    CompiledGravity,
    Gravity,
    fixed_step_rollout,
    gravity,
)
from dynaforge.systems.nbody.schemes import scheme_named

BLOCK_PAIR_VALUES = 2**19
"""A dataset rollout steps about this many pair-separation values at a time (672 systems of 16 bodies):
blocks of whole lane groups on one intra-op thread each (`systems/batching.py`), so that a system's
trajectory is the same bytes in any batch and on any thread count."""


def state_to_channels(state: BodyState) -> Float[Tensor, "batch 6 bodies"]:
    return torch.cat([state.positions, state.velocities], dim=-1).transpose(1, 2)


def channels_to_state(fields: Float[Tensor, "batch 6 bodies"]) -> BodyState:
    per_body = fields.transpose(1, 2)
    return BodyState(per_body[..., :3], per_body[..., 3:])


class NBody(BlockSteppedSystem):
    """The N-body system behind `dynaforge generate` (same contract as `SpectralSystem`).

    Parameter columns: mass_0 .. mass_{n-1}, softening, external_mass, external_x, external_y,
    external_z, then family-specific descriptors (Kepler: semi_major_axis, eccentricity) that the
    dynamics ignore. Fields are (batch, time, 6, bodies), channels (x, y, z, vx, vy, vz); the store keeps
    them channels last. The body axis is named `body`; its coordinate is the body index.

    `controller` chooses the steps when given (a learned controller arrives this way: the generate stage
    loads it, the simulator never imports a trained network); otherwise `system.control` builds a fixed or
    classical adaptive one.
    """

    name: ClassVar[str] = "nbody"
    config_class: ClassVar[type[NBodyConfig]] = NBodyConfig
    channels: ClassVar[int] = 6
    ndim: ClassVar[int] = 1
    channel_names: ClassVar[tuple[str, ...]] = CHANNEL_NAMES
    axis_names: ClassVar[tuple[str, ...]] = ("body",)
    rows_per_unit: ClassVar[int] = 1
    rollout_axes: ClassVar[str] = f" with channels {CHANNEL_NAMES}"

    def __init__(self, config: NBodyConfig, controller: StepController | None = None) -> None:
        if not isinstance(config, NBodyConfig):
            raise TypeError(f"NBody needs an NBodyConfig, got {type(config).__name__}")
        self.config = config
        self.controller = controller
        self.compiled_forces: CompiledGravity | None = None  # built on first use (system.forces: compiled)
        self.shape = (config.bodies,)
        self.dtype = DTYPES[config.dtype]
        self.real_dtype = self.dtype  # the trajectories' dtype
        self.scheme = scheme_named(config.integrator)

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return self.config.parameter_names()

    def draw_samples(self, rngs: Sequence[np.random.Generator]) -> InitialStates:
        """Parameters (batch, P) float64 and initial states (batch, 6, bodies) float64, one generator each."""
        rows, states = [], []
        for rng in rngs:
            row, positions, velocities = draw_system(self.config, rng)
            rows.append(row)
            states.append(np.concatenate([positions, velocities], axis=1).T)
        return InitialStates(torch.from_numpy(np.stack(rows)), torch.from_numpy(np.stack(states)))

    def params_from_rows(self, rows: Float[Tensor, "batch n_params"]) -> BodyParams:
        """Split parameter rows (columns in `parameter_names` order) into `BodyParams`."""
        names = self.parameter_names
        rows = rows.to(self.dtype)
        column = {name: rows[:, names.index(name)] for name in names if not name.startswith("mass_")}
        masses = rows[:, [names.index(f"mass_{i}") for i in range(self.config.bodies)]]
        position = torch.stack([column["external_x"], column["external_y"], column["external_z"]], dim=1)
        external = column["external_mass"]
        return BodyParams(masses, column["softening"], external, position, bool((external > 0).any()))

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        return {}

    def divergence_cause(self) -> str:
        return (
            f"system.dt={self.config.dt:g} may be too large for a close encounter; reduce system.dt, raise "
            "system.softening or use system.control.kind=adaptive"
        )

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The body axis's coordinate per sample: the body index (N, bodies)."""
        index = np.arange(self.config.bodies, dtype=np.float64)
        return {"body": np.broadcast_to(index, (params.shape[0], self.config.bodies)).copy()}

    def block_stepper(self, run: RolloutRun) -> Callable[[slice], None]:
        """Frames every `save_every * dt` time units up to `steps * dt`, the initial one included.

        With fixed control each frame is `save_every` steps of size dt. With adaptive or learned control
        the controller picks each system's steps and the last step before a frame is shortened to land
        on it (that shortening breaks exact time symmetry; `dynaforge nbody simulate` does not do it).
        """
        initial, params, steps, save_every, fields, report, _ = run
        interval = self.config.dt * save_every

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            state = channels_to_state(pad_rows(initial[rows].to(self.dtype)))
            body_params = self.params_from_rows(pad_rows(params[rows].to(initial.device)))
            saved = self.saved_states(state, body_params, steps, save_every, interval, count, report)
            for frame, saved_state in enumerate(saved):
                fields[rows, frame] = state_to_channels(saved_state)[:count]  # disjoint rows per block

        return run_block

    def block_samples(self, device: torch.device | None = None) -> int:
        """Systems per block (a multiple of 16, from the body count alone, on any device): about
        `BLOCK_PAIR_VALUES` pair-separation values, so that a block's per-step tensors stay in cache."""
        return block_samples(3 * self.config.bodies**2, BLOCK_PAIR_VALUES, LANES)

    def saved_states(
        self,
        state: BodyState,
        params: BodyParams,
        steps: int,
        save_every: int,
        interval: float,
        count: int,
        report: Callable[[int], None] | None,
    ) -> list[BodyState]:
        """The states at every frame time of one block (the initial one first); `report(count * steps)`."""
        forces = self.forces()
        if self.config.control.kind == "fixed":
            on_step = None if report is None else (lambda _: report(count))
            _, saved = fixed_step_rollout(
                state, params, self.config.dt, steps, self.scheme, save_every, on_step, forces
            )
            return saved
        controller = self.controller or build_controller(self.config.control, self.config.dt)
        times = [interval * k for k in range(1, steps // save_every + 1)]
        # Controller steps are not the config's steps: progress counts nominal steps per frame reached.
        on_frame = None if report is None else (lambda _: report(count * save_every))
        return [
            state,
            *rollout_to_times(state, params, controller, times, self.scheme, on_frame, forces=forces),
        ]

    def forces(self) -> Callable[[Tensor, BodyParams], Gravity]:
        """`system.forces`: eager `gravity`, or this system's `CompiledGravity` (compiled once per key)."""
        if self.config.forces == "eager":
            return gravity
        if self.compiled_forces is None:
            self.compiled_forces = CompiledGravity()
        return self.compiled_forces
