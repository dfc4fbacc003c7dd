"""The `mixture` section: several systems whose trajectories one stream draws, each with a weight.

An empty list (the default) streams `system` alone. A mixture trains from the stream only
(`data.source: stream`); docs/mixture.md says how its systems share one model's input (the same grid,
channels and frames: a mixture that cannot share them is refused with the key to change).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

from dynaforge.config.base import NON_NEGATIVE, ConfigError, check_values, checked
from dynaforge.config.nbody import NBodyConfig
from dynaforge.config.systems import DEFAULT_SYSTEM, SystemConfig, system_config_class


def default_member_system() -> SystemConfig:
    """`DEFAULT_SYSTEM` with its defaults (a member written without a `system`)."""
    return system_config_class(DEFAULT_SYSTEM)()


@dataclass
class MixtureMember:
    """One system of a mixture: a `system` section as the top-level one, and its share of the trajectories."""

    system: SystemConfig | NBodyConfig = field(default_factory=default_member_system)
    """The system and its parameter ranges, written as the top-level `system` section (a grid system)."""
    weight: float = checked(1.0, check=NON_NEGATIVE.because("a share of the drawn trajectories"))
    """Relative share of the stream's trajectories drawn from this system (the weights need not sum to 1;
    their sum must be positive)."""

    def __post_init__(self) -> None:
        check_values(self)


def check_mixture(members: Sequence[MixtureMember]) -> None:
    """Refuse a mixture whose weights do not sum to a positive number, or with a member that is not a grid
    system (the checks that need the systems built are the stream's: `dynaforge.data.mixture`)."""
    if not members:
        return
    for index, member in enumerate(members):
        if not isinstance(member.system, SystemConfig):
            raise ConfigError(
                f"mixture[{index}].system.name={member.system.name!r} is not a grid system; a mixture draws "
                "fields on a grid (drop it from the mixture, or train it on its own)"
            )
    total = math.fsum(member.weight for member in members)
    if not total > 0:
        raise ConfigError(
            f"mixture weights sum to {total:g}; give at least one system a weight > 0 "
            "(mixture[i].weight: each system's relative share of the trajectories)"
        )
