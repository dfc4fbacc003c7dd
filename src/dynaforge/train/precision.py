"""Mixed precision: fp32, bf16 autocast (CPU and CUDA), fp16 autocast with a gradient scaler (CUDA only).

Under autocast, matrix products and convolutions run in the low-precision dtype; parameters, gradients and
optimiser state stay fp32. FFTs and spectral losses run in fp32 with autocast off (`full_precision`):
CPU FFTs reject half precision and CUDA ones need power-of-two sizes in it. The losses of
`dynaforge.train.losses` compute in fp32 whatever the dtype of the predictions.

fp16 needs the gradient scaler (fp16's narrow range underflows small gradients) and exists for CUDA only:
asking for it on another device is a configuration error that names the alternatives.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch

from dynaforge.config import ConfigError

DTYPES: dict[str, torch.dtype | None] = {"fp32": None, "bf16": torch.bfloat16, "fp16": torch.float16}
"""`train.precision` -> autocast dtype (None: no autocast)."""


class Precision:
    """The autocast context and gradient scaler of one `train.precision` on one device."""

    def __init__(self, name: str, device: torch.device) -> None:
        if name not in DTYPES:
            raise ConfigError(f"train.precision={name!r} is not valid; choose one of: {', '.join(DTYPES)}")
        if name == "fp16" and device.type != "cuda":
            raise ConfigError(
                f"train.precision=fp16 needs a CUDA device (fp16 autocast with a gradient scaler), but training "
                f"runs on {device.type}; use train.precision=bf16 (autocast on CPU too) or fp32"
            )
        if name == "bf16" and device.type == "cuda" and not torch.cuda.is_bf16_supported():
            raise ConfigError("this GPU has no bf16 support; use train.precision=fp16 or fp32")
        self.name, self.device = name, device
        self.dtype = DTYPES[name]
        self.scaler = torch.amp.GradScaler(device.type, enabled=name == "fp16")

    @property
    def scaling(self) -> bool:
        """True when losses are scaled (fp16): gradients must be unscaled before clipping."""
        return self.scaler.is_enabled()

    def autocast(self, cache: bool = True) -> contextlib.AbstractContextManager[None]:
        """The forward pass's autocast region (`cache=False` inside CUDA-graph capture)."""
        if self.dtype is None:
            return contextlib.nullcontext()
        return torch.autocast(self.device.type, dtype=self.dtype, cache_enabled=cache)


@contextlib.contextmanager
def full_precision(device_type: str) -> Iterator[None]:
    """Autocast off: for FFTs and spectral losses, which must run in fp32 (cast their inputs with .float())."""
    with torch.autocast(device_type=device_type, enabled=False):
        yield
