"""Building blocks of every config section: the error that names the key, parameter ranges, initial conditions."""

from __future__ import annotations

import typing
from dataclasses import dataclass, field
from typing import Literal


class ConfigError(ValueError):
    """A configuration that cannot be used; the message names the key and what would be valid."""


@dataclass
class Range:
    """A physical parameter drawn per sample, uniformly in [low, high] (log-uniformly when `log`).

    A plain number in YAML (`viscosity: 0.01`) means a constant: low = high.
    """

    low: float
    """Smallest value drawn."""
    high: float
    """Largest value drawn."""
    log: bool = False
    """Draw uniformly in log space (needs low > 0)."""

    def __post_init__(self) -> None:
        if self.low > self.high:
            raise ConfigError(f"low ({self.low}) must not exceed high ({self.high})")
        if self.log and self.low <= 0:
            raise ConfigError(f"a log-uniform range needs low > 0, got low={self.low}")


@dataclass
class InitialConfig:
    """Initial conditions. Each sample picks a family by weight, draws a field, then normalises it.

    Families (1D and up; the last four are in `dynaforge.systems.pde.initial`):
    - `fourier`: sum over wavenumbers m = 1..max_wavenumber of a_m sin(2 pi m x / L + phi_m) per axis,
      a_m ~ U(-1, 1), phi_m ~ U(0, 2 pi).
    - `grf`: a Gaussian random field with squared-exponential covariance exp(-r^2 / (2 l^2)),
      l = length_scale * L, synthesised in Fourier space with random complex Gaussian coefficients.
    - `multiscale`: a sum of `octaves` band-limited noises, band j holding |m| in [2^j, 2^(j+1)), equal variance.
    - `blobs`: 1..n_blobs periodic Gaussian bumps of random sign, centre and radius (~ blob_radius L).
    - `stripes`: a plane wave sin(2 pi m.x / L + phi) with a random integer direction m, |m_i| <= max.

    Normalisation (`normalize`): `max` scales so that max |u0| = amplitude; `std` so that the spatial
    standard deviation equals amplitude (unit variance with amplitude 1); `none` only multiplies the draw by amplitude.
    With `zero_mean` the spatial mean is removed first.
    """

    families: dict[str, float] = field(default_factory=lambda: {"fourier": 1.0})
    """Family name -> weight (weights need not sum to one)."""
    max_wavenumber: int = 8
    """`fourier`: highest wavenumber of the truncated series."""
    length_scale: float = 0.1
    """`grf`: correlation length as a fraction of the domain length."""
    normalize: Literal["max", "std", "none"] = "max"
    """How each initial field is scaled (see the class docstring)."""
    amplitude: float = 1.0
    """Target of the normalisation."""
    zero_mean: bool = False
    """Remove the spatial mean before normalising."""
    n_blobs: int = 6
    """`blobs`: largest number of Gaussian bumps (each field draws 1..n_blobs, signs random)."""
    blob_radius: float = 0.08
    """`blobs`: mean bump radius as a fraction of the domain length."""
    max_stripe_wavenumber: int = 6
    """`stripes`: highest wavenumber of the plane wave's random integer direction."""
    octaves: int = 4
    """`multiscale`: number of dyadic bands of band-limited noise, each with equal variance."""

    def __post_init__(self) -> None:
        if (
            not self.families
            or any(w < 0 for w in self.families.values())
            or sum(self.families.values()) <= 0
        ):
            raise ConfigError(f"families needs non-negative weights with a positive sum, got {self.families}")
        if self.max_wavenumber < 1:
            raise ConfigError(f"max_wavenumber must be >= 1, got {self.max_wavenumber}")
        if self.length_scale <= 0:
            raise ConfigError(f"length_scale must be > 0, got {self.length_scale}")
        if self.n_blobs < 1 or self.blob_radius <= 0 or self.max_stripe_wavenumber < 1 or self.octaves < 1:
            raise ConfigError("n_blobs, max_stripe_wavenumber and octaves must be >= 1, blob_radius > 0")


def is_range_field(cls: type, name: str) -> bool:
    """Whether field `name` of dataclass `cls` is a `Range` (drawn per sample)."""
    return typing.get_type_hints(cls)[name] is Range
