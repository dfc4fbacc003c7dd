"""Neural surrogates, one per file, and their registry."""

from dynaforge.models.base import (
    ModelInput,
    ModelOutput,
    ModelShape,
    autoregressive_rollout,
)
from dynaforge.models.fno import FNO
from dynaforge.models.loading import LoadedModel, load_surrogate, model_from_checkpoint
from dynaforge.models.registry import MODELS, build_model
from dynaforge.models.spectral import SpectralConv
from dynaforge.models.unet import UNet

__all__ = [
    "FNO",
    "MODELS",
    "LoadedModel",
    "ModelInput",
    "ModelOutput",
    "ModelShape",
    "SpectralConv",
    "UNet",
    "autoregressive_rollout",
    "build_model",
    "load_surrogate",
    "model_from_checkpoint",
]
