"""The model registry (an explicit dict) of surrogates; `dynaforge.models.loading` rebuilds trained ones."""

from __future__ import annotations

from dynaforge.config import MODEL_CONFIGS, ModelConfig
from dynaforge.errors import ConfigError
from dynaforge.models.base import GridModel, ModelShape
from dynaforge.models.flow import FlowNet
from dynaforge.models.fno import FNO
from dynaforge.models.latent import LatentOperator
from dynaforge.models.unet import UNet

MODELS: dict[str, type[GridModel]] = {
    "fno": FNO,
    "unet": UNet,
    "latent": LatentOperator,
    "flow": FlowNet,
}


def build_model(config: ModelConfig, shape: ModelShape) -> GridModel:
    """A freshly initialised model named by `config.name`, for data of `shape`."""
    if config.name not in MODELS:
        raise ConfigError(
            f"model.name={config.name!r} is no model of dynaforge; valid: {', '.join(sorted(MODELS))}"
        )
    expected = MODEL_CONFIGS[config.name]
    if not isinstance(config, expected):
        raise TypeError(f"model {config.name!r} needs a {expected.__name__}, got {type(config).__name__}")
    return MODELS[config.name](config, shape)
