"""Runtime shape checking is on under pytest (--jaxtyping-packages in pyproject): a wrong shape fails loudly."""

import jaxtyping
import numpy as np
import pytest
import torch

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde.spectral import dealias_mask, wavenumbers


def test_wavenumbers_shape_and_values() -> None:
    k = wavenumbers((8,), torch.tensor([2 * np.pi, 4 * np.pi], dtype=torch.float64), torch.float64)
    assert k[0].shape == (2, 1, 5)
    torch.testing.assert_close(k[0][0, 0], torch.arange(5, dtype=torch.float64))
    torch.testing.assert_close(k[0][1, 0], torch.arange(5, dtype=torch.float64) / 2)


def test_dealias_mask_keeps_two_thirds() -> None:
    mask = dealias_mask((256,), torch.device("cpu"), torch.float32)
    assert int(mask.sum()) == 86  # m = 0..85 satisfy 3 m < 256


def test_jaxtyping_runtime_check_is_active() -> None:
    system = build_system(load_config(None, ["system.resolution=16", "system.steps=2"]).system)
    with pytest.raises(jaxtyping.TypeCheckError):
        system.to_spectral(torch.zeros(3, dtype=torch.float32))
