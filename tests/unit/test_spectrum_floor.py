"""The energy-spectrum error scores only the shells the data hold (issue 39): a pseudo-spectral solver's
dealiased band, where the stored truth is round-off, must not dominate it; real errors still count."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from dynaforge import simulate
from dynaforge.evaluate.plots import spectra_figure
from dynaforge.metrics import physics
from dynaforge.metrics.spectra import energy_spectrum

TINY = Path(__file__).resolve().parents[2] / "configs" / "tiny.yaml"
KEPT = 22
"""Shells k < 22 of a 64-point grid survive the 2/3 rule (3 |m| < 64); shells 22 .. 32 are zeroed."""


def burgers_truth() -> torch.Tensor:
    """Two test trajectories of the tiny Burgers preset, frames 2 .. 4 (the first a tiny run's rollout
    predicts): (2, 3, 1, 64) float32."""
    return simulate(TINY, n=2, split="test").fields[:, 2:5]


def with_energy_in_dealiased_band(fields: torch.Tensor, amplitude: float) -> torch.Tensor:
    """`fields` plus a wave of every wavenumber 22 .. 32 of the given amplitude: what a network's pointwise
    nonlinearities leave in the band the solver zeroes."""
    x = torch.arange(fields.shape[-1], dtype=torch.float64) / fields.shape[-1]
    wave = sum(torch.cos(2 * math.pi * m * x + m) for m in range(KEPT, 33))
    return fields + (amplitude * wave).to(fields.dtype)


def test_the_solvers_truth_holds_only_round_off_in_the_dealiased_band() -> None:
    spectrum = energy_spectrum(burgers_truth()).mean(dim=(0, 2))  # (frames, shells)
    peak = spectrum[:, 1:].amax(dim=-1)
    assert (spectrum[:, KEPT:].amax(dim=-1) < 1e-2 * physics.SPECTRUM_FLOOR * peak).all()  # float32 round-off
    assert (spectrum[:, 1:KEPT].amin(dim=-1) > physics.SPECTRUM_FLOOR * peak).all()  # the kept band: scored


def test_energy_in_the_dealiased_band_does_not_dominate_the_spectrum_error() -> None:
    truth = burgers_truth()
    prediction = with_energy_in_dealiased_band(truth, 1e-5)  # about 1e-10 per shell, as the tiny FNO gives
    added = energy_spectrum(prediction).mean(dim=(0, 2))[:, KEPT:]
    assert (added > 1e-11).all() and (added < 1e-9).all()
    error = physics.spectrum_error_per_frame(prediction, truth)
    assert (error < 1e-3).all(), error  # the previous rule gave about 1 here: 11 of 32 shells off by 1e7


def test_errors_in_the_shells_the_data_hold_still_count() -> None:
    truth = burgers_truth()
    spectrum = energy_spectrum(truth).mean(dim=(0, 2))
    held = (spectrum[:, 1:] >= physics.SPECTRUM_FLOOR * spectrum[:, 1:].amax(dim=-1, keepdim=True)).sum(-1)
    assert (held == KEPT - 1).all()
    louder = with_energy_in_dealiased_band(truth * math.sqrt(10.0), 1e-5)  # 10x the energy in every shell
    error = physics.spectrum_error_per_frame(louder, truth)
    assert ((error > 0.95) & (error <= 1.0)).all(), error  # 1 but where the floor softens the faintest shells


def test_a_predicted_spectrum_that_vanishes_counts_down_to_the_floor_only() -> None:
    torch.manual_seed(0)
    truth = torch.randn(2, 1, 1, 32, dtype=torch.float32)
    smooth = torch.fft.irfft(torch.fft.rfft(truth, dim=-1)[..., :9], n=32, dim=-1)  # shells 9 .. 16 emptied
    error = physics.spectrum_error_per_frame(smooth, truth)
    bound = 8 * math.log10(1.0 / physics.SPECTRUM_FLOOR) / 16  # log10 (E_true / f) <= 12 per emptied shell
    assert 0.5 * bound < float(error) <= bound


def test_two_dimensional_shells_past_the_one_dimensional_band_are_scored() -> None:
    # A 2/3-truncated square of modes reaches radius sqrt(2) n / 3 along its diagonal: those shells hold data.
    torch.manual_seed(0)
    n, kept = 48, 16
    spectrum = torch.fft.fft2(torch.randn(1, 1, 1, n, n, dtype=torch.float64))
    m = torch.fft.fftfreq(n, d=1.0 / n).abs()
    square = (m[:, None] < kept) & (m[None, :] < kept)
    truth = torch.fft.ifft2(spectrum * square).real.float()
    corners = energy_spectrum(truth)[0, 0, 0, kept : n // 2 + 1]
    assert (corners > 0.1 * corners.max()).sum() >= 4  # shells 16 .. 22 hold the square's corners
    louder = physics.spectrum_error_per_frame(truth * math.sqrt(10.0), truth)
    torch.testing.assert_close(louder, torch.ones(1), atol=1e-4, rtol=0)  # every held shell scored


def test_the_spectra_figure_marks_the_floor_below_which_shells_are_not_scored() -> None:
    truth = [[0.0, 1.0, 1e-3, 1e-17], [0.0, 2.0, 1e-3, 1e-17]]
    figure = spectra_figure(truth, truth, [0, 4], physics.SPECTRUM_FLOOR)
    axes = figure.axes[0]
    floors = [line for line in axes.lines if line.get_linestyle() == ":"]
    assert [line.get_ydata()[0] for line in floors] == pytest.approx([1e-12, 2e-12])
    assert "not scored below (1e-12 of the peak)" in [t.get_text() for t in axes.get_legend().get_texts()]
    assert not [
        line for line in spectra_figure(truth, truth, [0, 4]).axes[0].lines if line.get_linestyle() == ":"
    ]
