"""The `model` section: one dataclass per surrogate, chosen by `name`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from dynaforge.config.base import (
    AT_LEAST_ONE,
    FRACTION,
    NON_NEGATIVE,
    POSITIVE,
    ConfigError,
    check_values,
    checked,
)


@dataclass
class ModelConfig:
    """A neural surrogate: `history` normalised frames in, the next `horizon` frames out.

    The section is chosen by its `name` (one of `dynaforge.models.MODELS`); each model has its own fields.
    """

    name: str = "fno"
    """Which model: one of `dynaforge.models.MODELS`."""
    residual: bool = True
    """Predict the change from the last input frame rather than the frames themselves."""


@dataclass
class FNOConfig(ModelConfig):
    """Fourier neural operator: lift, `layers` spectral blocks, project (Li et al. 2021)."""

    name: str = "fno"
    width: int = checked(32, check=AT_LEAST_ONE)
    """Channels of the hidden representation."""
    modes: int = checked(16, check=AT_LEAST_ONE)
    """Fourier modes kept per axis in every spectral convolution (at most n // 2 + 1)."""
    layers: int = checked(4, check=AT_LEAST_ONE)
    """Spectral blocks."""
    projection: int = checked(64, check=AT_LEAST_ONE)
    """Hidden channels of the output projection."""
    coordinates: bool = False
    """Also feed the grid coordinates (x / L in [0, 1) per axis, left end included) as input channels, as Li
    et al.'s model does; off, the operator commutes with periodic translations, as the PDEs it learns do."""
    spectral_transform: Literal["auto", "fft", "dft"] = "auto"
    """How spectral convolutions reach the kept modes: `fft` (rfft, gather, scatter, irfft), `dft` (matrix
    products with truncated DFT matrices: same result to float rounding, faster when few modes are kept), or
    `auto` (`dft` when modes <= a quarter of the grid points on every axis, else `fft`)."""
    spectral_low_precision: bool = False
    """Let bf16/fp16 autocast run the `dft` path's matrix products (and the mode mixing) in low precision;
    false keeps the spectral convolution in fp32 whatever train.precision is (the `fft` path always does)."""
    spectral_init: Literal["small", "normal"] = "small"
    """Initial spectral weights: `small` (Li et al.'s, uniform in [0, 1 / width^2): every block starts as
    almost only its pointwise path) or `normal` (complex Gaussian, standard deviation sqrt(2 / (2 width)),
    as neuraloperator's FNO: the spectral path starts as strong as the pointwise one)."""
    domain_padding: float = checked(0.0, check=FRACTION)
    """For fields that are not periodic (walls, inflow, Darcy): after the lift, every spatial axis is
    extended by this fraction of its points with zeros at its far end, and the extension is cut off before
    the projection, so that the spectral convolutions do not wrap one wall onto the other (Li et al.'s
    Darcy experiments pad so). 0 (the default) on periodic data."""

    def __post_init__(self) -> None:
        check_values(self)


@dataclass
class UNetConfig(ModelConfig):
    """A small U-Net (circular padding by default: `padding`): `levels` resolutions, channels doubling per level."""

    name: str = "unet"
    channels: int = checked(16, check=AT_LEAST_ONE)
    """Channels at the finest level."""
    levels: int = checked(3, check=AT_LEAST_ONE)
    """Resolutions (the finest included); each coarser level halves the grid."""
    kernel_size: int = checked(3, check=AT_LEAST_ONE)
    """Odd width of every convolution kernel."""
    padding: Literal["circular", "zeros", "replicate", "reflect"] = "circular"
    """How every convolution pads the grid's edges: `circular` for periodic data (the default); `zeros`,
    `replicate` or `reflect` for fields with walls (bounded systems, Darcy, the cavity)."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")


@dataclass
class LatentConfig(ModelConfig):
    """Latent operator: grid -> tokens (conv stem, patches, Fourier position features) -> pre-norm
    transformer blocks conditioned on dt and the system parameters (adaptive layer norm) -> grid.
    See `dynaforge.models.latent`."""

    name: str = "latent"
    width: int = checked(64, check=AT_LEAST_ONE)
    """Token (embedding) dimension."""
    stem: int = checked(32, check=AT_LEAST_ONE)
    """Channels of the convolutional stem that precedes patching."""
    patch: int = checked(4, check=AT_LEAST_ONE)
    """Grid points per token along every axis (the grid size must be a multiple of it)."""
    depth: int = checked(4, check=AT_LEAST_ONE)
    """Transformer blocks."""
    heads: int = checked(4, check=AT_LEAST_ONE)
    """Attention heads (must divide `width`)."""
    mlp_ratio: int = checked(2, check=AT_LEAST_ONE)
    """Hidden width of each block's MLP, in multiples of `width`."""
    attention: Literal["standard", "channel", "alternate"] = "alternate"
    """Token mixing: `standard` attention over tokens, `channel`-separated (cross-covariance) attention
    over feature channels, or `alternate` (standard, channel, standard, ...)."""
    merge_levels: int = checked(0, check=NON_NEGATIVE)
    """U-shaped token merging: halve the tokens per axis this many times on the way down (and restore
    them, with skip connections, on the way up); 0 keeps one resolution."""
    position_features: int = checked(8, check=AT_LEAST_ONE)
    """Fourier frequencies per axis of the position features added to the tokens."""
    parameters: int = checked(0, check=NON_NEGATIVE)
    """System parameters the update is conditioned on (the stages fill it in from the dataset)."""
    dt: float = checked(1.0, check=POSITIVE)
    """Model time step assumed when a call gives none (the stages fill it in from the dataset)."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.width % self.heads:
            raise ConfigError(f"heads={self.heads} must divide width={self.width}")
        if self.merge_levels * 2 > self.depth:
            raise ConfigError(
                f"merge_levels={self.merge_levels} needs depth >= {2 * self.merge_levels} (one block per "
                "level on the way down and one on the way up)"
            )


@dataclass
class FlowNetConfig(ModelConfig):
    """Velocity field of a conditional flow-matching model on the grid: circular convolutions, modulated by
    the flow time and the system parameters. See `dynaforge.models.flow`."""

    name: str = "flow"
    residual: bool = False
    width: int = checked(32, check=AT_LEAST_ONE)
    """Hidden channels."""
    layers: int = checked(4, check=AT_LEAST_ONE)
    """Residual convolution blocks."""
    kernel_size: int = checked(5, check=AT_LEAST_ONE)
    """Odd width of every convolution kernel."""
    condition_frames: int = checked(2, check=NON_NEGATIVE)
    """Frames given beside the noisy state (residual corrector: the operator's prediction and the last input
    frame; steady prior: 0)."""
    parameters: int = checked(0, check=NON_NEGATIVE)
    """System parameters conditioned on (the stages fill it in from the dataset)."""
    scale: float = checked(1.0, check=POSITIVE)
    """Physical scale of the generated field in normalised units (the stages fill it in: the residual's
    standard deviation), so that the flow runs on unit-variance targets."""

    def __post_init__(self) -> None:
        check_values(self)
        if self.kernel_size % 2 == 0:
            raise ConfigError(f"kernel_size must be odd and >= 1, got {self.kernel_size}")


MODEL_CONFIGS: dict[str, type[ModelConfig]] = {
    "fno": FNOConfig,
    "unet": UNetConfig,
    "latent": LatentConfig,
    "flow": FlowNetConfig,
}
