"""Physics diagnostics of PDE rollouts: drift of the quantities a system conserves, and energy spectra.

Fields are (batch, frames, channels, *space), predicted frames only, on a periodic grid.

Which systems conserve what (periodic domain; `mass` is the spatial mean of each channel, `energy` the
spatial mean of u^2 / 2):

| system | conserved | why |
| --- | --- | --- |
| `heat` | mass | u_t = nu laplacian(u): the mean mode does not change; energy decays |
| `advection` | mass, energy | u_t + c u_x = 0 translates u: every mode keeps its amplitude |
| `burgers` | mass | u_t + (u^2 / 2)_x = nu u_xx is a conservation law; energy is dissipated by viscosity |
| `ks` | mass | every term of u_t = -(u^2/2)_x - u_xx - u_xxxx is a derivative; energy is not conserved |
| `navier_stokes` | mass (of vorticity) | the mean vorticity of a periodic flow is 0 and stays 0 (forcing and drag keep it) |
| `gray_scott`, `ks2d`, `random_cnn`, foreign datasets | nothing checked | reactions, |grad h|^2 and random operators change both |

The drift is measured against the true frame at the same time rather than the initial one, so that the
solver's own (small) conservation error is not charged to the model.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.metrics.fields import EPS, check_same_shape, space_axes, widen
from dynaforge.metrics.spectra import energy_spectrum

CONSERVED: dict[str, tuple[str, ...]] = {
    "heat": ("mass",),
    "advection": ("mass", "energy"),
    "burgers": ("mass",),
    "ks": ("mass",),
    "navier_stokes": ("mass",),
    "gray_scott": (),
    "ks2d": (),
    "random_cnn": (),
}
"""System name -> the quantities its rollouts conserve (see the module docstring); unknown systems: none."""

SPECTRUM_FLOOR = 1e-12
"""Spectra are floored at this fraction of the true total energy before taking logs, so that shells
holding only round-off do not dominate the spectrum error."""


def conserved_quantities(system: str) -> tuple[str, ...]:
    return CONSERVED.get(system, ())


def mass(fields: Float[Tensor, "batch frames channels *space"]) -> Float[Tensor, "batch frames channels"]:
    """Spatial mean of each channel (the integral over the domain divided by its volume)."""
    wide = widen(fields)
    return wide.mean(dim=space_axes(wide))


def energy(fields: Float[Tensor, "batch frames channels *space"]) -> Float[Tensor, "batch frames channels"]:
    """Spatial mean of u^2 / 2 of each channel."""
    wide = widen(fields)
    return 0.5 * wide.square().mean(dim=space_axes(wide))


def mass_drift_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """|mass(prediction) - mass(truth)| per sample and channel, averaged over both (field units)."""
    check_same_shape(prediction, truth)
    return (mass(prediction) - mass(truth)).abs().mean(dim=(0, 2))


def energy_drift_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """|energy(prediction) - energy(truth)| / energy(truth) per sample and channel, averaged over both."""
    check_same_shape(prediction, truth)
    true_energy = energy(truth)
    return ((energy(prediction) - true_energy).abs() / true_energy.clamp_min(EPS)).mean(dim=(0, 2))


def mean_spectrum(fields: Float[Tensor, "batch frames channels *space"]) -> Float[Tensor, "frames shells"]:
    """The energy spectrum E(k) of every frame, averaged over samples and channels."""
    return energy_spectrum(fields).mean(dim=(0, 2))


def spectrum_error_per_frame(
    prediction: Float[Tensor, "batch frames channels *space"],
    truth: Float[Tensor, "batch frames channels *space"],
) -> Float[Tensor, " frames"]:
    """Mean over shells k >= 1 of |log10 E_pred(k) - log10 E_true(k)|, with both spectra averaged over
    samples and channels and floored at SPECTRUM_FLOOR times the true total energy. 0 for matching
    spectra; 1 means an order of magnitude off on average. The mean mode (k = 0) is the mass, left out."""
    check_same_shape(prediction, truth)
    predicted, true = mean_spectrum(prediction), mean_spectrum(truth)
    if true.shape[-1] < 2:
        raise ValueError("an energy spectrum needs at least 2 grid points per axis")
    floor = (SPECTRUM_FLOOR * true.sum(dim=-1, keepdim=True)).clamp_min(torch.finfo(true.dtype).tiny)
    ratio = (predicted[:, 1:] + floor) / (true[:, 1:] + floor)
    return torch.log10(ratio).abs().mean(dim=-1)
