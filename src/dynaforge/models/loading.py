"""Trained models from checkpoints: one `model_from_checkpoint`, dispatching on the checkpoint's `kind`.

The engine writes `kind` from the task that trained the model (`Task.kind`, the constants below):
- absent (`SURROGATE_KIND`): a surrogate of the registry (`MODELS`), rebuilt from the saved config's `model`
  section and `model_shape`; the latent stack's stages are surrogates too.
- `nbody_step_controller` (`CONTROLLER_KIND`): the step controller's network, from `model_config`, checked
  against the features this dynaforge computes.
- `two_phase` (`TWO_PHASE_KIND`): an energy model, from the saved config's `twophase` section.
- `refiner` (`REFINER_KIND`): PDE-Refiner around a surrogate of the registry (`dynaforge.models.refiner`).

Every loader here reads through `dynaforge.runs.load_checkpoint` (weights only, version checked, wrapper
prefixes stripped), so checkpoints written by earlier versions of the same format load as they did.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch import nn

from dynaforge.config import (
    Config,
    ConfigError,
    ModelConfig,
    StepControlConfig,
    config_differences,
    config_from_dict,
    config_to_dict,
)
from dynaforge.data.normalize import Normalizer
from dynaforge.errors import DynaforgeError
from dynaforge.models.base import ModelShape, shape_from_dict
from dynaforge.models.hopfield import build_energy_model
from dynaforge.models.refiner import REFINER_KIND, refiner_from_checkpoint
from dynaforge.models.registry import build_model
from dynaforge.models.step_controller import LearnedStep, build_step_controller_net
from dynaforge.runs import load_checkpoint, run_folder
from dynaforge.systems.nbody.control import FEATURE_NAMES, StepController, build_controller

SURROGATE_KIND = None
CONTROLLER_KIND = "nbody_step_controller"
TWO_PHASE_KIND = "two_phase"


def surrogate(checkpoint: Mapping[str, Any]) -> nn.Module:
    config = config_from_dict(checkpoint["config"])
    return build_model(config.model, shape_from_dict(checkpoint["model_shape"]))


def controller_net(checkpoint: Mapping[str, Any]) -> nn.Module:
    if tuple(checkpoint.get("feature_names", ())) != FEATURE_NAMES:
        raise ConfigError(
            f"this controller was trained on features {checkpoint.get('feature_names')}, this dynaforge "
            f"computes {list(FEATURE_NAMES)}; retrain it with `dynaforge nbody train`"
        )
    return build_step_controller_net(checkpoint["model_config"])


def energy_model(checkpoint: Mapping[str, Any]) -> nn.Module:
    config = config_from_dict(checkpoint["config"]).twophase
    return build_energy_model(config.model, getattr(torch, config.dtype))


BUILDERS: dict[str | None, Callable[[Mapping[str, Any]], nn.Module]] = {
    SURROGATE_KIND: surrogate,
    CONTROLLER_KIND: controller_net,
    TWO_PHASE_KIND: energy_model,
    REFINER_KIND: refiner_from_checkpoint,
}
"""Checkpoint kind -> the untrained model its checkpoint describes."""


def model_from_checkpoint(checkpoint: Mapping[str, Any]) -> nn.Module:
    """The trained model of a loaded checkpoint, rebuilt from the checkpoint's own plain data (nothing of
    the training run is needed) by the builder of its `kind`, with the weights to evaluate loaded."""
    kind = checkpoint.get("kind")
    if kind not in BUILDERS:
        known = ", ".join(repr(k) for k in BUILDERS)
        raise ConfigError(f"checkpoint of unknown kind {kind!r}; this dynaforge loads {known}")
    model = BUILDERS[kind](checkpoint)
    model.load_state_dict(checkpoint["model"])
    return model


def checkpoint_path(path: str | Path, order: tuple[str, ...] = ("best", "last")) -> Path:
    """A checkpoint file as given, or the first of `order` that a run folder holds."""
    path = Path(path)
    if path.is_dir():
        run = run_folder(path)
        found = [run.checkpoint(which) for which in order if run.checkpoint(which).exists()]
        if not found:
            names = " or ".join(f"checkpoints/{which}.pt" for which in order)
            raise FileNotFoundError(f"{path} holds no {names}; train a run into it first")
        return found[0]
    if not path.exists():
        raise FileNotFoundError(f"checkpoint {path} not found")
    return path


def load_model(
    path: str | Path,
    kind: str | None,
    device: str | torch.device = "cpu",
    order: tuple[str, ...] = ("best", "last"),
) -> nn.Module:
    """The trained model of kind `kind` in a checkpoint file or run folder (`checkpoint_path`), in eval
    mode on `device`; a clear error when the file holds another kind."""
    file = checkpoint_path(path, order)
    state = load_checkpoint(file, device)
    if state.get("kind") != kind:
        raise ConfigError(
            f"{file} holds a model of kind {state.get('kind')!r}, not {kind!r} (see dynaforge.models.loading)"
        )
    return model_from_checkpoint(state).to(device).eval()


class LoadedModel(NamedTuple):
    """A trained surrogate with what using it takes: its shape, the normaliser of its training data and the
    config it was trained with (`load_surrogate`)."""

    model: nn.Module
    """In eval mode, on the device it was loaded to."""
    shape: ModelShape
    normalizer: Normalizer
    config: Config
    checkpoint: Mapping[str, Any]
    """The checkpoint's plain data, for what else a caller reads (`data_identity`, `dt`, ...)."""


def load_surrogate(
    source: str | Path | Mapping[str, Any],
    device: str | torch.device = "cpu",
    order: tuple[str, ...] = ("best", "last"),
) -> LoadedModel:
    """The surrogate (a model of the registry, the latent stack's stages included) of a checkpoint file, a
    run folder (the first of `order` it holds, `checkpoint_path`) or a checkpoint already loaded, with its
    shape, normaliser and config, in eval mode on `device`. The one place a surrogate is loaded: the API's
    `load_run`, evaluation, export and the latent stack all go through it."""
    if isinstance(source, Mapping):
        state, where = source, "this checkpoint"
    else:
        file = checkpoint_path(source, order) if Path(source).is_dir() else Path(source)
        state, where = load_checkpoint(file, device), str(file)
    if state.get("kind") is not SURROGATE_KIND:
        raise ConfigError(
            f"{where} holds a model of kind {state['kind']!r}, not a surrogate; load it with "
            "dynaforge.models.loading.load_model"
        )
    return LoadedModel(
        model=model_from_checkpoint(state).to(device).eval(),
        shape=shape_from_dict(state["model_shape"]),
        normalizer=Normalizer.from_stats(state["normalization"]),
        config=config_from_dict(state["config"]),
        checkpoint=state,
    )


def pretrained_surrogate(run: str | Path) -> LoadedModel:
    """The surrogate of run folder (or checkpoint file) `run` (`load_surrogate`: its best checkpoint, else
    its last) to fine-tune from; a `ConfigError` naming `--from` when it holds none."""
    try:
        return load_surrogate(run)
    except FileNotFoundError as error:
        raise ConfigError(f"--from {run}: {error} (a run folder of `dynaforge train`)") from None
    except DynaforgeError as error:
        raise ConfigError(f"--from {run}: {error}") from None


def pretrained_weights(run: str | Path, model: ModelConfig, shape: ModelShape) -> dict[str, torch.Tensor]:
    """The weights of the surrogate in run folder (or checkpoint file) `run` (`load_surrogate`: its best
    checkpoint, else its last), for a model built from `model` to read data of `shape` (`dynaforge train
    --from RUN`). A `ConfigError` naming `--from` when `run` holds no surrogate, or naming every difference
    when the pretrained model's architecture or shape is not the one asked for (the spatial resolution may
    differ: the registry's models read any grid of their number of axes)."""
    where = f"--from {run}"
    loaded = pretrained_surrogate(run)
    differences = [
        f"model.{line} (pretrained != this config)"
        for line in config_differences(config_to_dict(loaded.config.model), config_to_dict(model))
    ]
    differences += [
        f"{name}: {theirs} (pretrained) != {ours} (this config's data)"
        for name, theirs, ours in zip(ModelShape._fields, loaded.shape, shape, strict=True)
        if theirs != ours
    ]
    if differences:
        raise ConfigError(
            f"{where}: the pretrained model cannot read this config's data: {'; '.join(differences)}; "
            f"fine-tune with the pretrained run's model section ({Path(run) / 'config.yaml'}), the same "
            "data.history and data.horizon, and a system of as many channels and spatial axes"
        )
    return {name: tensor.detach().clone() for name, tensor in loaded.model.state_dict().items()}


def load_learned_controller(path: str | Path, scale: float = 1.0, device: str = "cpu") -> LearnedStep:
    """A trained controller from a run folder of `dynaforge nbody train` (best.pt, else last.pt) or a
    checkpoint file."""
    net = load_model(path, CONTROLLER_KIND, device)
    return LearnedStep(net, scale)  # type: ignore[arg-type]  # the controller kind builds a StepControllerNet


def controller_for(config: StepControlConfig, dt: float, device: str = "cpu") -> StepController:
    """The controller `config` asks for: fixed or classical (`build_controller`), or a learned one loaded
    from `config.model` (a run folder of `dynaforge nbody train`, or a checkpoint file)."""
    if config.kind != "learned":
        return build_controller(config, dt, device)
    if config.model is None:
        raise ConfigError(
            "system.control.kind=learned needs system.control.model=RUN (a run folder of `dynaforge nbody train`)"
        )
    return load_learned_controller(config.model, config.scale, device)


def energy_model_from_checkpoint(path: str | Path, device: str = "cpu") -> nn.Module:
    """The trained energy model of a two-phase checkpoint file or run folder (its last.pt)."""
    return load_model(path, TWO_PHASE_KIND, device, order=("last",))
