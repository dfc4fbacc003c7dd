"""Initial conditions of the spectral PDEs: the draw of one field (`draw_initial_field`) from the families
`fourier` (a random Fourier series), `grf` (a Gaussian random field) and those below, and the draw of a
parameter from its range (`draw_from_range`).

Every family draws one scalar field on the periodic grid (any dimension) from the sample's numpy
generator, in grid-index units (x / L = j / n), so a field does not depend on the domain length. The
caller normalises it (`normalize_field`): with `normalize: std` every family has unit spatial variance.

- `multiscale`: the sum of `octaves` band-limited noises; band j keeps the modes with
  2^j <= |m| < 2^(j+1) of a white-noise field and is scaled to unit variance before summing, so every
  scale carries the same energy.
- `blobs`: 1..n_blobs periodic Gaussian bumps exp(-d^2 / (2 r^2)), random centre, sign and radius
  r ~ blob_radius * U(0.5, 1.5) (d is the periodic distance, in units of the domain length).
- `stripes`: sin(2 pi m.x / L + phi) with an integer direction m, |m_i| <= max_stripe_wavenumber, m != 0.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np

from dynaforge.config import InitialConfig, Range
from dynaforge.errors import ConfigError

Family = Callable[[Sequence[int], InitialConfig, np.random.Generator], np.ndarray]


def integer_frequencies(shape: Sequence[int]) -> list[np.ndarray]:
    """Integer mode numbers m per axis on the rfftn layout, each broadcastable against the spectrum."""
    result = []
    for axis, n in enumerate(shape):
        last = axis == len(shape) - 1
        m = np.fft.rfftfreq(n, d=1.0 / n) if last else np.fft.fftfreq(n, d=1.0 / n)
        view = [1] * len(shape)
        view[axis] = m.size
        result.append(m.reshape(view))
    return result


def multiscale_noise(shape: Sequence[int], config: InitialConfig, rng: np.random.Generator) -> np.ndarray:
    """Equal-variance dyadic bands of white noise (see the module docstring)."""
    spectrum = np.fft.rfftn(rng.standard_normal(tuple(shape)))
    radius = np.sqrt(sum(m.astype(np.float64) ** 2 for m in integer_frequencies(shape)))
    field = np.zeros(tuple(shape), dtype=np.float64)
    for octave in range(config.octaves):
        band = (radius >= 2**octave) & (radius < 2 ** (octave + 1))
        part = np.fft.irfftn(spectrum * band, s=tuple(shape), axes=tuple(range(len(shape))))
        std = part.std()
        if std > 0:
            field = field + part / std
    return field


def blobs(shape: Sequence[int], config: InitialConfig, rng: np.random.Generator) -> np.ndarray:
    """A sum of periodic Gaussian bumps of random sign, centre and radius."""
    count = int(rng.integers(1, config.n_blobs + 1))
    centres = rng.uniform(0.0, 1.0, size=(count, len(shape)))
    radii = config.blob_radius * rng.uniform(0.5, 1.5, size=count)
    signs = rng.choice(np.array([-1.0, 1.0]), size=count)
    coords = np.meshgrid(*[np.arange(n) / n for n in shape], indexing="ij")
    field = np.zeros(tuple(shape), dtype=np.float64)
    for centre, radius, sign in zip(centres, radii, signs):
        d2 = np.zeros(tuple(shape), dtype=np.float64)
        for axis_coord, c in zip(coords, centre):
            delta = np.abs(axis_coord - c)
            d2 = d2 + np.minimum(delta, 1.0 - delta) ** 2  # periodic distance
        field = field + sign * np.exp(-d2 / (2.0 * radius**2))
    return field


def stripes(shape: Sequence[int], config: InitialConfig, rng: np.random.Generator) -> np.ndarray:
    """One plane wave with a random integer direction and phase."""
    top = config.max_stripe_wavenumber
    mode = np.zeros(len(shape), dtype=np.int64)
    while not mode.any():
        mode = rng.integers(-top, top + 1, size=len(shape))
    phase = rng.uniform(0.0, 2.0 * math.pi)
    coords = np.meshgrid(*[np.arange(n) / n for n in shape], indexing="ij")
    angle = 2.0 * math.pi * sum(int(m) * c for m, c in zip(mode, coords))
    return np.sin(angle + phase)


FAMILIES: dict[str, Family] = {
    "multiscale": multiscale_noise,
    "blobs": blobs,
    "stripes": stripes,
}
"""The families of this module by name (`fourier` and `grf` live in `spectral.py`)."""


def draw_from_range(spec: Range, rng: np.random.Generator) -> float:
    """Uniform (or log-uniform) draw in [low, high]; a constant when low == high (no draw is consumed)."""
    if spec.low == spec.high:
        return float(spec.low)
    if spec.log:
        return float(np.exp(rng.uniform(np.log(spec.low), np.log(spec.high))))
    return float(rng.uniform(spec.low, spec.high))


def draw_initial_field(config: InitialConfig, shape: Sequence[int], rng: np.random.Generator) -> np.ndarray:
    """One scalar initial field on the grid (see `InitialConfig` for the families and normalisation)."""
    names = sorted(config.families)
    weights = np.asarray([config.families[n] for n in names], dtype=np.float64)
    family = names[int(rng.choice(len(names), p=weights / weights.sum()))] if len(names) > 1 else names[0]
    if family == "fourier":
        field = fourier_series_field(shape, config.max_wavenumber, rng)
    elif family == "grf":
        field = gaussian_random_field(shape, config.length_scale, rng)
    elif family in FAMILIES:  # multiscale, blobs, stripes
        field = FAMILIES[family](shape, config, rng)
    else:
        valid = ", ".join(["fourier", "grf", *FAMILIES])
        raise ConfigError(f"unknown initial-condition family {family!r}; valid: {valid}")
    return normalize_field(field, config)


def fourier_series_field(shape: Sequence[int], max_wavenumber: int, rng: np.random.Generator) -> np.ndarray:
    """sum_m a_m sin(2 pi m.x / L + phi_m) over modes with 1 <= max|m_i| <= K in one half-space.

    In 1D: sum_{m=1..K} a_m sin(2 pi m x / L + phi_m), a_m ~ U(-1, 1), phi_m ~ U(0, 2 pi). The field is
    written in grid-index units (x / L = j / n), so it does not depend on the domain length.
    """
    ndim = len(shape)
    modes = half_space_modes(ndim, max_wavenumber)  # (M, ndim)
    amplitudes = rng.uniform(-1.0, 1.0, size=len(modes))
    phases = rng.uniform(0.0, 2.0 * math.pi, size=len(modes))
    coords = np.meshgrid(*[np.arange(n) / n for n in shape], indexing="ij")
    field = np.zeros(tuple(shape), dtype=np.float64)
    for mode, amplitude, phase in zip(modes, amplitudes, phases, strict=True):
        angle = 2.0 * math.pi * sum(m * c for m, c in zip(mode, coords, strict=True))
        field = field + amplitude * np.sin(angle + phase)
    return field


def half_space_modes(ndim: int, max_wavenumber: int) -> np.ndarray:
    """Integer modes m with 1 <= max|m_i| <= K whose first non-zero entry is positive (one of m, -m)."""
    grids = np.meshgrid(*[np.arange(-max_wavenumber, max_wavenumber + 1)] * ndim, indexing="ij")
    modes = np.stack([g.reshape(-1) for g in grids], axis=1)
    first_nonzero = np.array([row[np.flatnonzero(row)[0]] if row.any() else 0 for row in modes])
    return modes[first_nonzero > 0]


def gaussian_random_field(shape: Sequence[int], length_scale: float, rng: np.random.Generator) -> np.ndarray:
    """A periodic stationary Gaussian field with covariance ~ exp(-r^2 / (2 l^2)), l = length_scale * L.

    White noise is filtered in Fourier space by sqrt(S(k)), S(k) = exp(-l^2 |k|^2 / 2) the
    squared-exponential spectral density; l |k| = 2 pi |m| length_scale does not depend on L.
    """
    noise = rng.standard_normal(tuple(shape))
    spectrum = np.fft.rfftn(noise)
    m2 = np.zeros(spectrum.shape, dtype=np.float64)
    for axis, n in enumerate(shape):
        last = axis == len(shape) - 1
        m = np.fft.rfftfreq(n, d=1.0 / n) if last else np.fft.fftfreq(n, d=1.0 / n)
        view = [1] * len(shape)
        view[axis] = m.size
        m2 = m2 + (m.reshape(view)) ** 2
    filter_ = np.exp(-((2.0 * math.pi * length_scale) ** 2) * m2 / 4.0)  # sqrt of exp(-l^2 k^2 / 2)
    return np.fft.irfftn(spectrum * filter_, s=tuple(shape), axes=tuple(range(len(shape))))


def normalize_field(field: np.ndarray, config: InitialConfig) -> np.ndarray:
    if config.zero_mean:
        field = field - field.mean()
    if config.normalize == "max":
        scale = np.abs(field).max()
    elif config.normalize == "std":
        scale = field.std()
    else:
        return config.amplitude * field if config.amplitude != 1.0 else field
    if scale == 0:
        return field
    return field * (config.amplitude / scale)
