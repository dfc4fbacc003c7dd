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
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset, default_collate

from dynaforge.config import Config
from dynaforge.data import (
    Normalizer,
    Window,
    WindowDataset,
    check_config_matches_data,
    data_fingerprint,
    data_identity,
    make_loader,
)
from dynaforge.errors import RunError
from dynaforge.models import ModelInput, ModelShape, autoregressive_rollout, build_model
from dynaforge.store import DatasetFolder
from dynaforge.train.capture import compile_model
from dynaforge.train.distributed import EpochSampler, ShardSampler, sum_across_ranks
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.losses import LOSSES
from dynaforge.train.task import EngineContext, StepLoss


class WindowTask:
    """Train `config.model` on the windows of dataset folder `data` (see the module docstring)."""

    kind: str | None = None
    capturable = True
    data_parallel = True

    def __init__(self, config: Config, data: str | Path) -> None:
        self.config = config
        self.data_root = Path(data).resolve()
        self.loss_fn = LOSSES[config.train.loss]

    # ---- set-up ------------------------------------------------------------------------------------

    def setup(self, context: EngineContext) -> None:
        self.context = context
        dataset = DatasetFolder(self.data_root)
        dataset.verify_shards()
        check_config_matches_data(self.config, dataset)
        self.identity = data_identity(dataset)
        self.fingerprint = data_fingerprint(dataset)
        self.normalizer = Normalizer.from_stats(dataset.stats)
        self.train_set = self.split_windows(dataset, "train")
        self.val_set = self.split_windows(dataset, "val")
        self.shape = ModelShape(
            channels=self.normalizer.channels,
            history=self.config.data.history,
            horizon=self.config.data.horizon,
            spatial_dims=self.train_set.spatial_dims,
        )
        self.train_sampler = EpochSampler(self.train_set, context.cluster, seed=context.settings.seed)
        self.train_loader = make_loader(
            self.train_set,
            self.config.data,
            context.device,
            shuffle=False,
            sampler=self.train_sampler,
            drop_last=context.capturing,  # a captured graph has one batch shape
        )
        self.val_loader = make_loader(
            self.val_set,
            self.config.data,
            context.device,
            shuffle=False,
            sampler=ShardSampler(len(self.val_set), context.cluster),
        )
        self.batches_per_epoch = len(self.train_loader)

    def split_windows(self, dataset: DatasetFolder, split: str) -> Dataset:
        if dataset.split_size(split) == 0:
            raise RunError(
                f"the {split} split of {dataset.root} is empty; generate it with dataset.n_{split} > 0"
            )
        return self.dataset(dataset, split)

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset:
        """The windows of `split` (a stage task overrides this)."""
        data = self.config.data
        return WindowDataset(
            folder.read_split(split).fields,
            self.normalizer,
            history=data.history,
            targets=data.horizon * self.config.train.rollout_steps,
            stride=data.stride,
        )

    def build_model(self) -> nn.Module:
        return build_model(self.config.model, self.shape)

    def epochs(self) -> int:
        return self.context.settings.epochs

    def micro_batches(self, epoch: int) -> int:
        return self.batches_per_epoch

    def epoch_batches(self, epoch: int, skip: int) -> Iterator[tuple[Tensor, ...]]:
        """This process's micro-batches of `epoch` on the device, after the first `skip`."""
        self.train_sampler.start(epoch, skip=skip * self.config.data.batch_size)
        for batch in self.train_loader:
            yield self.to_device(batch)

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
        last = self.train_sampler.num_samples % batch_size
        sizes = [min(batch_size, len(self.train_set))] + (
            [last] if last and not self.context.capturing else []
        )
        for size in sizes:
            batch = self.to_device(default_collate([self.train_set[i] for i in range(size)]))
            with self.context.precision.autocast():
                loss = self.loss(compiled, batch)
            loss.objective.backward()
        return compiled

    # ---- what the run records -----------------------------------------------------------------------

    def describe(self) -> str:
        return f"{self.config.model.name} on {len(self.train_set)} windows"

    def header(self) -> dict[str, Any]:
        return {
            "data": str(self.data_root),
            "model": self.config.model.name,
            "train_windows": len(self.train_set),
            "val_windows": len(self.val_set),
        }

    def checkpoint_extras(self) -> dict[str, Any]:
        return {
            "model_shape": self.shape._asdict(),
            "normalization": self.normalizer.to_dict(),
            "data": str(self.data_root),
            "data_identity": self.identity.to_dict(),
            "data_fingerprint": self.fingerprint,
        }

    def restore(self, state: dict[str, Any]) -> None:
        """Nothing beyond what the engine restores: the windows are read from the dataset again."""


def window_engine(
    config: Config,
    data: str | Path,
    out: str | Path,
    progress: bool | None = None,
    overwrite: bool = False,
    resume: bool = False,
    profile_steps: int = 0,
) -> Engine:
    """The engine set up to train `config.model` on dataset folder `data` into run folder `out`."""
    return Engine(
        config,
        WindowTask(config, data),
        out,
        progress=progress,
        overwrite=overwrite,
        resume=resume,
        profile_steps=profile_steps,
    )


def train(config: Config, data: str | Path, out: str | Path, **options: Any) -> TrainSummary:
    """Train `config` on dataset folder `data` into run folder `out` (see `WindowTask`, `Engine`); `options`
    are `window_engine`'s (progress, overwrite, resume, profile_steps)."""
    return window_engine(config, data, out, **options).fit()
