"""Every system dynaforge knows, in one dict, and the one way a config's `system.name` becomes a class.

A system is one module: its config dataclass, its physics and what it conserves, declared together on a
`SystemBase` subclass (`systems/pde/burgers.py`); adding one is a module, a line in `SYSTEMS`, a preset and a
test. A user's own system is named in YAML by import path, `system.name: mypackage.pdes:SwiftHohenberg`,
and is used only if the path leads to a subclass of `SystemBase`, checked before anything of the class is
called (docs/user-systems.md). The config layer, which sits below this one, reaches `system_class` by name
(`dynaforge.config.systems.system_config_class`; docs/architecture.md says why).
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.machinery
import importlib.util
import re
import sys
import traceback
from typing import Any

from dynaforge.config import NBodyConfig, SystemConfig
from dynaforge.errors import ConfigError
from dynaforge.systems.base import System, SystemBase
from dynaforge.systems.bounded.advection_diffusion import AdvectionDiffusionBounded
from dynaforge.systems.bounded.burgers import BurgersBounded
from dynaforge.systems.bounded.fisher_kpp import FisherKPPBounded
from dynaforge.systems.bounded.heat import HeatBounded
from dynaforge.systems.elliptic.darcy import Darcy
from dynaforge.systems.flow.cavity import LidDrivenCavity
from dynaforge.systems.flow.cylinder import CylinderFlow
from dynaforge.systems.nbody.system import NBody
from dynaforge.systems.pde.advection import Advection
from dynaforge.systems.pde.burgers import Burgers
from dynaforge.systems.pde.gray_scott import GrayScott
from dynaforge.systems.pde.heat import Heat
from dynaforge.systems.pde.ks import KuramotoSivashinsky
from dynaforge.systems.pde.ks2d import KuramotoSivashinsky2D
from dynaforge.systems.pde.navier_stokes import NavierStokes2D
from dynaforge.systems.random_cnn.system import RandomCNNSystem

SYSTEMS: dict[str, type[SystemBase]] = {
    Heat.name: Heat,
    Advection.name: Advection,
    Burgers.name: Burgers,
    KuramotoSivashinsky.name: KuramotoSivashinsky,
    NavierStokes2D.name: NavierStokes2D,
    GrayScott.name: GrayScott,
    KuramotoSivashinsky2D.name: KuramotoSivashinsky2D,
    RandomCNNSystem.name: RandomCNNSystem,
    NBody.name: NBody,
    Darcy.name: Darcy,
    LidDrivenCavity.name: LidDrivenCavity,
    CylinderFlow.name: CylinderFlow,
    HeatBounded.name: HeatBounded,
    AdvectionDiffusionBounded.name: AdvectionDiffusionBounded,
    BurgersBounded.name: BurgersBounded,
    FisherKPPBounded.name: FisherKPPBounded,
}
"""`system.name` -> the class of dynaforge's own systems (each carries `config_class` and `conserved`)."""

IMPORT_PATH = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
"""`package.module:Class` (the object may be nested: `module:Outer.Inner`)."""

USER_SYSTEMS_DOC = "docs/user-systems.md"


def is_import_path(name: str) -> bool:
    """Whether `system.name` names a user's system by import path rather than one of `SYSTEMS`."""
    return name not in SYSTEMS and ":" in name


def providing_package(name: str) -> str:
    """The top-level package an import path's module belongs to (`mypackage.pdes:X` -> `mypackage`)."""
    return name.partition(":")[0].split(".")[0]


def failed_at(error: BaseException) -> str:
    """' at FILE:LINE' of where an import failed: the offending line of a syntax error, else the innermost frame."""
    if isinstance(error, SyntaxError) and error.filename:
        return f" at {error.filename}:{error.lineno}"
    frames = traceback.extract_tb(error.__traceback__)
    return f" at {frames[-1].filename}:{frames[-1].lineno}" if frames else ""


def system_class(name: str, key: str = "system.name") -> type[SystemBase]:
    """The class `name` stands for: one of `SYSTEMS`, or a user's `package.module:Class`.

    An import path's module is imported (its top-level code runs: the trust model of docs/user-systems.md),
    then the object it names is refused with a `ConfigError` unless it is a subclass of `SystemBase` whose
    `config_class` is a `SystemConfig` dataclass; nothing of the object is called before that. `key` is the
    config key named in errors.
    """
    if name in SYSTEMS:
        return SYSTEMS[name]
    if ":" not in name:
        valid = ", ".join(sorted(SYSTEMS))
        raise ConfigError(
            f"unknown system {key}={name!r}; valid systems: {valid}, or a system of your own named by import "
            f"path, 'package.module:Class' ({USER_SYSTEMS_DOC})"
        )
    if not IMPORT_PATH.fullmatch(name):
        raise ConfigError(
            f"{key}={name!r} is not an import path of the form 'package.module:Class' ({USER_SYSTEMS_DOC})"
        )
    module_name, _, attribute = name.partition(":")
    package = providing_package(name)
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:  # ModuleNotFoundError too: the package is not installed, or not on the path
        raise ConfigError(
            f"{key}={name!r}: cannot import {module_name!r} ({error}); the system would come from the "
            f"package {package!r}: pip install {package}, or put it on PYTHONPATH"
        ) from None
    except Exception as error:  # the module's own code failed: its package's bug, not dynaforge's
        raise ConfigError(
            f"{key}={name!r}: importing {module_name!r} raised {type(error).__name__}: {error}{failed_at(error)}; "
            f"the fault is in the package {package!r}, not in dynaforge "
            f"(python -c 'import {module_name}' shows the traceback)"
        ) from error
    found: Any = module
    for part in attribute.split("."):
        found = getattr(found, part, None)
        if found is None:
            raise ConfigError(
                f"{key}={name!r}: module {module_name!r} (package {package!r}) has no {attribute!r}; "
                f"is the package {package!r} the version that provides it? (pip install -U {package})"
            )
    if not (isinstance(found, type) and issubclass(found, SystemBase)):
        raise ConfigError(
            f"{key}={name!r} names {kind_of(found)} from the package {package!r}, not a dynaforge system: a "
            f"config may only name a subclass of dynaforge.systems.base.SystemBase (refused before anything "
            f"of it was called; {USER_SYSTEMS_DOC})"
        )
    config_class = getattr(found, "config_class", None)
    if not (isinstance(config_class, type) and issubclass(config_class, SystemConfig)):
        raise ConfigError(
            f"{key}={name!r}: {found.__qualname__}.config_class must be a dataclass deriving "
            f"dynaforge.config.SystemConfig, got {config_class!r} ({USER_SYSTEMS_DOC})"
        )
    return found


def kind_of(found: Any) -> str:
    """`a function (os.system)`, `a class (collections.OrderedDict)`, ...: what an import path led to."""
    if isinstance(found, type):
        return f"a class ({found.__module__}.{found.__qualname__})"
    if callable(found):
        where = f"{getattr(found, '__module__', None) or '?'}.{getattr(found, '__qualname__', '?')}"
        return f"a function ({where})"
    if isinstance(found, type(sys)):
        return f"a module ({found.__name__})"
    return f"a {type(found).__name__} value"


def system_config_class(name: str, key: str = "system.name") -> type[SystemConfig] | type[NBodyConfig]:
    """The dataclass of the `system` section for `system.name` (what the config loader builds)."""
    config_class = system_class(name, key).config_class
    if not dataclasses.is_dataclass(config_class):
        raise ConfigError(f"{key}={name!r}: its config_class {config_class!r} is not a dataclass")
    return config_class


def build_system(config: SystemConfig | NBodyConfig) -> System:
    """The simulator named by `config.name`, set up from its config."""
    return system_class(config.name)(config)  # type: ignore[call-arg]  # each class checks its config type


def conserved_quantities(name: str) -> tuple[str, ...]:
    """What the rollouts of system `name` conserve (`SystemBase.conserved`). A user's system answers once
    its module is imported (loading the config that names it imports it); this never imports anything, so
    the names of converted datasets (`pdebench:1D_Advection`) and unknown names conserve nothing checked."""
    if name in SYSTEMS:
        return SYSTEMS[name].conserved
    if is_import_path(name) and name.partition(":")[0] in sys.modules:
        try:
            return system_class(name).conserved
        except ConfigError:
            return ()
    return ()


def module_origin(module_name: str) -> str | None:
    """The file module `module_name` would be imported from, found without running any of its code (None
    when it is not found). A submodule is looked up in its parent's folders, not by importing the parent."""
    if module_name in sys.modules:
        return getattr(sys.modules[module_name], "__file__", None) or "(already imported)"
    top, *rest = module_name.split(".")
    try:
        spec = importlib.util.find_spec(top)  # for a top-level name this runs no code of the package
    except (ImportError, ValueError):
        return None
    for depth in range(len(rest)):
        if spec is None or spec.submodule_search_locations is None:
            return None
        dotted = ".".join([top, *rest[: depth + 1]])
        spec = importlib.machinery.PathFinder.find_spec(dotted, list(spec.submodule_search_locations))
    return None if spec is None else spec.origin


def system_code(name: str) -> str | None:
    """`system code: mypackage.pdes:SwiftHohenberg (imported from /path/pdes.py)` for a config naming a
    user's system (None for dynaforge's own): what `verify` and `inspect` print before importing it."""
    if not is_import_path(name):
        return None
    origin = module_origin(name.partition(":")[0])
    where = (
        f"imported from {origin}"
        if origin
        else f"not found here; it would come from the package {providing_package(name)!r}"
    )
    return f"system code: {name} ({where})"
