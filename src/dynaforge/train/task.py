"""What a training task is to the engine (`dynaforge.train.engine`): the protocol every kind of training
implements, and what the engine hands it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, NamedTuple, Protocol, runtime_checkable

import torch
from torch import Tensor, nn

from dynaforge.config import Config, TrainConfig
from dynaforge.train.distributed import Cluster
from dynaforge.train.precision import Precision


class StepLoss(NamedTuple):
    """What a task's step computes: the scalar backward differentiates, and the loss the logs and the
    non-finite guard read (the same tensor for a task that trains on its loss; two-phase training
    differentiates a contrast of energies whose gradient estimates that of its loss)."""

    objective: Tensor
    value: Tensor
    details: dict[str, Tensor] | None = None
    """Other 0-dim measures of the step (detached), averaged over each log interval into its record."""


class EngineContext(NamedTuple):
    """What the engine gives a task when it sets it up."""

    config: Config
    settings: TrainConfig
    device: torch.device
    cluster: Cluster
    precision: Precision
    settings_key: str
    """Where `settings` sit in the config (`train`, `timestepper.train`), for messages that name a key."""
    progress: bool | None
    capturing: bool
    """The engine captures the step in a CUDA graph (the task's batches must then have one shape)."""


@runtime_checkable
class Task(Protocol):
    """One kind of training, as the engine runs it (see the module docstring).

    `setup` is called once, before the model is built; batches are tuples of tensors on the device;
    `loss` runs under the run's autocast with the stepped model (compiled or DDP-wrapped, maybe);
    `validate` under eval mode and inference mode and returns the metric to minimise, the same on every
    process; `checkpoint_extras` adds plain data to every checkpoint and `restore` reads it back.
    `validation_details`, `data_measures` and `close` have defaults in `TaskDefaults`, which a task
    inherits to leave them out.
    """

    kind: str | None
    """Written into checkpoints as `kind` (None for surrogates, whose checkpoints carry no kind)."""
    capturable: bool
    """The step can be captured in a CUDA graph (one batch shape, no host syncs)."""
    data_parallel: bool
    """The task can train in several processes (DDP)."""

    def setup(self, context: EngineContext) -> None: ...

    def build_model(self) -> nn.Module: ...

    def epochs(self) -> int: ...

    def micro_batches(self, epoch: int) -> int: ...

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]: ...

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss: ...

    def validate(self, model: nn.Module) -> float: ...

    def validation_details(self) -> dict[str, float]:
        """Other figures of the last `validate` (per-group errors, ...), written into the epoch's record
        and passed to callbacks; empty when the task has none."""
        ...

    def compiled(self, model: nn.Module) -> nn.Module | None: ...

    def describe(self) -> str:
        """What is trained on what, for the log's first line ('fno on 72 windows')."""
        ...

    def header(self) -> dict[str, Any]: ...

    def checkpoint_extras(self) -> dict[str, Any]: ...

    def restore(self, state: dict[str, Any]) -> None: ...

    def data_measures(self) -> dict[str, float]:
        """Measures of the task's data source since the last call (`windows_per_s`, `data_wait_share`),
        added to each log interval's record and the progress bar; empty when the task has none."""
        ...

    def close(self) -> None:
        """Release what the task holds beyond the run (a stream's generator thread); called by whoever
        runs the engine once training ends, however it ends (`window.train`)."""
        ...


class TaskDefaults:
    """The default bodies of `Task`'s optional members, for a task to inherit: no validation details, no
    data measures, nothing to close."""

    def validation_details(self) -> dict[str, float]:
        return {}

    def data_measures(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        return None


@runtime_checkable
class EpochCallback(Protocol):
    """Called after each epoch's checkpoints are written (and, for a resumed run, for the epochs it had
    finished) with the epoch and its metrics: how tuning follows a run and prunes it (raising stops the run
    with a consistent folder)."""

    def __call__(self, epoch: int, metrics: dict[str, float]) -> None: ...
