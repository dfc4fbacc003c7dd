"""Which system makes each streamed trajectory: a mixture of systems drawn by (seed, split, index) alone.

Trajectory j of a split is drawn from member s with probability weight_s / sum(weights), by a uniform
number that depends on (dataset.seed, split, j) alone (drawn in chunks of `CHUNK` indices, each chunk from
its own seed). It is then the k-th sample of member s, k the number of earlier trajectories drawn from s,
made by s's own `System.sample_rows` from s's base seed: so a range of trajectories is, for each member,
one contiguous range of that member's samples, generated as one batch, and a trajectory's bytes depend on
its index alone (not on the block, the worker or the process that made it). A stream of one system (no
`mixture` section) is the mixture of `system` alone with base seed `dataset.seed`: its trajectory j is
sample j of the stored dataset, byte for byte.

The members share one model's input: the same spatial grid, the same channels and the same frames per
trajectory (docs/mixture.md); a mixture that cannot share them is refused naming the key to change.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor

from dynaforge.config import Config, ConfigError, SystemConfig
from dynaforge.data.boundary import check_parameter_channels, with_boundary_channels
from dynaforge.data.identity import MIXTURE_PREFIX
from dynaforge.seeds import SPLIT_IDS, Rows
from dynaforge.systems import System, build_system

CHUNK = 4096
"""Trajectories whose members are drawn from one seed (the unit of the prefix counts)."""
MIXTURE_DRAWS = 0x6D6978
"""Spawn-key tags of the draws of members and of the members' base seeds (apart from `seeds`' splits)."""
MIXTURE_SEEDS = 0x6D6979


class Member(NamedTuple):
    system: System
    base_seed: int
    weight: float
    key: str
    """How the config names it (`system`, `mixture[1].system`), for errors."""


def member_seed(seed: int, index: int) -> int:
    """Member `index`'s base seed in a mixture whose `dataset.seed` is `seed`."""
    sequence = np.random.SeedSequence(entropy=seed, spawn_key=(MIXTURE_SEEDS, index))
    return int(sequence.generate_state(1, dtype=np.uint32)[0])


class MixturePlan:
    """The members of a stream and which of them makes each trajectory (see the module docstring)."""

    def __init__(self, members: Sequence[Member], seed: int, parameters: Sequence[str] = ()) -> None:
        self.members = list(members)
        self.seed = seed
        self.parameters = tuple(parameters)
        """Coefficient channels appended to every trajectory (`data.parameter_channels`)."""
        weights = np.array([m.weight for m in self.members], dtype=np.float64)
        self.cumulative = np.cumsum(weights) / weights.sum()
        self.counts: dict[str, list[np.ndarray]] = {}
        """Per split: the members' counts before each chunk (built as far as asked)."""
        first = self.members[0].system
        self.shape, self.channels = tuple(first.shape), first.channels

    @property
    def names(self) -> list[str]:
        return [m.system.name for m in self.members]

    def chunk_members(self, split: str, chunk: int) -> np.ndarray:
        """The member of each trajectory of chunk `chunk` (int64, `CHUNK` of them)."""
        if len(self.members) == 1:
            return np.zeros(CHUNK, dtype=np.int64)
        key = (MIXTURE_DRAWS, SPLIT_IDS[split], chunk)
        uniform = np.random.default_rng(np.random.SeedSequence(entropy=self.seed, spawn_key=key)).random(
            CHUNK
        )
        drawn = np.searchsorted(self.cumulative, uniform, side="right")
        return np.minimum(drawn, len(self.members) - 1).astype(np.int64)

    def members_of(self, split: str, start: int, stop: int) -> np.ndarray:
        """The member of each trajectory of [start, stop)."""
        chunks = range(start // CHUNK, -(-stop // CHUNK))
        drawn = np.concatenate([self.chunk_members(split, c) for c in chunks]) if chunks else np.zeros(0)
        offset = chunks.start * CHUNK
        return drawn[start - offset : stop - offset].astype(np.int64)

    def counts_before(self, split: str, index: int) -> np.ndarray:
        """How many trajectories of [0, index) each member makes."""
        counts = self.counts.setdefault(split, [np.zeros(len(self.members), dtype=np.int64)])
        chunk = index // CHUNK
        while len(counts) <= chunk:
            drawn = self.chunk_members(split, len(counts) - 1)
            counts.append(counts[-1] + np.bincount(drawn, minlength=len(self.members)))
        within = self.members_of(split, chunk * CHUNK, index)
        return counts[chunk] + np.bincount(within, minlength=len(self.members))

    def rows(
        self, split: str, start: int, stop: int, device: torch.device
    ) -> Float[Tensor, "n time channels *space"]:
        """Trajectories [start, stop) of `split`, (n, T, C, *space) float32 on `device`: per member, one
        batch of its consecutive samples; with the coefficient channels `parameters` appended (each
        sample's value, 0 for a member without that parameter: `dynaforge.data.boundary`)."""
        which = self.members_of(split, start, stop)
        first = self.counts_before(split, start)
        parts, positions = [], []
        for s in np.unique(which):
            at = np.flatnonzero(which == s)
            member = self.members[s]
            rows = Rows(split, int(first[s]), int(first[s]) + len(at), member.base_seed)
            sampled = member.system.sample_rows(rows, device)
            names = member.system.parameter_names
            parts.append(with_boundary_channels(sampled.fields, sampled.params, names, (), self.parameters))
            positions.append(at)
        order = torch.from_numpy(np.argsort(np.concatenate(positions), kind="stable"))
        return torch.cat(parts)[order.to(device)]


def mixture_plan(config: Config) -> MixturePlan:
    """The members `config` streams (`mixture`, else `system` alone), checked to share one model's input
    and to record the coefficients it gives as channels (`data.parameter_channels`)."""
    if not config.mixture:
        member = Member(stream_system(config.system, "system"), config.dataset.seed, 1.0, "system")
        return checked_plan(MixturePlan([member], config.dataset.seed, config.data.parameter_channels))
    members = [
        Member(
            stream_system(m.system, f"mixture[{i}].system"),
            member_seed(config.dataset.seed, i),
            m.weight,
            f"mixture[{i}].system",
        )
        for i, m in enumerate(config.mixture)
    ]
    check_shared_input(members, [m.system for m in config.mixture])
    return checked_plan(MixturePlan(members, config.dataset.seed, config.data.parameter_channels))


def checked_plan(plan: MixturePlan) -> MixturePlan:
    """`plan`, its coefficient channels checked against its members' parameters (`check_parameter_channels`)."""
    if plan.parameters:
        systems = [(m.system.name, m.system.parameter_names) for m in plan.members]
        check_parameter_channels(plan.parameters, systems)
    return plan


def stream_system(system_config: SystemConfig, key: str) -> System:
    """The simulator a stream runs for the section at `key`."""
    control = getattr(system_config, "control", None)
    if system_config.name == "nbody" and control is not None and control.kind == "learned":
        raise ConfigError(
            f"data.source=stream cannot run a learned step controller ({key}.control.kind=learned); "
            "generate a dataset and train on it"
        )
    return build_system(system_config)


def check_shared_input(members: Sequence[Member], configs: Sequence[SystemConfig]) -> None:
    """Refuse members whose fields one model cannot read together: another grid, channel count or number of
    frames than the first member's (docs/mixture.md)."""
    first, first_config = members[0], configs[0]
    for member, config in zip(members[1:], configs[1:], strict=True):
        differences = []
        if tuple(member.system.shape) != tuple(first.system.shape):
            differences.append(
                f"grid {tuple(member.system.shape)} != {tuple(first.system.shape)} (set {member.key}.resolution"
                f"{' and .ndim' if len(member.system.shape) != len(first.system.shape) else ''} to "
                f"{first_config.resolution})"
            )
        if member.system.channels != first.system.channels:
            differences.append(
                f"{member.system.channels} channel(s) != {first.system.channels}: a mixture's systems have the "
                "same channels (mix systems of one channel count)"
            )
        if config.n_frames != first_config.n_frames:
            differences.append(
                f"{config.n_frames} frames != {first_config.n_frames} (set {member.key}.steps / "
                f"{member.key}.save_every to give {first_config.n_frames} frames)"
            )
        if differences:
            raise ConfigError(
                f"{member.key} ({member.system.name}) cannot share the model's input with {first.key} "
                f"({first.system.name}): " + "; ".join(differences)
            )


def mixture_name(plan: MixturePlan) -> str:
    """The data identity's system name: the system's, or `mixture:a+b+c`."""
    names = plan.names
    return names[0] if len(names) == 1 else MIXTURE_PREFIX + "+".join(names)


def expected_share(plan: MixturePlan) -> list[float]:
    """Each member's probability of making a trajectory."""
    return list(np.diff(np.concatenate([[0.0], plan.cumulative])))
