"""Per-channel field statistics: per sample, per shard, and merged into the normalisation statistics.

Each shard record carries every sample's per-channel sum, M2 (sum of squared deviations from the sample's
own mean), min and max (`SampleMoments`, float64), and the shard's count, mean, M2, min and max merged from
them; the manifest merges the train split's samples into the normalisation statistics. Samples are merged
in index order with exactly rounded sums (`math.fsum`), so the statistics are the same bytes whatever the
batch size and however the split was cut into shards. Records written before per-sample moments existed
are merged shard by shard (Chan et al.'s parallel variance, `ChannelMoments.merge`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

STATS_RTOL = 1e-9
"""How far the manifest's mean and std may lie from those recomputed from the shard records, relative to the
channel's scale (the larger of |mean| and std). A generated folder recomputes to the same bits; a converted
one merges the same values in other groups (chunks of 64 samples for the manifest, shards for the records),
which moves the last few bits only (measured in docs/format.md, "Checks made by readers"). An edited or
stale value is off by orders of magnitude more."""


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


@dataclass
class SampleMoments:
    """Per-sample, per-channel moments of a block of samples: lists of (samples, channels) values."""

    count: int
    """Values per channel in one sample (frames x grid points)."""
    sum: list[list[float]]
    m2: list[list[float]]
    min: list[list[float]]
    max: list[list[float]]

    @classmethod
    def of(cls, fields: np.ndarray) -> SampleMoments:
        """Moments of each sample of a channels-last array (samples, ..., C), one sample at a time."""
        rows = [sample_moments(sample) for sample in fields]
        count = int(np.prod(fields.shape[1:-1]))
        return cls(count, *([list(row[k]) for row in rows] for k in range(4)))

    @classmethod
    def empty(cls) -> SampleMoments:
        return cls(0, [], [], [], [])

    def extended(self, other: SampleMoments) -> SampleMoments:
        """These samples followed by `other`'s."""
        if not self.sum:
            return other
        if other.sum and other.count != self.count:
            raise ValueError(f"samples of {self.count} and {other.count} values per channel cannot be merged")
        return SampleMoments(
            self.count, self.sum + other.sum, self.m2 + other.m2, self.min + other.min, self.max + other.max
        )

    def merged(self) -> ChannelMoments:
        """The moments of all samples together: exactly rounded sums over the samples (`math.fsum`), so the
        result depends on the samples alone, not on how they were grouped."""
        samples = len(self.sum)
        if samples == 0:
            return ChannelMoments(0, [], [], [], [])
        total = self.count * samples
        channels = len(self.sum[0])
        mean, m2 = [], []
        for c in range(channels):
            sums = [row[c] for row in self.sum]
            channel_mean = math.fsum(sums) / total
            spread = [self.count * (s / self.count - channel_mean) ** 2 for s in sums]
            mean.append(channel_mean)
            m2.append(math.fsum([row[c] for row in self.m2]) + math.fsum(spread))
        return ChannelMoments(
            count=total,
            mean=mean,
            m2=m2,
            min=[min(row[c] for row in self.min) for c in range(channels)],
            max=[max(row[c] for row in self.max) for c in range(channels)],
        )

    def to_dict(self) -> dict:
        return asdict(self)


def sample_moments(sample: np.ndarray) -> tuple[list[float], list[float], list[float], list[float]]:
    """Sum, M2, min and max per channel of one channels-last sample (..., C), in float64.

    Each channel is summed as one contiguous row (numpy's pairwise summation), so the values depend on the
    sample alone.
    """
    channels = np.ascontiguousarray(sample.reshape(-1, sample.shape[-1]).T, dtype=np.float64)  # (C, values)
    sums = channels.sum(axis=1)
    deviations = channels - (sums / channels.shape[1])[:, None]
    m2 = (deviations * deviations).sum(axis=1)
    return sums.tolist(), m2.tolist(), channels.min(axis=1).tolist(), channels.max(axis=1).tolist()


def records_to_statistics(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    """Normalisation statistics of the train split from its shard records, in shard order: merged from the
    samples' own moments in index order (the same bytes however the split was sharded), or shard by shard
    for records without them (older datasets, converted files). None when the train split is empty."""
    train = [record for record in records if record["split"] == "train"]
    if train and all("sample_moments" in record for record in train):
        samples = SampleMoments.empty()
        for record in train:
            samples = samples.extended(SampleMoments(**record["sample_moments"]))
        moments = samples.merged()
    else:
        moments = ChannelMoments(0, [], [], [], [])
        for record in train:
            moments = moments.merge(ChannelMoments(**record["moments"]))
    return moments.summary() if moments.count else None


def statistics_disagreement(stored: dict[str, Any], recomputed: dict[str, Any]) -> str | None:
    """Where the manifest's statistics `stored` disagree with `recomputed` from the records (`stats.KEY[c]
    is A but the records give B`), or None. Count, min and max must be equal (exact in any grouping); mean
    and std within STATS_RTOL of the channel's scale."""
    if stored.get("count") != recomputed["count"]:
        return f"stats.count is {stored.get('count')} but the records give {recomputed['count']}"
    channels = len(recomputed["mean"])
    for key in ("mean", "std", "min", "max"):
        values = stored.get(key)
        if not isinstance(values, list) or len(values) != channels:
            return f"stats.{key} is {values!r}; the records give {channels} channel(s): {recomputed[key]}"
    for c in range(channels):
        scale = max(abs(recomputed["mean"][c]), recomputed["std"][c], np.finfo(np.float64).tiny)
        for key in ("mean", "std", "min", "max"):
            value, expected = stored[key][c], recomputed[key][c]
            tolerance = STATS_RTOL * scale if key in ("mean", "std") else 0.0
            if not isinstance(value, int | float) or not abs(value - expected) <= tolerance:
                return f"stats.{key}[{c}] is {value!r} but the train shards' records give {expected!r}"
    return None
