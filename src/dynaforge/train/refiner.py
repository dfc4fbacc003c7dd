"""PDE-Refiner as stages of the staged engine (`dynaforge.train.stages`), run only when named:

refiner          the `model` section's architecture as a refiner (`dynaforge.models.refiner`): per window a
                 refinement step k drawn uniformly in 0..K (`stages.refiner.steps`), the one-step MSE at
                 k = 0 and the noise-prediction MSE at the release's noise level sigma_k otherwise; the best
                 checkpoint has the lowest validation nRMSE over `val_rollout` refined steps (fixed noise)
refiner_distill  a one-call student (the same network with K = 0 at inference), started from the refiner's
                 weights and trained (MSE) to reproduce the refiner's K + 1-call prediction of the same
                 window (the teacher's noise drawn afresh every batch); chosen like the refiner

`dynaforge train CONFIG --data DIR --out RUN stage=refiner` (then `stage=refiner_distill`); each trains with
the engine into RUN/<stage>/ and resumes like the stack's other stages (RUN/stages.json). The checkpoints
are of kind `refiner` (`dynaforge.models.loading.model_from_checkpoint` rebuilds them).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from dynaforge.config import Config, ConfigError
from dynaforge.data.conditioned import StageData, evenly_spaced
from dynaforge.metrics.fields import nrmse_per_sample
from dynaforge.models.base import ModelInput
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.models.refiner import REFINER_KIND, Refiner, build_refiner, refined_rollout, refiner_loss
from dynaforge.runs import load_checkpoint
from dynaforge.train.engine import TrainSummary
from dynaforge.train.losses import mse_loss
from dynaforge.train.stages import StageContext, StageTask, collate, fit, frozen, run_stages, stage_train
from dynaforge.train.task import StepLoss

log = logging.getLogger(__name__)


class RefinerTask(StageTask):
    """Stage `refiner` (see the module docstring); with `teacher`, stage `refiner_distill`."""

    kind = REFINER_KIND

    def __init__(self, config: Config, data: StageData, teacher: Refiner | None = None) -> None:
        super().__init__(config, data)
        if config.model.name == "latent":
            raise ConfigError(
                "the refiner wraps a grid surrogate (model.name fno or unet); the latent operator's "
                "conditions are not passed through it"
            )
        self.stage = config.stages.refiner
        self.teacher = teacher
        self.steps = 0 if teacher is not None else self.stage.steps
        calls = min(self.stage.val_rollout, data.max_targets(config.data.history))
        self.val, self.calls = data.windows("val", config.data.history, calls), calls
        self.val_indices = evenly_spaced(len(self.val), config.stages.val_windows)

    def dataset(self, folder: Any, split: str) -> Any:
        return self.data.windows(split, self.config.data.history, 1)

    def build_model(self) -> nn.Module:
        stage = self.stage
        return build_refiner(
            self.config.model,
            self.shape,
            self.steps,
            stage.min_noise_std,
            stage.change_scale,
            stage.prediction,
        )

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        inputs, targets = batch[0], batch[1][:, :1]
        refiner: Refiner = getattr(model, "module", model)
        if self.teacher is not None:
            with torch.no_grad():
                wanted = self.teacher(ModelInput(frames=inputs)).frames
            loss = mse_loss(refiner(ModelInput(frames=inputs)).frames.float(), wanted.float())
            return StepLoss(loss, loss)
        k = torch.randint(0, self.steps + 1, (inputs.shape[0],), device=inputs.device)
        noise = torch.randn_like(targets)
        loss = refiner_loss(refiner, inputs, targets, k, noise, balance=self.stage.balance)
        return StepLoss(loss, loss)  # balanced or not, the value is the plain mean

    def validate(self, model: nn.Module) -> float:
        """Mean nRMSE (normalised units) of `val_rollout`-step refined rollouts from evenly spaced val
        windows, with the same refinement noise every epoch."""
        refiner: Refiner = getattr(model, "module", model)
        device = next(model.parameters()).device
        generator = torch.Generator(device=device).manual_seed(self.config.stages.seed)
        errors = []
        for lo in range(0, len(self.val_indices), self.config.data.batch_size):
            batch = collate(self.val, self.val_indices[lo : lo + self.config.data.batch_size], device)
            predicted = refined_rollout(refiner, batch[0], self.calls, generator)
            errors.append(nrmse_per_sample(predicted.float(), batch[1]).mean(dim=(1, 2)))
        return float(torch.cat(errors).mean())

    def checkpoint_extras(self) -> dict[str, Any]:
        return {
            **super().checkpoint_extras(),
            "refiner_steps": self.steps,
            "min_noise_std": self.stage.min_noise_std,
            "change_scale": self.stage.change_scale,
            "refiner_prediction": self.stage.prediction,
        }


def refiner(context: StageContext) -> TrainSummary:
    base = context.config
    stage = base.stages.refiner

    def build() -> Config:
        return dataclasses.replace(base, train=stage_train(base, stage.epochs, stage.lr))

    config = context.resolved("refiner", build)
    return fit(context, "refiner", config, RefinerTask(config, context.data()))


def load_refiner(context: StageContext, stage: str = "refiner", device: str = "cpu") -> Refiner:
    model = frozen(model_from_checkpoint(load_checkpoint(context.best(stage), device)))
    assert isinstance(model, Refiner)
    return model


def refiner_distill(context: StageContext) -> TrainSummary:
    base = context.config
    stage = base.stages.refiner_distill
    teacher_state = load_checkpoint(context.best("refiner"))
    teacher = load_refiner(context)

    def build() -> Config:
        return dataclasses.replace(base, train=stage_train(base, stage.epochs, stage.lr))

    config = context.resolved("refiner_distill", build)
    task = RefinerTask(config, context.data(), teacher=teacher)
    return fit(context, "refiner_distill", config, task, start=teacher_state["model"])


REFINER_STAGES = {"refiner": refiner, "refiner_distill": refiner_distill}
"""The refiner's stages in the order `run_refiner_stages(stage="all")` runs them."""


def run_refiner_stages(
    config: Config, data: str | Path, out: str | Path, stage: str = "all", progress: bool | None = None
) -> dict[str, Any]:
    """`run_stages` over `REFINER_STAGES`: the refiner and its student into stack folder `out`."""
    return run_stages(config, data, out, stage, progress=progress, stages=REFINER_STAGES)
