"""Per-channel normalisation with the train split's statistics, and its inverse.

Fields are channels-first, (..., channels, *space): `channel_axis` counts the spatial axes after the
channel axis. Normalised = (physical - mean) / std per channel, computed in float32 or wider whatever the
fields' dtype; a channel whose std is (almost) zero is only
shifted, so that a constant field does not divide by zero.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import Tensor

from dynaforge.errors import DatasetError

MIN_STD = 1e-8
"""A channel with a smaller standard deviation is treated as constant (divided by one, not by ~0)."""


class Normalizer:
    """Maps physical fields to normalised ones and back; the statistics are plain lists, one per channel."""

    def __init__(self, mean: Sequence[float], std: Sequence[float]) -> None:
        if len(mean) != len(std) or not mean:
            raise DatasetError(
                f"normalisation statistics need one mean and one std per channel, got {list(mean)} and "
                f"{list(std)} (a damaged stats.json of a dataset, or a checkpoint's normaliser)"
            )
        self.mean = [float(m) for m in mean]
        self.std = [float(s) if s > MIN_STD else 1.0 for s in std]

    @classmethod
    def from_stats(cls, stats: Mapping[str, Any] | None) -> Normalizer:
        """From a dataset manifest's `stats` (or a checkpoint's `normalization`): keys `mean` and `std`."""
        if not stats or "mean" not in stats or "std" not in stats:
            raise DatasetError(
                "the dataset has no train statistics (manifest 'stats' is empty): it needs a train split; "
                "regenerate it with dataset.n_train > 0"
            )
        return cls(stats["mean"], stats["std"])

    @classmethod
    def identity(cls, channels: int) -> Normalizer:
        """Leaves fields unchanged (mean 0, std 1): windows in physical units."""
        return cls([0.0] * channels, [1.0] * channels)

    @property
    def channels(self) -> int:
        return len(self.mean)

    def to_dict(self) -> dict[str, list[float]]:
        """Plain data for checkpoints and JSON."""
        return {"mean": list(self.mean), "std": list(self.std)}

    def physical_to_normalized(self, fields: Tensor, spatial_dims: int) -> Tensor:
        """(..., C, *space) physical -> normalised, same shape and dtype."""
        mean, std = self._broadcast(fields, spatial_dims)
        return ((fields.to(mean.dtype) - mean) / std).to(fields.dtype)

    def normalized_to_physical(self, fields: Tensor, spatial_dims: int) -> Tensor:
        """(..., C, *space) normalised -> physical, same shape and dtype."""
        mean, std = self._broadcast(fields, spatial_dims)
        return (fields.to(mean.dtype) * std + mean).to(fields.dtype)

    def _broadcast(self, fields: Tensor, spatial_dims: int) -> tuple[Tensor, Tensor]:
        axis = fields.ndim - 1 - spatial_dims
        if axis < 0 or fields.shape[axis] != self.channels:
            raise ValueError(
                f"expected {self.channels} channel(s) at axis {axis} of a (..., channels, *space) tensor with "
                f"{spatial_dims} spatial axes, got shape {tuple(fields.shape)}"
            )
        view = (self.channels,) + (1,) * spatial_dims
        # Applied in float32 or wider (half-precision fields are rounded once, at the end).
        wide = torch.promote_types(fields.dtype, torch.float32)
        mean = torch.tensor(self.mean, dtype=wide, device=fields.device).view(view)
        std = torch.tensor(self.std, dtype=wide, device=fields.device).view(view)
        return mean, std
