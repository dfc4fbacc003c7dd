"""Physics diagnostics of PDE rollouts: drift of the quantities a system conserves, and energy spectra.

Fields are (batch, frames, channels, *space), predicted frames only, on a periodic grid.

What a system conserves (`mass`: the spatial mean of each channel; `energy`: the spatial mean of u^2 / 2)
is declared by the system itself, as `conserved` on its class beside its physics, with the reason
(`dynaforge.systems.base.SystemBase`); `conserved_quantities` reads it. Foreign datasets conserve nothing
checked.

The drift is measured against the true frame at the same time rather than the initial one, so that the
solver's own (small) conservation error is not charged to the model.
"""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.metrics.fields import EPS, check_same_shape, space_axes, widen
from dynaforge.metrics.spectra import energy_spectrum
from dynaforge.systems.registry import SYSTEMS
from dynaforge.systems.registry import conserved_quantities as system_conserved_quantities

CONSERVED: dict[str, tuple[str, ...]] = {name: system.conserved for name, system in SYSTEMS.items()}
"""Name -> the quantities the rollouts of each of dynaforge's own systems conserve (`SystemBase.conserved`)."""

SPECTRUM_FLOOR = 1e-12
"""Below this fraction of the largest true shell energy (k >= 1, per frame) a shell holds nothing the data
resolve: it is left out of the spectrum error, and both spectra are floored at it
(`spectrum_error_per_frame`)."""


def conserved_quantities(system: str) -> tuple[str, ...]:
    """What the rollouts of `system` conserve: its class's `conserved` (a user's system included, once the
    config naming it has been loaded); none for foreign datasets and unknown names."""
    return system_conserved_quantities(system)


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
    floor: float = SPECTRUM_FLOOR,
) -> Float[Tensor, " frames"]:
    """Mean of |log10 (E_pred(k) + f) - log10 (E_true(k) + f)| over the shells k >= 1 that the data hold,
    both spectra averaged over samples and channels. 0 for matching spectra; 1 means an order of magnitude
    off on average. The mean mode (k = 0) is the mass, left out.

    Shells the data cannot hold are left out: those whose true energy is below f = `floor` times the
    largest true energy of a shell k >= 1 (per frame). There the truth holds only round-off (a pseudo-spectral
    solver zeroes the modes of its 2/3 rule; the stored float32 truth keeps some 1e-16 of the peak there),
    and a model's small output there (say 1e-10) would otherwise dominate the mean through log10 of a
    round-off. In the shells that are scored f is added to both spectra, so that a predicted energy below
    what the data resolve counts as f. The rule needs no knowledge of the solver and so applies to other
    tools' data too; a truth without fluctuations (E_true(k) = 0 for every k >= 1) scores every shell.
    docs/evaluation.md explains the choice of f.
    """
    check_same_shape(prediction, truth)
    predicted, true = mean_spectrum(prediction), mean_spectrum(truth)
    if true.shape[-1] < 2:
        raise ValueError("an energy spectrum needs at least 2 grid points per axis")
    predicted, true = predicted[:, 1:], true[:, 1:]  # (frames, shells k >= 1)
    level = (floor * true.amax(dim=-1, keepdim=True)).clamp_min(torch.finfo(true.dtype).tiny)
    held = true >= level
    held = held | ~held.any(dim=-1, keepdim=True)  # a truth without fluctuations: score every shell
    distance = torch.log10((predicted + level) / (true + level)).abs()
    return torch.where(held, distance, 0.0).sum(dim=-1) / held.sum(dim=-1)
