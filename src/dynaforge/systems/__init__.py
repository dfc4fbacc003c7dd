"""Ground-truth simulators, one per file, all batched on a device."""

from __future__ import annotations

from dynaforge.config import NBodyConfig, SystemConfig
from dynaforge.systems.advection import Advection
from dynaforge.systems.burgers import Burgers
from dynaforge.systems.gray_scott import GrayScott
from dynaforge.systems.heat import Heat
from dynaforge.systems.ks import KuramotoSivashinsky
from dynaforge.systems.ks2d import KuramotoSivashinsky2D
from dynaforge.systems.navier_stokes import NavierStokes2D
from dynaforge.systems.nbody import NBody
from dynaforge.systems.random_cnn import RandomCNNSystem
from dynaforge.systems.spectral import SpectralSystem

System = SpectralSystem | RandomCNNSystem | NBody
"""Any simulator `build_system` returns (the store writer takes each of them)."""

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
