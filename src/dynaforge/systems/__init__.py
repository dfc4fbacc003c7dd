"""Ground-truth simulators, all batched on a device, in families: pde/ (periodic PDEs on one spectral core),
random_cnn/ (random neural operators), nbody/ (gravitational N-body). Each is a `SystemBase` subclass keeping
the `System` contract of base.py; `registry.SYSTEMS` lists them and `build_system` picks one by name (or a
user's own system by import path)."""

from __future__ import annotations

from dynaforge.systems.base import System, SystemBase
from dynaforge.systems.nbody.system import NBody
from dynaforge.systems.pde.spectral import SpectralSystem
from dynaforge.systems.registry import SYSTEMS, build_system, conserved_quantities, system_class

__all__ = [
    "SYSTEMS",
    "NBody",
    "SpectralSystem",
    "System",
    "SystemBase",
    "build_system",
    "conserved_quantities",
    "system_class",
]
