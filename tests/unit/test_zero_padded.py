"""`spectral.zero_padded`: the 2/3 band padded with zeros, in a reused buffer unless gradients flow."""

from __future__ import annotations

import torch
import torch.nn.functional as F

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
