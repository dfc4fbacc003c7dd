"""Surrogates trained on the windows of a dataset folder: the engine's most common task (`WindowTask`).

Windows come from the dataset folder's train and val splits, normalised with the train statistics. With
`train.rollout_steps` > 1 the model is unrolled autoregressively on its own predictions, and the loss
covers every predicted frame (gradients flow through the whole unroll). The loss is computed in fp32
whatever the prediction's precision; validation is the same loss over the validation windows, summed
across processes. The latent stack's stages (`train/stages.py`) are windows tasks too: they change the
windows, the loss and the validation metric.

The data order of an epoch depends on (seed, epoch) alone, and rank r of W takes every W-th window of it,
so W processes with `data.batch_size=B` train like one process with batch W x B, and a resumed run skips
exactly the windows it had trained on.

Where the windows come from (a split held in memory, read from the shards through a bounded buffer, or
generated while training runs; `data.source`, `data.reading`; README, "When to stream, when to store") is
decided by `dynaforge.data.sources.window_sources`; the task handles every source alike. Each batch's
wait for data is measured and logged (`data_measures`).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import default_collate

from dynaforge.config import Config
from dynaforge.data import Window
from dynaforge.data.sources import SplitWindows, WindowSources, window_sources
from dynaforge.errors import RunError
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.models.loading import pretrained_surrogate, pretrained_weights
from dynaforge.train.capture import compile_model
from dynaforge.train.distributed import sum_across_ranks
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.losses import LOSSES
from dynaforge.train.task import EngineContext, StepLoss

log = logging.getLogger(__name__)

SLOW_DATA_SHARE = 0.2
SLOW_DATA_SECONDS = 1.0
"""Training that waits for data more than this share of a logging window's wall time, and more than these
seconds in it (start-up waits are short), is told so."""


class WindowTask:
    """Train `config.model` on the windows of dataset folder `data` (see the module docstring)."""

    kind: str | None = None
    capturable = True
    data_parallel = True
    dataset: SplitWindows | None = None
    """A task's own windows of a split (the stack's stages define a `dataset` method); None: the config's."""
    sources: WindowSources
    """Where the windows come from (set up by `setup`)."""

    def __init__(self, config: Config, data: str | Path | None, init_from: str | Path | None = None) -> None:
        """`init_from`: a run folder whose surrogate's weights training starts from (fine-tuning)."""
        self.config = config
        self.data_root = Path(data).resolve() if data is not None else None
        self.init_from = init_from
        self.pretrained: dict[str, Tensor] | None = None
        self.loss_fn = LOSSES[config.train.loss]
        self.waited = 0.0
        self.windows_read = 0
        self.clock = time.perf_counter()
        self.warned_slow = False
        self.loaded_before = 0

    # ---- set-up ------------------------------------------------------------------------------------

    def setup(self, context: EngineContext) -> None:
        self.context = context
        cluster = context.cluster
        kept = None
        if self.init_from is not None and self.config.data.finetune_normalize == "pretrained":
            kept = pretrained_surrogate(self.init_from).normalizer  # the scale the weights were trained on
        self.sources = sources = window_sources(
            self.config,
            self.data_root,
            context.device,
            seed=context.settings.seed,
            epochs=context.settings.epochs,
            rank=cluster.rank,
            world_size=cluster.world_size,
            drop_last=context.capturing,  # a captured graph has one batch shape
            windows=self.dataset,
            normalizer=kept,
        )
        self.normalizer, self.identity, self.fingerprint = (
            sources.normalizer,
            sources.identity,
            sources.fingerprint,
        )
        self.train_set, self.val_set = sources.train, sources.val
        self.train_loader, self.val_loader = sources.train_loader, sources.val_loader
        self.shape = ModelShape(
            channels=self.normalizer.channels,
            history=self.config.data.history,
            horizon=self.config.data.horizon,
            spatial_dims=sources.spatial_dims,
            held=sources.held,
            boundary=sources.boundary,
            parameters=sources.parameters,
        )
        self.batches_per_epoch = len(self.train_loader)
        if self.init_from is not None:  # checked here, before the run folder is written
            self.pretrained = pretrained_weights(self.init_from, self.config.model, self.shape)

    def build_model(self) -> nn.Module:
        """The model of `config.model`, with the pretrained weights when fine-tuning (a resumed run then
        loads its own checkpoint over them)."""
        model = build_model(self.config.model, self.shape)
        if self.pretrained is not None:
            model.load_state_dict(self.pretrained)
        return model

    def epochs(self) -> int:
        return self.context.settings.epochs

    def micro_batches(self, epoch: int) -> int:
        return self.batches_per_epoch

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]:
        """This process's micro-batches of `epoch` on the device, after the first `skip`; the time spent
        waiting for each is added to `waited`."""
        self.clock, self.waited, self.windows_read = time.perf_counter(), 0.0, 0  # validation is not reading
        self.sources.order.start(epoch, skip=skip * self.config.data.batch_size)
        batches: Iterator[Any] = iter(self.train_loader)
        while True:
            asked = time.perf_counter()
            batch = next(batches, None)
            self.waited += time.perf_counter() - asked
            if batch is None:
                return
            self.windows_read += batch[0].shape[0]
            yield self.to_device(batch)

    def data_measures(self) -> dict[str, float]:
        """Since the last call: windows consumed per second, trajectories generated (stream) or read
        (lazy, main process) per second, and the seconds and share of wall time training waited for data.
        Says once in the log when the source does not keep up, and what to change (`WindowSources`)."""
        now = time.perf_counter()
        seconds = max(now - self.clock, 1e-9)
        measures = {
            "windows_per_s": self.windows_read / seconds,
            "data_wait_s": self.waited,
            "data_wait_share": min(self.waited / seconds, 1.0),
        }
        if self.sources.loaded_measure is not None:
            loaded = self.sources.loaded()
            measures[self.sources.loaded_measure] = (loaded - self.loaded_before) / seconds
            self.loaded_before = loaded
        slow = measures["data_wait_share"] > SLOW_DATA_SHARE and self.waited > SLOW_DATA_SECONDS
        if slow and not self.warned_slow:
            self.warned_slow = True
            log.warning(
                "training waited for data %.0f%% of the time (%.2f s); %s",
                100 * measures["data_wait_share"],
                self.waited,
                self.slow_data_advice(),
            )
        self.clock, self.waited, self.windows_read = now, 0.0, 0
        return measures

    def slow_data_advice(self) -> str:
        return self.sources.advice

    def to_device(self, batch: Window | tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        """Every tensor of the batch (inputs, targets, and whatever a task's batches add) on the device."""
        device = self.context.device
        non_blocking = device.type == "cuda"  # the loader pins host batches on CUDA
        return tuple(t.to(device, non_blocking=non_blocking) for t in batch)

    # ---- the step and its measures -------------------------------------------------------------------

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        """The model unrolled `rollout_steps` times from the inputs, against all target frames."""
        inputs, targets = batch[0], batch[1]
        predicted = autoregressive_rollout(model, ModelInput(frames=inputs), self.config.train.rollout_steps)
        with torch.autocast(self.context.device.type, enabled=False):
            loss = self.loss_fn(predicted, targets)  # in fp32 whatever the prediction's dtype
        return StepLoss(loss, loss)

    def validate(self, model: nn.Module) -> float:
        """Mean loss over the validation windows, unrolled as in training, summed across processes."""
        device = self.context.device
        total = torch.zeros((), dtype=torch.float64, device=device)
        count = 0
        for batch in self.val_loader:
            inputs, targets = self.to_device(batch)[:2]
            predicted = autoregressive_rollout(
                model, ModelInput(frames=inputs), self.config.train.rollout_steps
            )
            total = total + self.loss_fn(predicted, targets).to(torch.float64) * inputs.shape[0]
            count += inputs.shape[0]
        sums = torch.stack([total, torch.tensor(float(count), dtype=torch.float64, device=device)])
        loss_sum, count = sum_across_ranks(sums, self.context.cluster).tolist()
        return loss_sum / max(count, 1.0)

    def validation_details(self) -> dict[str, float]:
        return {}  # the loss is the one figure of validation

    def compiled(self, model: nn.Module) -> nn.Module | None:
        """torch.compile of the stepped model, tried on the batch sizes training will see (the full one and
        the last, partial one, which may need a recompilation), so that compilation fails here if at all."""
        compiled = compile_model(model, self.context.settings.compile)
        batch_size = self.config.data.batch_size
        examples = self.sources.examples
        last = self.sources.order.num_samples % batch_size
        sizes = [min(batch_size, len(examples))] + ([last] if last and not self.context.capturing else [])
        for size in sizes:
            batch = self.to_device(default_collate([examples[i] for i in range(size)]))
            with self.context.precision.autocast():
                loss = self.loss(compiled, batch)
            loss.objective.backward()
        return compiled

    # ---- what the run records -----------------------------------------------------------------------

    def train_windows(self) -> int:
        """Windows per epoch (streaming: this process's)."""
        return self.sources.windows_per_epoch

    def describe(self) -> str:
        reading = " (read from the shards)" if self.sources.reading == "lazy" else ""
        return f"{self.config.model.name} on {self.train_windows()} {self.sources.kind}windows{reading}"

    def header(self) -> dict[str, Any]:
        return {
            "data": str(self.data_root) if self.data_root is not None else None,
            "source": self.config.data.source,
            "reading": self.sources.reading,
            "model": self.config.model.name,
            "init_from": str(self.init_from) if self.init_from is not None else None,
            "train_windows": self.train_windows(),
            "val_windows": len(self.val_set),
        }

    def checkpoint_extras(self) -> dict[str, Any]:
        return {
            "model_shape": self.shape._asdict(),
            "normalization": self.normalizer.to_dict(),
            "data": str(self.data_root) if self.data_root is not None else None,
            "data_identity": self.identity.to_dict(),
            "data_fingerprint": self.fingerprint,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing beyond what the engine restores (the windows are read or generated again, their order a
        function of the epoch and position), once the run is seen to normalise as before: a fine-tuning run
        resumed without its `--from` (or with another `data.finetune_normalize`) would not."""
        before = state.get("normalization")
        if before is not None and before != self.normalizer.to_dict():
            raise RunError(
                f"the run being resumed normalised its fields with {before}, this one would with "
                f"{self.normalizer.to_dict()}: resume a fine-tuning run with the same --from RUN and "
                "data.finetune_normalize it started with"
            )

    def close(self) -> None:
        """Stop the stream's generator thread, if any (training is over)."""
        self.sources.close()


def window_engine(
    config: Config,
    data: str | Path | None,
    out: str | Path,
    progress: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    profile_steps: int = 0,
    init_from: str | Path | None = None,
) -> Engine:
    """The engine set up to train `config.model` on dataset folder `data` into run folder `out` (`data` may be
    None with `data.source: stream`), starting from the weights of run `init_from` if given."""
    return Engine(
        config,
        WindowTask(config, data, init_from),
        out,
        progress=progress,
        overwrite=overwrite,
        resume=resume,
        profile_steps=profile_steps,
    )


def train(config: Config, data: str | Path | None, out: str | Path, **options: Any) -> TrainSummary:
    """Train `config` on dataset folder `data` into run folder `out` (see `WindowTask`, `Engine`); `options`
    are `window_engine`'s (progress, overwrite, resume, profile_steps, init_from)."""
    engine = window_engine(config, data, out, **options)
    try:
        return engine.fit()
    finally:
        engine.task.close()
