"""The one list of systems: each entry is a `SystemBase` subclass carrying its config dataclass (whose
default `name` is the entry's) and what it conserves; the config layer finds every section through it."""

from __future__ import annotations

import dataclasses

import pytest

from dynaforge.config import DEFAULT_SYSTEM, ConfigError, load_config, system_config_class
from dynaforge.systems import SYSTEMS, SystemBase, conserved_quantities
from dynaforge.systems.registry import system_code


@pytest.mark.parametrize("name", sorted(SYSTEMS))
def test_each_system_carries_its_section_and_what_it_conserves(name: str) -> None:
    system = SYSTEMS[name]
    assert issubclass(system, SystemBase) and system.name == name
    assert dataclasses.is_dataclass(system.config_class) and system.config_class().name == name
    assert system_config_class(name) is system.config_class
    assert set(system.conserved) <= {"mass", "energy"}
    assert type(load_config(None, [f"system.name={name}"]).system) is system.config_class


def test_the_default_system_is_registered() -> None:
    assert type(load_config(None).system) is SYSTEMS[DEFAULT_SYSTEM].config_class


def test_foreign_and_unknown_names_conserve_nothing_and_import_nothing() -> None:
    assert conserved_quantities("burgers") == ("mass",)
    assert conserved_quantities("pdebench:1D_Advection") == ()
    assert conserved_quantities("nosuchpkg.pdes:X") == ()
    assert system_code("burgers") is None


def test_a_name_that_is_not_a_string_is_refused() -> None:
    with pytest.raises(ConfigError, match=r"system\.name must be a string"):
        load_config(None, ["system.name=3"])
