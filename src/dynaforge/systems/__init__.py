"""Ground-truth simulators, all batched on a device, in families: pde/ (periodic PDEs on one spectral core),
random_cnn/ (random neural operators), nbody/ (gravitational N-body). Each keeps the `System` contract of
base.py; `build_system` picks one by name."""

from __future__ import annotations

from dynaforge.config import NBodyConfig, SystemConfig
from dynaforge.systems.base import System
from dynaforge.systems.nbody.system import NBody
from dynaforge.systems.pde.advection import Advection
from dynaforge.systems.pde.burgers import Burgers
from dynaforge.systems.pde.gray_scott import GrayScott
from dynaforge.systems.pde.heat import Heat
from dynaforge.systems.pde.ks import KuramotoSivashinsky
from dynaforge.systems.pde.ks2d import KuramotoSivashinsky2D
from dynaforge.systems.pde.navier_stokes import NavierStokes2D
from dynaforge.systems.pde.spectral import SpectralSystem
from dynaforge.systems.random_cnn.system import RandomCNNSystem

SYSTEMS: dict[str, type[SpectralSystem] | type[RandomCNNSystem] | type[NBody]] = {
    "heat": Heat,
    "advection": Advection,
    "burgers": Burgers,
    "ks": KuramotoSivashinsky,
    "navier_stokes": NavierStokes2D,
    "gray_scott": GrayScott,
    "ks2d": KuramotoSivashinsky2D,
    "random_cnn": RandomCNNSystem,
    "nbody": NBody,
}


def build_system(config: SystemConfig | NBodyConfig) -> System:
    """The simulator named by `config.name`, set up from its config."""
    if config.name not in SYSTEMS:
        raise ValueError(f"unknown system {config.name!r}; valid: {', '.join(sorted(SYSTEMS))}")
    return SYSTEMS[config.name](config)  # type: ignore[arg-type]  # each class checks its config type


__all__ = ["SYSTEMS", "NBody", "SpectralSystem", "System", "build_system"]
