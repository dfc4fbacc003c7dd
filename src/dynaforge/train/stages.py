"""The latent stack, trained in stages that hand checkpoints to each other.

`dynaforge train CONFIG --data DIR --out RUN stage=all` runs, in order, the DEFAULT_STAGES (the first three;
`steady_prior` is opt-in: `stage=steady_prior` on the same RUN trains it, docs/evaluation.md says why):

operator             the `model` section (the latent operator) on a one-step loss, an unrolled rollout loss
                     and a log energy-spectrum loss (fp32, autocast off); the best checkpoint has the lowest
                     validation rollout nRMSE over `val_rollout` calls
diffusion_residual   conditional flow matching of the residual truth(t + k) - the operator's k-step rollout
                     from the true frames at t (k = `interval`, the correction interval of inference; k = 1:
                     the one-step residual), conditioned on that prediction, the frame before it and the
                     parameters (the operator frozen, read from RUN/operator/checkpoints/best.pt); an S-step
                     sampler from real Gaussian noise; the best checkpoint has the lowest validation energy
                     score of the corrected prediction
consistency_distill  a student (started from the corrector's weights) trained so that its 1-2 step sampler
                     maps a noise draw (scaled by `temperature`, the sampling temperature it will be used
                     at) to what the teacher's S-step sampler makes of the same draw (MSE, plus a log
                     energy-spectrum term with `spectral_weight`); chosen by the same energy score as the
                     teacher, with its own few-step sampler
steady_prior         conditional flow matching of long-time states (the last frames of each trajectory)
                     given the parameters; chosen by the log10 energy-spectrum distance (energetic shells)
                     between generated and true validation states

Each stage trains with the engine (`dynaforge.train.engine.Engine`, a windows task) into its own
run folder RUN/<stage>/ (config.yaml with the stage's resolved config, metrics.jsonl, checkpoints/), so
every checkpoint carries the config and shape its model is rebuilt from. RUN/stages.json records each
stage's status, written atomically: a rerun skips `done` stages and resumes a `running` one from its
last checkpoint (mid-epoch with `train.checkpoint_every`). Stages run in one process; data.horizon must
be 1 (the corrector works frame by frame).
"""

from __future__ import annotations

import dataclasses
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import Tensor, nn
from torch.utils.data import Dataset

from dynaforge.atomic import atomic_write_json
from dynaforge.config import (
    Config,
    ConfigError,
    LatentConfig,
    TrainConfig,
    config_to_dict,
    load_config,
    save_config,
)
from dynaforge.data.conditioned import (
    LongTimeStates,
    StageData,
    evenly_spaced,
)
from dynaforge.errors import RunError
from dynaforge.metrics.ensemble import energy_score
from dynaforge.metrics.fields import nrmse_per_sample
from dynaforge.metrics.spectra import energy_spectrum, spectrum_distance
from dynaforge.models.flow import flow_velocity, integrate_flow, sample
from dynaforge.models.latent import Conditions
from dynaforge.models.latent_stack import Corrector, conditioned_rollout
from dynaforge.models.loading import model_from_checkpoint
from dynaforge.runs import check_same_run, load_checkpoint, run_folder
from dynaforge.store import DatasetFolder
from dynaforge.store.layout import fields_from_disk
from dynaforge.train.engine import Engine, TrainSummary
from dynaforge.train.losses import distillation_loss, flow_matching_loss, log_spectrum_loss, mse_loss
from dynaforge.train.task import StepLoss, Task
from dynaforge.train.window import WindowTask

log = logging.getLogger(__name__)

STATUS_FILE = "stages.json"
RESIDUAL_SCALE_WINDOWS = 1024
"""Training windows the residual's standard deviation is measured on."""


def collate(dataset: Dataset, indices: list[int], device: torch.device) -> tuple[Tensor, ...]:
    """The items at `indices`, stacked field by field, on `device`."""
    items = [dataset[i] for i in indices]
    return tuple(torch.stack([item[k] for item in items]).to(device) for k in range(len(items[0])))


def conditions_of(batch: tuple[Tensor, ...]) -> Conditions:
    return Conditions(dt=batch[3], params=batch[2])


def validation_noise(shape: tuple[int, ...], seed: int, device: torch.device) -> Tensor:
    """The same Gaussian draw at every validation (so epochs are compared on equal terms)."""
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(shape, generator=generator, dtype=torch.float32).to(device)


# ---- the tasks the shared training loop runs ---------------------------------------------------------


class StageTask(WindowTask):
    """A stage of the stack: windows of the stage's own data (conditions included), its loss and metric.
    Stages train eagerly (torch.compile checks the plain windows rollout, not a stage's loss)."""

    capturable = False

    def __init__(self, config: Config, data: StageData) -> None:
        super().__init__(config, data.root)
        self.data = data

    def compiled(self, model: nn.Module) -> nn.Module | None:
        log.info("torch.compile is off for the stack's stages")
        return None

    def checkpoint_extras(self) -> dict[str, Any]:
        return {**super().checkpoint_extras(), **self.data.extras()}


class OperatorTask(StageTask):
    """Stage `operator` (see the module docstring)."""

    def __init__(self, config: Config, data: StageData) -> None:
        super().__init__(config, data)
        self.stage = config.stages.operator
        history, horizon = config.data.history, config.data.horizon
        calls = min(self.stage.val_rollout, data.max_targets(history) // horizon)
        if calls < self.stage.val_rollout:
            log.warning("validation rollouts cut to %d calls: the trajectories end there", calls)
        val = data.windows("val", history, horizon * calls)
        self.val, self.calls = val, calls
        self.val_indices = evenly_spaced(len(val), config.stages.val_windows)

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset:
        targets = self.config.data.horizon * self.stage.rollout_steps
        return self.data.windows(split, self.config.data.history, targets)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        inputs, targets = batch[0], batch[1]
        predicted = conditioned_rollout(model, inputs, conditions_of(batch), self.stage.rollout_steps)
        horizon = self.config.data.horizon
        loss = mse_loss(predicted[:, :horizon], targets[:, :horizon])
        if self.stage.rollout_steps > 1 and self.stage.rollout_weight > 0:
            loss = loss + self.stage.rollout_weight * mse_loss(predicted[:, horizon:], targets[:, horizon:])
        if self.stage.spectral_weight > 0:
            loss = loss + self.stage.spectral_weight * log_spectrum_loss(predicted, targets)
        return StepLoss(loss, loss)

    def validate(self, model: nn.Module) -> float:
        """Mean nRMSE (normalised units) of `val_rollout`-call rollouts from evenly spaced val windows."""
        device = next(model.parameters()).device
        errors = []
        for lo in range(0, len(self.val_indices), self.config.data.batch_size):
            batch = collate(self.val, self.val_indices[lo : lo + self.config.data.batch_size], device)
            predicted = conditioned_rollout(model, batch[0], conditions_of(batch), self.calls)
            errors.append(nrmse_per_sample(predicted.float(), batch[1]).mean(dim=(1, 2)))
        return float(torch.cat(errors).mean())


class RolloutResidual(NamedTuple):
    """A corrector's example: the operator's k-step prediction, the frame before it, the true frame."""

    prediction: Tensor
    previous: Tensor
    truth: Tensor

    @property
    def condition(self) -> Tensor:
        """The flow's condition frames (B, 2, C, *space): the prediction and the frame before it."""
        return torch.stack([self.prediction, self.previous], dim=1)


def rollout_residual(operator_model: nn.Module, batch: tuple[Tensor, ...], interval: int) -> RolloutResidual:
    """The operator rolled `interval` calls from a window's true input frames (no gradient), with the true
    frame `interval` steps on (the window needs that many targets); the residual is truth - prediction."""
    inputs, targets = batch[0], batch[1]
    if targets.shape[1] < interval:
        raise ConfigError(
            f"windows carry {targets.shape[1]} target frames; interval {interval} needs that many"
        )
    with torch.no_grad():
        predicted = conditioned_rollout(operator_model, inputs, conditions_of(batch), interval)
    previous = predicted[:, -2] if interval > 1 else inputs[:, -1]
    return RolloutResidual(predicted[:, -1], previous, targets[:, interval - 1])


class CorrectorTask(StageTask):
    """Stage `diffusion_residual`: flow matching of (truth - k-step prediction) / scale (see
    `rollout_residual`). With `teacher`, stage `consistency_distill`: the student's few-step sample regresses
    the teacher's S-step sample of the same noise."""

    def __init__(
        self,
        config: Config,
        data: StageData,
        operator: nn.Module,
        sampler_steps: int,
        sampler: str,
        teacher: Corrector | None = None,
        interval: int = 1,
        temperature: float = 1.0,
        spectral_weight: float = 0.0,
    ) -> None:
        super().__init__(config, data)
        self.operator, self.teacher = operator, teacher
        self.spectral_weight = spectral_weight
        self.sampler_steps, self.sampler, self.interval = sampler_steps, sampler, interval
        self.temperature = temperature
        self.val = data.windows("val", config.data.history, interval)
        self.val_indices = evenly_spaced(len(self.val), config.stages.val_windows)

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset:
        return self.data.windows(split, self.config.data.history, self.interval)

    def example(self, batch: tuple[Tensor, ...]) -> RolloutResidual:
        return rollout_residual(self.operator, batch, self.interval)

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        example = self.example(batch)
        prediction, condition = example.prediction, example.condition
        params = batch[2]
        if self.teacher is None:
            residual = (example.truth - prediction) / model_scale(model)
            loss = flow_matching_loss(model, residual, condition, params)
            return StepLoss(loss, loss)
        noise = self.temperature * torch.randn_like(prediction)
        target = distillation_target(self.teacher, noise, condition, params)
        student = integrate_flow(flow_velocity(model, condition, params), noise, self.sampler_steps, "euler")
        loss = distillation_loss(student, target, self.spectral_weight)
        return StepLoss(loss, loss)

    def validate(self, model: nn.Module) -> float:
        """Energy score of prediction + sampled residual against the truth (normalised units)."""
        device = next(model.parameters()).device
        samples = self.config.stages.diffusion_residual.val_samples
        corrector = Corrector(model, self.sampler_steps, self.sampler, temperature=self.temperature)
        scores = []
        for lo in range(0, len(self.val_indices), self.config.data.batch_size):
            indices = self.val_indices[lo : lo + self.config.data.batch_size]
            batch = collate(self.val, indices, device)
            example = self.example(batch)
            prediction = example.prediction
            draws = []
            for m in range(samples):
                noise = validation_noise(prediction.shape, self.config.stages.seed + 7919 * m + lo, device)
                draws.append(prediction + corrector.residual(prediction, example.previous, batch[2], noise))
            scores.append(energy_score(torch.stack(draws), example.truth))
        return float(torch.cat(scores).mean())

    def checkpoint_extras(self) -> dict[str, Any]:
        return {
            **super().checkpoint_extras(),
            "sampler_steps": self.sampler_steps,
            "sampler": self.sampler,
            "interval": self.interval,
            "temperature": self.temperature,
        }


def model_scale(model: nn.Module) -> float:
    return float(getattr(model, "module", model).config.scale)


def distillation_target(teacher: Corrector, noise: Tensor, condition: Tensor, params: Tensor) -> Tensor:
    """What the teacher's S-step sampler makes of `noise` (in the flow's unit-variance coordinates): the
    student's regression target for the same noise."""
    with torch.no_grad():
        velocity = flow_velocity(teacher.model, condition, params)
        return integrate_flow(velocity, noise, teacher.steps, teacher.method)  # type: ignore[arg-type]


class SteadyPriorTask(StageTask):
    """Stage `steady_prior` (see the module docstring)."""

    def __init__(self, config: Config, data: StageData) -> None:
        super().__init__(config, data)
        self.stage = config.stages.steady_prior
        self.val = self.dataset(data.folder, "val")
        self.val_indices = evenly_spaced(len(self.val), config.stages.val_windows)

    def dataset(self, folder: DatasetFolder, split: str) -> Dataset:
        arrays = self.data.split(split)
        params = self.data.parameters.normalize(arrays.params)
        return LongTimeStates(
            fields_from_disk(arrays.fields),
            self.data.normalizer,
            params,
            self.stage.last_frames,
            self.data.dt,
        )

    def loss(self, model: nn.Module, batch: tuple[Tensor, ...]) -> StepLoss:
        state = batch[1][:, 0]
        empty = state.new_zeros((state.shape[0], 0, *state.shape[1:]))
        loss = flow_matching_loss(model, state / model_scale(model), empty, batch[2])  # no condition frames
        return StepLoss(loss, loss)

    def validate(self, model: nn.Module) -> float:
        """Mean |log10 E_generated(k) - log10 E_true(k)| of the mean spectra of generated and true val
        states, over the energetic shells k >= 1 (`dynaforge.evaluate.stack_report.spectrum_distance`: the
        dissipation range's near-empty shells, whose logarithms would dominate, are left out)."""
        device = next(model.parameters()).device
        batch = collate(self.val, self.val_indices, device)
        truth = batch[1][:, 0]
        noise = validation_noise(tuple(truth.shape), self.config.stages.seed, device)
        empty = truth.new_zeros((truth.shape[0], 0, *truth.shape[1:]))
        generated = sample(model, noise, empty, batch[2], self.stage.sampler_steps)
        e_gen = energy_spectrum(generated[:, None].float()).mean(dim=(0, 1, 2))
        e_true = energy_spectrum(truth[:, None].float()).mean(dim=(0, 1, 2))
        return spectrum_distance(e_gen, e_true)

    def checkpoint_extras(self) -> dict[str, Any]:
        return {**super().checkpoint_extras(), "sampler_steps": self.stage.sampler_steps, "sampler": "euler"}


# ---- the stages --------------------------------------------------------------------------------------


@dataclass
class StageContext:
    """What every stage is given: the run's config, the dataset folder, the stack's root folder."""

    config: Config
    data_root: Path
    root: Path
    progress: bool | None = None
    _data: StageData | None = None

    def data(self) -> StageData:
        if self._data is None:
            self._data = StageData(self.data_root, self.config.data.stride)
        return self._data

    def folder(self, stage: str) -> Path:
        return self.root / stage

    def best(self, stage: str) -> Path:
        path = run_folder(self.folder(stage)).best
        if not path.exists():
            raise RunError(f"stage {stage} has no best checkpoint at {path}; run it first (stage={stage})")
        return path

    def resolved(self, stage: str, build: Callable[[], Config]) -> Config:
        """The stage's config as it was first resolved (its folder's config.yaml), or a fresh one: data
        dependent fields (dt, residual scale) stay exactly as the interrupted run had them."""
        saved = run_folder(self.folder(stage)).config
        return load_config(saved) if saved.exists() else build()


def stage_train(base: Config, epochs: int, lr: float, rollout_steps: int = 1) -> TrainConfig:
    return dataclasses.replace(base.train, epochs=epochs, lr=lr, rollout_steps=rollout_steps)


def fit(
    context: StageContext, stage: str, config: Config, task: Task, start: dict[str, Tensor] | None = None
) -> TrainSummary:
    """Train `task` with the shared loop into RUN/<stage>/, resuming its last checkpoint if there is one;
    `start`: initial weights of a fresh (not resumed) run."""
    engine = Engine(config, task, context.folder(stage), progress=context.progress, resume=True, start=start)
    return engine.fit()


def frozen(model: nn.Module) -> nn.Module:
    model.eval()
    for parameter in model.parameters():
        parameter.requires_grad_(False)
    return model


def operator(context: StageContext) -> TrainSummary:
    data = context.data()
    base = context.config
    stage = base.stages.operator

    def build() -> Config:
        model = base.model
        if isinstance(model, LatentConfig):
            model = dataclasses.replace(model, parameters=data.n_parameters, dt=data.dt)
        train = stage_train(base, stage.epochs, stage.lr, stage.rollout_steps)
        return dataclasses.replace(base, model=model, train=train)

    config = context.resolved("operator", build)
    return fit(context, "operator", config, OperatorTask(config, data))


def load_operator(context: StageContext, device: str | torch.device = "cpu") -> nn.Module:
    return frozen(model_from_checkpoint(load_checkpoint(context.best("operator"), device)))


def diffusion_residual(context: StageContext) -> TrainSummary:
    data = context.data()
    base = context.config
    stage = base.stages.diffusion_residual
    operator_model = load_operator(context)

    def build() -> Config:
        scale = residual_scale(operator_model, data, base.data.history, stage.interval)
        model = dataclasses.replace(
            stage.model, condition_frames=2, parameters=data.n_parameters, scale=scale
        )
        return dataclasses.replace(base, model=model, train=stage_train(base, stage.epochs, stage.lr))

    config = context.resolved("diffusion_residual", build)
    task = CorrectorTask(
        config, data, operator_model, stage.sampler_steps, stage.sampler, interval=stage.interval
    )
    return fit(context, "diffusion_residual", config, task)


def residual_scale(operator_model: nn.Module, data: StageData, history: int, interval: int = 1) -> float:
    """Standard deviation of truth - `interval`-step prediction over (up to) RESIDUAL_SCALE_WINDOWS train
    windows."""
    windows = data.windows("train", history, interval)
    indices = evenly_spaced(len(windows), RESIDUAL_SCALE_WINDOWS)
    residuals = []
    with torch.inference_mode():
        for lo in range(0, len(indices), 256):
            batch = collate(windows, indices[lo : lo + 256], torch.device("cpu"))
            example = rollout_residual(operator_model, batch, interval)
            residuals.append(example.truth - example.prediction)
    return max(float(torch.cat(residuals).std()), 1e-6)


def consistency_distill(context: StageContext) -> TrainSummary:
    data = context.data()
    base = context.config
    stage = base.stages.consistency_distill
    teacher_state = load_checkpoint(context.best("diffusion_residual"))
    teacher = Corrector(
        frozen(model_from_checkpoint(teacher_state)),
        int(teacher_state["sampler_steps"]),
        str(teacher_state["sampler"]),
    )
    teacher_config = load_config(context.folder("diffusion_residual") / "config.yaml")

    def build() -> Config:
        return dataclasses.replace(
            base, model=teacher_config.model, train=stage_train(base, stage.epochs, stage.lr)
        )

    config = context.resolved("consistency_distill", build)
    task = CorrectorTask(
        config,
        data,
        load_operator(context),
        stage.student_steps,
        "euler",
        teacher=teacher,
        interval=int(teacher_state.get("interval", 1)),
        temperature=stage.temperature,
        spectral_weight=stage.spectral_weight,
    )
    return fit(context, "consistency_distill", config, task, start=teacher_state["model"])


def steady_prior(context: StageContext) -> TrainSummary:
    data = context.data()
    base = context.config
    stage = base.stages.steady_prior

    def build() -> Config:
        model = dataclasses.replace(stage.model, condition_frames=0, parameters=data.n_parameters, scale=1.0)
        return dataclasses.replace(base, model=model, train=stage_train(base, stage.epochs, stage.lr))

    config = context.resolved("steady_prior", build)
    return fit(context, "steady_prior", config, SteadyPriorTask(config, data))


STAGES: dict[str, Callable[[StageContext], TrainSummary]] = {
    "operator": operator,
    "diffusion_residual": diffusion_residual,
    "consistency_distill": consistency_distill,
    "steady_prior": steady_prior,
}
"""Every stage, by name, in order."""

DEFAULT_STAGES = ("operator", "diffusion_residual", "consistency_distill")
"""The stages `stage=all` runs; `steady_prior` is opt-in (`stage=steady_prior`)."""


# ---- running them in order -------------------------------------------------------------------------------


def read_status(root: Path) -> dict[str, Any]:
    path = root / STATUS_FILE
    return json.loads(path.read_text()) if path.exists() else {"stages": {}}


def write_status(root: Path, status: dict[str, Any]) -> None:
    atomic_write_json(root / STATUS_FILE, status)


def claim_stack_folder(root: Path, config: Config) -> None:
    """A stack folder holds one config; refuse to continue it with another."""
    saved = root / "config.yaml"
    if not saved.exists():
        save_config(config, saved)
        return
    check_same_run(
        config_to_dict(load_config(saved)),
        config_to_dict(config),
        f"stack folder {root}",
        f"Rerun with its own config ({saved}) or another --out folder.",
    )


def run_stages(
    config: Config,
    data: str | Path,
    out: str | Path,
    stage: str = "all",
    progress: bool | None = None,
    stages: dict[str, Callable[[StageContext], TrainSummary]] | None = None,
) -> dict[str, Any]:
    """Run `stage` (a name of `stages`, default `STAGES`, or `all`: the DEFAULT_STAGES in order, or every
    one of `stages` when given) into stack folder `out`; returns the stages.json record. Done stages are
    skipped; a running one resumes."""
    table = STAGES if stages is None else stages
    if stage != "all" and stage not in table:
        raise ConfigError(f"stage={stage!r} is not valid; choose all or one of: {', '.join(table)}")
    if config.data.source == "stream":
        raise ConfigError(
            "the staged stack trains on a dataset folder: set data.source=store and pass --data"
        )
    if config.data.horizon != 1:
        raise ConfigError(
            f"data.horizon={config.data.horizon}: the staged stack predicts and corrects one frame per operator "
            "call (the corrector's residual, the k-step rollouts and the predictor-corrector loop are frame by "
            "frame); set data.horizon=1 (override `data.horizon=1`; k-step behaviour comes from "
            "stages.operator.rollout_steps and stages.diffusion_residual.interval)"
        )
    root = Path(out)
    root.mkdir(parents=True, exist_ok=True)
    claim_stack_folder(root, config)
    status = read_status(root)
    names = (list(DEFAULT_STAGES) if stages is None else list(table)) if stage == "all" else [stage]
    context = StageContext(config, Path(data).resolve(), root, progress)
    for name in names:
        record = status["stages"].get(name, {})
        if record.get("status") == "done":
            log.info("stage %s is done (best validation metric %.4g); skipped", name, record["best_val"])
            continue
        status["stages"][name] = {
            **record,
            "status": "running",
            "started": record.get("started", time.time()),
        }
        write_status(root, status)
        log.info("stage %s: %s", name, "resuming" if record else "starting")
        summary = table[name](context)
        status["stages"][name] = {
            **status["stages"][name],
            "status": "done",
            "best_val": summary.best_val_loss,
            "last_val": summary.last_val_loss,
            "steps": summary.steps,
            "seconds": summary.seconds,
            "checkpoint": str(Path(name) / "checkpoints" / "best.pt"),
        }
        write_status(root, status)
    return status
