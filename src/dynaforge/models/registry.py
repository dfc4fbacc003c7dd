"""The model registry (an explicit dict) and rebuilding a model from a checkpoint's plain data."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from torch import nn

from dynaforge.config import MODEL_CONFIGS, ModelConfig, config_from_dict
from dynaforge.models.base import ModelShape
from dynaforge.models.flow import FlowNet
from dynaforge.models.fno import FNO
from dynaforge.models.latent import LatentOperator
from dynaforge.models.unet import UNet

MODELS: dict[str, type[nn.Module]] = {
    "fno": FNO,
    "unet": UNet,
    "latent": LatentOperator,
    "flow": FlowNet,
}


def build_model(config: ModelConfig, shape: ModelShape) -> nn.Module:
    """A freshly initialised model named by `config.name`, for data of `shape`."""
    if config.name not in MODELS:
        raise ValueError(f"unknown model {config.name!r}; valid: {', '.join(sorted(MODELS))}")
    expected = MODEL_CONFIGS[config.name]
    if not isinstance(config, expected):
        raise TypeError(f"model {config.name!r} needs a {expected.__name__}, got {type(config).__name__}")
    return MODELS[config.name](config, shape)


def model_from_checkpoint(checkpoint: Mapping[str, Any]) -> nn.Module:
    """Rebuild the model of a loaded checkpoint from its saved config and shape, and load its weights.

    Needs nothing of the training run but the checkpoint's plain data (`config`, `model_shape`, `model`).
    """
    config = config_from_dict(checkpoint["config"])
    model = build_model(config.model, ModelShape(**checkpoint["model_shape"]))
    model.load_state_dict(checkpoint["model"])
    return model
