"""Per-channel field statistics, accumulated per shard and merged (Chan et al.'s parallel variance).

Each shard record carries the count, mean, M2 (sum of squared deviations), min and max of every channel
over all samples, frames and grid points of that shard; the manifest merges the train shards into the
normalisation statistics. Accumulated in float64.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np


@dataclass
class ChannelMoments:
    count: int
    mean: list[float]
    m2: list[float]
    min: list[float]
    max: list[float]

    @classmethod
    def of(cls, fields: np.ndarray) -> ChannelMoments:
        """Moments of a channels-last array (..., C)."""
        flat = fields.reshape(-1, fields.shape[-1]).astype(np.float64)
        mean = flat.mean(axis=0)
        return cls(
            count=int(flat.shape[0]),
            mean=mean.tolist(),
            m2=((flat - mean) ** 2).sum(axis=0).tolist(),
            min=flat.min(axis=0).tolist(),
            max=flat.max(axis=0).tolist(),
        )

    def merge(self, other: ChannelMoments) -> ChannelMoments:
        if self.count == 0:
            return other
        if other.count == 0:
            return self
        n_a, n_b = self.count, other.count
        n = n_a + n_b
        mean_a, mean_b = np.asarray(self.mean), np.asarray(other.mean)
        delta = mean_b - mean_a
        mean = mean_a + delta * (n_b / n)
        m2 = np.asarray(self.m2) + np.asarray(other.m2) + delta**2 * (n_a * n_b / n)
        return ChannelMoments(
            count=n,
            mean=mean.tolist(),
            m2=m2.tolist(),
            min=np.minimum(self.min, other.min).tolist(),
            max=np.maximum(self.max, other.max).tolist(),
        )

    def summary(self) -> dict[str, list[float] | int]:
        """Normalisation statistics: mean and (population) standard deviation per channel."""
        std = np.sqrt(np.asarray(self.m2) / max(self.count, 1))
        return {"count": self.count, "mean": self.mean, "std": std.tolist(), "min": self.min, "max": self.max}

    def to_dict(self) -> dict:
        return asdict(self)
