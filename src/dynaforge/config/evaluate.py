"""The `evaluate` section: rollouts, metrics and the report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynaforge.config.base import ConfigError


@dataclass
class EvaluateConfig:
    """Autoregressive rollouts on the test split, scored in physical (denormalised) units."""

    rollout_frames: int = 20
    """Frames predicted autoregressively from the true initial `history` frames of each test trajectory."""
    start_frame: int = 0
    """Stored frame at which the rollout's input frames begin."""
    checkpoint: Literal["best", "last"] = "best"
    """Which checkpoint of the run to evaluate."""
    plot_samples: int = 3
    """Test trajectories drawn as truth / prediction / error space-time images."""
    device: str = "auto"
    """Where to evaluate: `cpu`, `cuda`, `cuda:1` or `auto`."""
    fourier_low: int = 4
    """PDEBench's `iLow`: wavenumber shells [0, fourier_low) make the low band of the Fourier-band RMSE."""
    fourier_high: int = 12
    """PDEBench's `iHigh`: shells [fourier_low, fourier_high) are the mid band, the rest the high band."""
    correlation_threshold: float = 0.95
    """The correlation time is the time until the correlation with the truth drops below this."""
    gmean_horizon: int | None = None
    """Predicted frames the geometric mean of the rollout nRMSE covers (APEBench uses 100); null: all."""
    worst_samples: int = 3
    """Test trajectories with the largest rollout nRMSE listed (and drawn) in the report."""

    def __post_init__(self) -> None:
        if self.rollout_frames < 1:
            raise ConfigError(f"rollout_frames must be >= 1, got {self.rollout_frames}")
        if self.start_frame < 0 or self.plot_samples < 0 or self.worst_samples < 0:
            raise ConfigError("start_frame, plot_samples and worst_samples must be >= 0")
        if not 0 < self.fourier_low < self.fourier_high:
            raise ConfigError(
                f"fourier_low and fourier_high must satisfy 0 < low < high, got {self.fourier_low} and "
                f"{self.fourier_high}"
            )
        if not 0 < self.correlation_threshold <= 1:
            raise ConfigError(f"correlation_threshold must be in (0, 1], got {self.correlation_threshold}")
        if self.gmean_horizon is not None and self.gmean_horizon < 1:
            raise ConfigError(f"gmean_horizon must be >= 1 or null, got {self.gmean_horizon}")
