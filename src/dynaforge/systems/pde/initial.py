"""Initial-condition families beyond the Fourier series and the Gaussian random field of `spectral.py`.

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

from dynaforge.config import InitialConfig

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
