"""The vorticity a flow report draws (`dynaforge.evaluate.vorticity`): exact for a solid-body rotation and a
linear shear (central differences are exact on linear fields), 0 inside an obstacle, and only for 2D data
with u and v."""

from __future__ import annotations

import numpy as np

from dynaforge.evaluate.vorticity import frames_vorticity, is_flow


def test_the_vorticity_of_a_rotation_and_a_shear_and_none_inside_an_obstacle() -> None:
    x = (np.arange(12) + 0.5) / 12 * 2.2
    y = (np.arange(8) + 0.5) / 8 * 0.41
    X, Y = np.meshgrid(x, y, indexing="ij")
    rotation = np.stack([-Y, X, np.zeros_like(X)])[None]  # (1 frame, u v obstacle, x, y): w = 2
    np.testing.assert_allclose(frames_vorticity(rotation, ("u", "v", "obstacle"), x, y), 2.0, rtol=1e-12)
    shear = np.stack([3.0 * Y, np.zeros_like(X), np.zeros_like(X)])[None]  # w = -3
    shear[0, 2, 4:6, 3:5] = 1.0
    w = frames_vorticity(shear, ("u", "v", "obstacle"), x, y)
    assert np.all(w[0, 4:6, 3:5] == 0.0)
    outside = np.ones(w.shape[1:], dtype=bool)
    outside[4:6, 3:5] = False
    np.testing.assert_allclose(w[0][outside], -3.0, rtol=1e-12)
    assert is_flow(("u", "v", "pressure"), 2) and not is_flow(("u", "v"), 1) and not is_flow(("u",), 2)
