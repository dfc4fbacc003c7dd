"""Gray-Scott reaction-diffusion in 2D (equations in `GrayScottConfig`); channels (u, v).

The solver steps (u - 1, v): with u = 1 + a the equations read a_t = D_u lap a - F a - u v^2 and
v_t = D_v lap v - (F + k) v + u v^2, so the feed's constant F (1 - u) = -F a is linear and the diagonal part
L = (-D_u |k|^2 - F, -D_v |k|^2 - (F + k)) is treated exactly; the reaction N = (-R, R), R = u v^2, is
evaluated in physical space with the 2/3 rule applied to the state and to the product. N is one transform
of R with the signs folded into the ETD coefficients (`nonlinear_multiplier`): a step transforms one
channel forward where it would transform two, and its stage combinations broadcast R over both channels.
Nothing is conserved; with F, k > 0 the solution stays in a bounded set.

Initial state: a configured field b (by default random blobs, normalised to max |b| = 1) seeds
u = 1 - b / 2, v = b / 4 with b -> |b| clipped to [0, 1] (Pearson's perturbed homogeneous state).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch
from torch import Tensor

from dynaforge.config import SystemConfig
from dynaforge.config.base import NON_NEGATIVE, POSITIVE, InitialConfig, Range, ranged
from dynaforge.systems.pde.spectral import Nonlinear, SpectralSystem, draw_initial_field


@dataclass
class GrayScottConfig(SystemConfig):
    """Gray-Scott reaction-diffusion, channels (u, v):

    u_t = D_u laplacian(u) - u v^2 + F (1 - u),  v_t = D_v laplacian(v) + u v^2 - (F + k) v.
    Defaults follow Pearson (1993): L = 2.5, D_u = 2e-5, D_v = 1e-5, dt = 1, with (F, k) = (0.03, 0.055),
    where spots and stripes persist (at many (F, k) the pattern dies out to the trivial state u = 1, v = 0).
    """

    name: str = "gray_scott"
    ndim: int = 2
    resolution: int = 128
    domain_length: Range = ranged(2.5)
    dt: float = 1.0
    steps: int = 1000
    save_every: int = 10
    feed: Range = ranged(0.03, check=NON_NEGATIVE.because("feed rate"))
    """Feed rate F."""
    kill: Range = ranged(0.055, check=NON_NEGATIVE.because("kill rate"))
    """Kill rate k."""
    diffusion_u: Range = ranged(2e-5, check=POSITIVE.because("diffusivity"))
    """Diffusion coefficient of u."""
    diffusion_v: Range = ranged(1e-5, check=POSITIVE.because("diffusivity"))
    """Diffusion coefficient of v."""
    initial: InitialConfig = field(default_factory=lambda: InitialConfig(families={"blobs": 1.0}))


class GrayScott(SpectralSystem):
    name = "gray_scott"
    config_class = GrayScottConfig
    conserved = ()
    """Nothing: the reactions change both the mass and the energy."""
    channels = 2
    supported_ndim = (1, 2, 3)

    def linear_operator(self, k: tuple[Tensor, ...], params: dict[str, Tensor]) -> Tensor:
        k2 = sum(axis_k**2 for axis_k in k)
        feed, kill = params["feed"], params["kill"]
        return torch.cat(
            [-params["diffusion_u"] * k2 - feed, -params["diffusion_v"] * k2 - (feed + kill)], dim=1
        )

    def state_offset(self) -> tuple[float, ...]:
        """u is stepped as u - 1 (module docstring): the feed's constant becomes linear."""
        return (1.0, 0.0)

    def nonlinear_term(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Nonlinear:
        """R = FFT(u v^2) of the truncated state (u = 1 + the stepped channel 0), one channel; the mask
        after the product and the signs (-R for u, +R for v) are the multiplier. The transforms skip the
        columns of the last axis the 2/3 rule zeroes, and the mask is applied to those columns alone."""
        band = self.kept_band()
        mask_band = mask[..., :band].to(self.complex_dtype).contiguous()

        def nonlinear(v: Tensor) -> Tensor:
            fields = self.to_physical_dealiased(mask_band * v[..., :band])
            a, w = fields[:, 0:1], fields[:, 1:2]
            w2 = w * w
            return self.to_spectral_dealiased(torch.addcmul(w2, w2, a))  # (1 + a) v^2

        return nonlinear

    def nonlinear_multiplier(self, k: tuple[Tensor, ...], params: dict[str, Tensor], mask: Tensor) -> Tensor:
        mask = mask.to(torch.complex128)
        return torch.stack([-mask, mask]).unsqueeze(0)  # (1, channels, *spectral)

    def draw_initial(self, rng: np.random.Generator, parameters: np.ndarray) -> np.ndarray:
        seed_field = np.clip(np.abs(draw_initial_field(self.config.initial, self.shape, rng)), 0.0, 1.0)
        return np.stack([1.0 - 0.5 * seed_field, 0.25 * seed_field])
