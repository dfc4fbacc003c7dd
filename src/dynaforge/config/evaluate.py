"""The `evaluate` section: rollouts, metrics and the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynaforge.config.base import AT_LEAST_ONE, NON_NEGATIVE, ConfigError, between, check_values, checked


@dataclass
class EvaluateConfig:
    """Autoregressive rollouts on the test split, scored in physical (denormalised) units."""

    rollout_frames: int = checked(20, check=AT_LEAST_ONE)
    """Frames predicted autoregressively from the true initial `history` frames of each test trajectory."""
    start_frame: int = checked(0, check=NON_NEGATIVE)
    """Stored frame at which the rollout's input frames begin."""
    checkpoint: Literal["best", "last"] = "best"
    """Which checkpoint of the run to evaluate."""
    plot_samples: int = checked(3, check=NON_NEGATIVE)
    """Test trajectories drawn as truth / prediction / error space-time images."""
    device: str = "auto"
    """Where to evaluate: `cpu`, `cuda`, `cuda:1` or `auto`."""
    fourier_low: int = checked(4, check=AT_LEAST_ONE)
    """PDEBench's `iLow`: wavenumber shells [0, fourier_low) make the low band of the Fourier-band RMSE."""
    fourier_high: int = checked(12, check=AT_LEAST_ONE)
    """PDEBench's `iHigh`: shells [fourier_low, fourier_high) are the mid band, the rest the high band."""
    correlation_threshold: float = checked(0.95, check=between(0.0, 1.0, open_low=True))
    """The correlation time is the time until the correlation with the truth drops below this."""
    gmean_horizon: int | None = checked(None, check=AT_LEAST_ONE)
    """Predicted frames the geometric mean of the rollout nRMSE covers (APEBench uses 100); null: all."""
    test_samples: int | None = checked(None, check=AT_LEAST_ONE)
    """Test trajectories evaluated: the first this many of the test split, and only their shards are read
    (for test splits too large to hold); null: all of them."""
    worst_samples: int = checked(3, check=NON_NEGATIVE)
    """Test trajectories with the largest rollout nRMSE listed (and drawn) in the report."""

    def __post_init__(self) -> None:
        check_values(self)
        if not self.fourier_low < self.fourier_high:
            raise ConfigError(
                f"fourier_low and fourier_high must satisfy 0 < low < high, got {self.fourier_low} and "
                f"{self.fourier_high}"
            )
