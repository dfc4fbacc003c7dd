"""`spectral.zero_padded`: the 2/3 band padded with zeros, in a reused buffer unless gradients flow."""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import zero_padded


def test_the_reused_buffer_holds_the_band_and_zeros_past_it() -> None:
    first = torch.randn(3, 2, 5, dtype=torch.complex64)
    second = torch.randn(3, 2, 5, dtype=torch.complex64)
    a = zero_padded(first, 9)
    assert torch.equal(a, F.pad(first, (0, 4)))
    b = zero_padded(second, 9)
    assert b.data_ptr() == a.data_ptr()  # reused, not reallocated
    assert torch.equal(b, F.pad(second, (0, 4)))


def test_a_band_with_gradients_gets_a_fresh_tensor_and_its_gradient() -> None:
    band = torch.randn(2, 1, 4, dtype=torch.complex64, requires_grad=True)
    padded = zero_padded(band, 7)
    other = zero_padded(torch.randn(2, 1, 4, dtype=torch.complex64, requires_grad=True), 7)
    assert padded.data_ptr() != other.data_ptr()
    padded.abs().sum().backward()
    assert band.grad is not None and torch.isfinite(torch.view_as_real(band.grad)).all()


def test_a_narrower_band_of_the_same_padded_shape_is_not_padded_with_the_wider_ones_values() -> None:
    # Burgers N = 256 keeps 86 of 129 columns, KS N = 200 on the same 256-point product grid 67: one shape of
    # padded spectrum, two bands. Found on a GPU, where a KS batch after a Burgers one differed by 2e-6 from
    # the same batch split up.
    wide = torch.randn(4, 1, 86, dtype=torch.complex64)
    narrow = torch.randn(4, 1, 67, dtype=torch.complex64)
    zero_padded(wide, 129)
    assert torch.equal(zero_padded(narrow, 129), F.pad(narrow, (0, 62)))


def test_a_system_gives_the_same_numbers_after_another_with_the_same_padded_spectra() -> None:
    def rollout(overrides: list[str]) -> torch.Tensor:
        system = build_system(
            load_config(None, [*overrides, "system.steps=20", "system.save_every=20"]).system
        )
        params, initial = system.draw_samples([np.random.default_rng([9, i]) for i in range(16)])
        with torch.inference_mode():
            return system.rollout(initial, params).fields

    ks = ["system.name=ks", "system.resolution=200"]
    before = rollout(ks)
    rollout(["system.name=burgers", "system.resolution=256"])
    assert torch.equal(rollout(ks), before)
