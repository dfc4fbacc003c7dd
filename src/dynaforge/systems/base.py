"""The contract every ground-truth simulator keeps with the rest of dynaforge (`System`).

A system names its arrays (parameters, channels, axes), draws each sample from the generator its seed
gives, and turns samples [start, stop) of a split into the rows the store keeps (`sample_rows`); whatever
the batch, the shard split or the thread count, a sample's rows are the same bytes
(`systems/batching.py`). Results are NamedTuples.

Layout: a trajectory is channels first, (samples, time, channels, *space), float32, on the device that made
it, from the simulator to the training batch; only the store converts it to and from its on-disk layout
(`dynaforge.store.format.fields_to_disk`). For the N-body system "space" is the body axis:
(samples, time, 6, bodies).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, ClassVar, NamedTuple, Protocol, runtime_checkable

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import config_to_dict
from dynaforge.errors import ConfigError
from dynaforge.seeds import Rows, sample_rng
from dynaforge.systems.batching import run_blocks, trajectory_buffer
from dynaforge.threads import serialised

AXIS_NAMES = ("x", "y", "z")


class SampleRows(NamedTuple):
    """Samples [start, stop) of a split: what the store writes and a stream trains on."""

    fields: Float[Tensor, "rows time channels *space"]
    """(rows, T, C, *space) float32, channels first, on the device that generated it."""
    params: np.ndarray
    """(rows, P) float64, columns `parameter_names`."""
    time: np.ndarray
    """(T,) float64."""
    extras: dict[str, np.ndarray]
    """Per-sample arrays a system adds (random CNN: operator, realization, sobol, features, ...)."""


class Trajectories(NamedTuple):
    """Saved frames of a batch of samples and the time of each frame (what `rollout` returns)."""

    fields: Float[Tensor, "batch time channels *space"]
    time: Float[Tensor, " time"]


class InitialStates(NamedTuple):
    """What `draw_samples` returns: one parameter row and one initial state per sample."""

    params: Float[Tensor, "batch n_params"]
    """(batch, P) float64, columns `parameter_names`."""
    initial: Float[Tensor, "batch channels *space"]
    """(batch, C, *space) float64."""


@runtime_checkable
class System(Protocol):
    """A batched simulator (see the module docstring)."""

    name: str
    channels: int
    ndim: int
    shape: tuple[int, ...]

    @property
    def parameter_names(self) -> tuple[str, ...]: ...

    @property
    def channel_names(self) -> tuple[str, ...]: ...

    @property
    def axis_names(self) -> tuple[str, ...]: ...

    rows_per_unit: int
    """Samples that are generated together (random CNN: the realizations of one operator; else 1)."""

    def sample_rows(
        self, rows: Rows, device: torch.device, on_steps: Callable[[int], Any] | None = None
    ) -> SampleRows: ...

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]: ...

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]: ...

    def config_identity(self, device: str) -> dict[str, Any]: ...

    def divergence_cause(self) -> str: ...


class SystemBase:
    """The class every system derives from, dynaforge's own and a user's (`system.name: package.module:Class`).

    A subclass declares, beside its physics:
    - `name`: the name it is registered under (dynaforge's own systems; a user's system is named by its
      import path in configs, and `name` is only how it calls itself in messages);
    - `config_class`: the dataclass of its `system` config section (a subclass of
      `dynaforge.config.SystemConfig`, or `NBodyConfig`), built from YAML before the system is;
    - `conserved`: the quantities its rollouts conserve on a periodic domain (`mass`: the spatial mean of
      each channel; `energy`: the spatial mean of u^2 / 2), checked as drifts when a model is evaluated.

    It is constructed from one instance of `config_class` (kept as `config`) and keeps the `System` protocol
    above; the members most systems share have defaults here. A config that names a class by import path is
    refused unless the path leads to a subclass of this one (`dynaforge.systems.registry.system_class`),
    before anything of that class is called.
    """

    name: ClassVar[str]
    config_class: ClassVar[type]
    conserved: ClassVar[tuple[str, ...]] = ()
    config: Any
    channels: int
    ndim: int

    def config_identity(self, device: str) -> dict[str, Any]:
        """The system's config as it determines the arrays generated on `device` (a device name of
        `dataset.device`, `auto` included), which a dataset's manifest records as its identity. Default: the
        config as it is. A system whose arrays depend on the device beyond the last bits (random CNN:
        `precision: auto`) writes what the setting resolves to there."""
        return config_to_dict(self.config)

    @property
    def channel_names(self) -> tuple[str, ...]:
        """Default: u for one channel, u0, u1, ... for several."""
        return default_channel_names(self.channels)

    @property
    def axis_names(self) -> tuple[str, ...]:
        """Default: x, y, z, the first `ndim` of them."""
        return AXIS_NAMES[: self.ndim]

    def sample_rows(
        self, rows: Rows, device: torch.device, on_steps: Callable[[int], Any] | None = None
    ) -> SampleRows:
        """Default, for a system with `draw_samples` and `rollout`: `rows`, each drawn from its own seed,
        rolled out together (`rows_from_seeds`)."""
        missing = [name for name in ("draw_samples", "rollout") if not callable(getattr(self, name, None))]
        if missing:
            raise ConfigError(
                f"system {type(self).__module__}:{type(self).__qualname__} defines neither sample_rows nor "
                f"{' and '.join(missing)}: a system gives its rows either way (docs/user-systems.md)"
            )
        return rows_from_seeds(self.draw_samples, self.rollout, rows, device, on_steps)

    def rollout_lengths(
        self,
        initial: Tensor,
        params: Tensor,
        steps: int | None,
        save_every: int | None,
        state: tuple[int, ...],
        axes: str = "",
    ) -> tuple[int, int]:
        """(steps, save_every) of a `rollout` call, the config's where not given, after `check_batch`."""
        self.check_batch(initial, params, state, axes)
        return (
            self.config.steps if steps is None else steps,
            self.config.save_every if save_every is None else save_every,
        )

    def check_batch(self, initial: Tensor, params: Tensor, state: tuple[int, ...], axes: str = "") -> None:
        """Raise a `ConfigError` unless `initial` is (batch, *state) and `params` (batch, parameters); `axes`
        says in the message what the state's axes are (e.g. the N-body channels)."""
        if initial.ndim != len(state) + 1 or tuple(initial.shape[1:]) != state:
            raise ConfigError(
                f"{self.name}: initial state must have shape (batch, {', '.join(map(str, state))}){axes}, got "
                f"{tuple(initial.shape)}; add a leading batch axis for a single sample"
            )
        self.check_params(params, initial.shape[0])

    def check_params(self, params: Tensor, batch: int | None = None) -> None:
        """Raise a `ConfigError` unless `params` is (batch, parameters), any batch where `batch` is None."""
        names = self.parameter_names
        if params.ndim != 2 or params.shape[1] != len(names) or batch not in (None, params.shape[0]):
            raise ConfigError(
                f"{self.name}: params must have shape (batch, {len(names)}) with columns {names}, "
                f"got {tuple(params.shape)}"
            )

    def divergence_cause(self) -> str:
        """The likely reason a rollout produced NaN or Inf when every parameter is inside its declared range,
        and the fix, for the store's error message."""
        return f"the rollout diverged; reduce system.dt (now {self.config.dt:g})"


class RolloutRun(NamedTuple):
    """One `rollout` call of a `BlockSteppedSystem`, as its `block_stepper` sees it."""

    initial: Float[Tensor, "batch channels *space"]
    params: Float[Tensor, "batch n_params"]
    steps: int
    save_every: int
    frames: Float[Tensor, "batch time channels *space"]
    """The trajectory buffer, preallocated; each block writes its own rows (in-place writes on purpose)."""
    report: Callable[[int], None] | None
    """`on_step`, serialised across the worker threads (None when not given)."""
    cuda_graph: bool


class BlockSteppedSystem(SystemBase):
    """A system whose `rollout` steps the batch a block of samples at a time and keeps the initial state and
    every `save_every`-th one, `dt * save_every` apart (the spectral, bounded and N-body systems).

    The steps are the subclass's: `block_stepper` returns what one block does (step rows [start, stop) of
    the batch and write their frames), `block_samples(device)` the block size; the checks, the trajectory
    buffer (`real_dtype`), the blocks (`systems/batching.py`) and the frame times are here.
    """

    real_dtype: torch.dtype
    shape: tuple[int, ...]
    rollout_axes: ClassVar[str] = ""
    """What the state's axes are, for the shape check's message (the N-body channels)."""

    def rollout(
        self,
        initial: Float[Tensor, "batch channels *space"],
        params: Float[Tensor, "batch n_params"],
        steps: int | None = None,
        save_every: int | None = None,
        on_step: Callable[[int], None] | None = None,
        cuda_graph: bool = True,
    ) -> Trajectories:
        """Step the batch a block at a time; keep the initial frame and every `save_every`-th step.

        `on_step(samples)` is called as blocks advance (from the worker threads, one call at a time; see the
        system's `block_stepper` for how often). `cuda_graph`: a system that captures its steps as a CUDA
        graph on a GPU (`SpectralSystem`) steps eagerly when it is false; the others always do.
        """
        state = (self.channels, *self.shape)
        steps, save_every = self.rollout_lengths(initial, params, steps, save_every, state, self.rollout_axes)
        device = initial.device
        n_frames = steps // save_every + 1
        frames = trajectory_buffer((initial.shape[0], n_frames, *state), self.real_dtype, device)
        run = RolloutRun(initial, params, steps, save_every, frames, serialised(on_step), cuda_graph)
        run_blocks(self.block_stepper(run), initial.shape[0], self.block_samples(device), device)
        time = torch.arange(n_frames, dtype=torch.float64) * (self.config.dt * save_every)
        return Trajectories(frames, time)

    def block_stepper(self, run: RolloutRun) -> Callable[[slice], None]:
        """What one block of `run` does: `step(rows)` steps rows [start, stop) of the batch and writes their
        frames into `run.frames[rows]` (anything shared by the blocks is prepared before it is returned)."""
        raise NotImplementedError

    def block_samples(self, device: torch.device) -> int:
        """Samples per block on `device`, from the sample's size and the device kind alone."""
        raise NotImplementedError


def default_channel_names(channels: int) -> tuple[str, ...]:
    """u for one channel, u0, u1, ... for several."""
    return tuple(f"u{c}" if channels > 1 else "u" for c in range(channels))


def grid_coordinates(shape: Sequence[int], lengths: np.ndarray) -> dict[str, np.ndarray]:
    """x_j = j L / n per axis and sample, (N, n) under the axis's name (left end included, right excluded)."""
    return {AXIS_NAMES[axis]: lengths[:, None] * (np.arange(n) / n)[None, :] for axis, n in enumerate(shape)}


def rows_from_seeds(
    draw: Callable[[Sequence[np.random.Generator]], InitialStates],
    rollout: Callable[..., Trajectories],
    rows: Rows,
    device: torch.device,
    on_steps: Callable[[int], Any] | None = None,
) -> SampleRows:
    """`rows` for a system that draws each sample from its seed and rolls a batch out: the drawing and the
    rollout of `SpectralSystem` and `NBody`. The fields stay where the rollout left them (`device`)."""
    drawn = draw([sample_rng(seed) for seed in rows.seeds()])
    result = rollout(drawn.initial.to(device), drawn.params.to(device), on_step=on_steps)
    fields = result.fields.to(torch.float32)  # (rows, T, C, *space), rounded to float32 where it was made
    return SampleRows(fields, drawn.params.numpy(), result.time.cpu().numpy(), {})
