"""Gray-Scott reaction-diffusion in 2D (equations in `GrayScottConfig`); channels (u, v).

The diagonal part L = (-D_u |k|^2 - F, -D_v |k|^2 - (F + k)) is per channel and treated exactly; the
reaction N = (-u v^2 + F, u v^2) is evaluated in physical space with the 2/3 rule applied to the state
and to the product. Nothing is conserved; with F, k > 0 the solution stays in a bounded set.

Initial state: a configured field b (by default random blobs, normalised to max |b| = 1) seeds
u = 1 - b / 2, v = b / 4 with b -> |b| clipped to [0, 1] (Pearson's perturbed homogeneous state).
"""

from __future__ import annotations

import numpy as np
import torch
from torch import Tensor

from dynaforge.config import GrayScottConfig
from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem, draw_initial_field


class GrayScott(SpectralSystem):
    name = "gray_scott"
    config_class = GrayScottConfig
    channels = 2
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        feed, kill = params["feed"], params["kill"]
        return torch.cat(
            [-params["diffusion_u"] * k2 - feed, -params["diffusion_v"] * k2 - (feed + kill)], dim=1
        )

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        """R = FFT(F - u v^2, u v^2) of the truncated state (the mask after the product is the multiplier);
        the transforms skip the columns of the last axis the 2/3 rule zeroes."""
        mask_c = mask.to(self.complex_dtype)
        feed = params["feed"]

        def nonlinear(v: Tensor) -> Tensor:
            fields = self.to_physical_dealiased(mask_c * v)
            u, w = fields[:, 0:1], fields[:, 1:2]
            reaction = u * w * w
            return self.to_spectral_dealiased(torch.cat([feed - reaction, reaction], dim=1))

        return nonlinear

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        return mask.to(torch.complex128)

    def draw_initial(self, rng: np.random.Generator, parameters: np.ndarray) -> np.ndarray:
        seed_field = np.clip(np.abs(draw_initial_field(self.config.initial, self.shape, rng)), 0.0, 1.0)
        return np.stack([1.0 - 0.5 * seed_field, 0.25 * seed_field])
