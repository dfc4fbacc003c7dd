"""Heat (diffusion) equation on a bounded domain: u_t = nu laplacian(u), boundary conditions per side.

Two time steppers for the same second-order difference Laplacian: explicit Runge-Kutta (`core.integrate`,
the default) or, with `time_stepping: exact`, the semi-discrete solution itself, advanced from frame to
frame in the sine/cosine eigenbasis of the difference Laplacian (`exact.py`): no time error and no step
size bound, one transform per stored frame. With exact stepping, `discretisation: chebyshev` replaces the
difference Laplacian by Chebyshev collocation on Gauss-Lobatto nodes (`chebyshev.py`): geometric convergence,
so far fewer nodes for the same error."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor

from dynaforge.config.base import checked, one_of
from dynaforge.errors import ConfigError
from dynaforge.systems.base import RolloutRun
from dynaforge.systems.batching import LANES, pad_rows
from dynaforge.systems.bounded.chebyshev import unit_nodes
from dynaforge.systems.bounded.core import Stencils
from dynaforge.systems.bounded.exact import SideSeries, exact_heat
from dynaforge.systems.bounded.system import BoundedSystem, DiffusiveBoundedConfig


@dataclass
class HeatBoundedConfig(DiffusiveBoundedConfig):
    """u_t = nu laplacian(u) on [0, L]^d."""

    name: str = "heat_bounded"
    time_stepping: Literal["runge_kutta", "exact"] = checked(
        "runge_kutta", check=one_of("runge_kutta", "exact")
    )
    """`runge_kutta`: `order`'s explicit scheme at `dt`; `exact`: the semi-discrete solution at each stored
    frame (sine/cosine eigenbasis of the difference Laplacian; no time error, any `dt`, `order` unused)."""
    discretisation: Literal["finite_difference", "chebyshev"] = checked(
        "finite_difference", check=one_of("finite_difference", "chebyshev")
    )
    """`finite_difference`: second-order differences on the nodes j L / (n - 1); `chebyshev` (with
    `time_stepping: exact` only): collocation on the Gauss-Lobatto nodes L (1 - cos(pi j / (n - 1))) / 2,
    spectrally accurate for smooth solutions, so far fewer nodes for the same error (docs/bounded.md)."""


class HeatBounded(BoundedSystem):
    name = "heat_bounded"
    config_class = HeatBoundedConfig
    config: HeatBoundedConfig

    def __init__(self, config: HeatBoundedConfig) -> None:
        if config.discretisation == "chebyshev" and config.time_stepping != "exact":
            raise ConfigError(
                "system.discretisation=chebyshev: Chebyshev collocation is stepped exactly in time only; "
                "set system.time_stepping=exact (or system.discretisation=finite_difference)"
            )
        super().__init__(config)

    @property
    def chebyshev(self) -> bool:
        return self.config.discretisation == "chebyshev"

    def unit_nodes(self) -> np.ndarray:
        """The Gauss-Lobatto nodes with `discretisation: chebyshev`, j / (n - 1) otherwise."""
        return unit_nodes(self.config.resolution) if self.chebyshev else super().unit_nodes()

    @property
    def exact(self) -> bool:
        return self.config.time_stepping == "exact"

    @property
    def scheme(self) -> str:
        return "exact time stepping" if self.exact else super().scheme

    def tendency(self, stencils: Stencils, params: dict[str, Tensor]) -> Tensor:
        return stencils.laplacian().mul_(params["diffusivity"])  # into the stage's buffer, on purpose

    def rate_extents(self) -> tuple[float, float]:
        return self.diffusion_extent("diffusivity"), 0.0

    def stability_bound(self) -> float:
        """No bound for exact time stepping; Runge-Kutta's otherwise."""
        return math.inf if self.exact else super().stability_bound()

    def padded_rows(self, device: torch.device) -> int:
        """Exact stepping pads every CPU block to its full size, so that the transforms see one shape whatever
        the batch (`systems/batching.py`); whole lane groups on a GPU."""
        return self.block_samples(device) if device.type == "cpu" else LANES

    def block_stepper(self, run: RolloutRun) -> Callable[[slice], None]:
        if not self.exact:
            return super().block_stepper(run)
        initial, params, steps, save_every, frames, report, _ = run
        names = list(self.parameter_names)
        padded = self.padded_rows(initial.device)

        def run_block(rows: slice) -> None:
            count = rows.stop - rows.start
            block_params = pad_rows(params[rows].to(torch.float64), padded)
            u0 = pad_rows(initial[rows].to(self.real_dtype), padded)

            def column(name: str) -> Tensor:
                return block_params[:, names.index(name)]

            sides = {}
            for side in self.kinds:
                profile = self.side_profile(side, u0.device)
                ones = torch.ones(
                    (padded, 1, *([1] * (self.ndim - 1))), dtype=torch.float64, device=u0.device
                )
                sides[side] = SideSeries(
                    ones if profile is None else ones * profile,
                    column(f"{side}_value"),
                    column(f"{side}_amplitude"),
                    2 * math.pi * column(f"{side}_frequency"),
                )

            def write(frame: int, u: Tensor) -> None:
                frames[rows, frame] = u[:count]

            exact_heat(
                u0,
                column("diffusivity"),
                column("domain_length"),
                self.kinds,
                sides,
                self.boundary_values(block_params, names),
                self.config.dt,
                steps,
                save_every,
                write,
                None if report is None else lambda done: report(count * done),
                frames[rows] if count == padded else None,  # a full block straight into the trajectory
                self.config.discretisation,
            )

        return run_block
