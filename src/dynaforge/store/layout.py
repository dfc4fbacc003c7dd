"""The one conversion between the store's on-disk layout and everyone else's.

On disk `fields` are channels last, (N, T, *space, C) float32 (docs/format.md); everywhere else in dynaforge
a trajectory is channels first, (N, T, C, *space) float32, on the device that made it (`SampleRows.fields`,
the data sets, the models). The store writes through `fields_to_disk` and reads through `fields_from_disk`;
nothing outside the store changes a trajectory's layout.
"""

from __future__ import annotations

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor


def channels_first_to_last(fields: Tensor, lead: int = 2) -> Tensor:
    """(*lead, C, *space) -> (*lead, *space, C), the stored layout; `lead` leading axes (2: samples and
    time; 1: samples alone, as the models' channels-last stages use it). A view, no copy; written with
    positive dims, as the TorchScript ONNX exporter turns negative ones into an invalid Transpose."""
    return fields.permute(*range(lead), *range(lead + 1, fields.ndim), lead)


def channels_last_to_first(fields: Tensor, lead: int = 2) -> Tensor:
    """(*lead, *space, C) -> (*lead, C, *space), the layout of everything outside the store. A view."""
    last = fields.ndim - 1
    return fields.permute(*range(lead), last, *range(lead, last))


def fields_to_disk(fields: Float[Tensor, "samples time channels *space"]) -> np.ndarray:
    """A system's trajectories (N, T, C, *space), on any device, as the store writes them: a C-ordered
    float32 numpy array (N, T, *space, C) on the host. The values are the same bytes."""
    host = fields.detach().to(device="cpu", dtype=torch.float32)  # one transfer, of contiguous memory
    return np.ascontiguousarray(channels_first_to_last(host).numpy())


def fields_from_disk(fields: np.ndarray, lead: int = 2) -> Tensor:
    """Stored fields (*lead, *space, C) as the float32 tensor (*lead, C, *space) on the host, the same bytes
    (`lead` as in `channels_first_to_last`: 2 for (N, T, ...), 1 for one trajectory (T, ...))."""
    values = torch.from_numpy(np.asarray(fields, dtype=np.float32))
    return channels_last_to_first(values, lead).contiguous()
