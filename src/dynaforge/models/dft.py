"""Truncated discrete Fourier transforms as real matrices, for spectral layers that keep few modes.

A spectral convolution that keeps m of a grid's n frequencies needs only those m: the forward transform is
an (n, 2m) matrix product and the inverse a (2m, n) one, in real arithmetic. For small m this beats an FFT
followed by a gather (and the scatter into a zero spectrum before the inverse FFT), runs under autocast and
compiles to plain matrix products. The matrices here reproduce torch.fft exactly, up to float rounding:

- `rfft` on the last axis, modes 0..m-1: X_k = sum_j x_j exp(-2 pi i k j / n), so the real part is x @ cos
  and the imaginary part x @ (-sin).
- `irfft` of a spectrum whose modes >= m are zero: x_j = (1/n) sum_k c_k (Re X_k cos - Im X_k sin)(2 pi k j
  / n) with c_0 = 1, c_{n/2} = 1 (the Nyquist mode, n even) and c_k = 2 otherwise (each other mode stands for
  itself and its conjugate). The sine of the zero and Nyquist modes vanishes on the grid, so their
  imaginary parts are ignored, as irfft ignores them.
- `fft` / `ifft` on the other axes, kept modes 0..m-1 and n-m..n-1 (the positive and negative ones): a
  complex product with exp(-+2 pi i k j / n), written on (real, imaginary) pairs with one cos and one sin
  matrix; the inverse carries the 1/n.

Angles are reduced exactly in integers (k j mod n) and evaluated in float64 before the cast to float32.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor


def kept_frequencies(n: int, m: int, last_axis: bool, device: torch.device) -> Tensor:
    """The kept integer frequencies: 0..m-1 on the last (rfft) axis, 0..m-1 and n-m..n-1 on the others."""
    low = torch.arange(m, dtype=torch.int64, device=device)
    if last_axis:
        return low
    return torch.cat([low, torch.arange(n - m, n, dtype=torch.int64, device=device)])


def phase_cos_sin(n: int, frequencies: Tensor) -> tuple[Tensor, Tensor]:
    """cos and sin of 2 pi k j / n for grid points j (rows) and frequencies k (columns), float64."""
    points = torch.arange(n, dtype=torch.int64, device=frequencies.device)
    turns = torch.remainder(points[:, None] * frequencies[None, :], n)  # exact: k j mod n
    angle = turns.to(torch.float64) * (2.0 * math.pi / n)
    return torch.cos(angle), torch.sin(angle)


def rfft_matrix(n: int, m: int, device: torch.device) -> Float[Tensor, "n two_m"]:
    """x (..., n) @ this = [Re X_0..X_{m-1}, Im X_0..X_{m-1}] of rfft(x) (float32)."""
    cos, sin = phase_cos_sin(n, kept_frequencies(n, m, last_axis=True, device=device))
    return torch.cat([cos, -sin], dim=1).to(torch.float32)


def irfft_matrix(n: int, m: int, device: torch.device) -> Float[Tensor, "two_m n"]:
    """[Re X_0.., Im X_0..] (..., 2m) @ this = irfft(X, n) for a spectrum zero above mode m-1 (float32)."""
    frequencies = kept_frequencies(n, m, last_axis=True, device=device)
    cos, sin = phase_cos_sin(n, frequencies)
    self_conjugate = (frequencies == 0) | (2 * frequencies == n)  # zero and Nyquist modes count once
    weight = torch.where(self_conjugate, 1.0, 2.0).to(torch.float64) / n
    return torch.cat([(cos * weight).T, (-sin * weight).T], dim=0).to(torch.float32)


def fft_matrices(
    n: int, m: int, device: torch.device
) -> tuple[Float[Tensor, "n two_m"], Float[Tensor, "n two_m"]]:
    """cos and sin (float32) of the kept frequencies 0..m-1, n-m..n-1 of a full (complex) axis.

    fft: (a + i b) exp(-i t) = (a cos + b sin) + i (b cos - a sin); ifft: (a + i b) exp(i t) / n =
    (a cos - b sin) / n + i (a sin + b cos) / n, with the transposed matrices.
    """
    cos, sin = phase_cos_sin(n, kept_frequencies(n, m, last_axis=False, device=device))
    return cos.to(torch.float32), sin.to(torch.float32)
