"""What a dataset is, for the checks that a run and its data belong together: the system, the grid and the
channels. Training refuses a config whose system differs from the one that generated the data; evaluation
refuses data other than the kind the run was trained on (`check_same_data`)."""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any, NamedTuple

from dynaforge.config import Config, ConfigError
from dynaforge.errors import DATA, Blank, RunError, command
from dynaforge.store import DatasetFolder

log = logging.getLogger(__name__)

SHAPE_KEYS = ("name", "ndim", "resolution", "channels", "bodies")
"""`system` keys that decide what a generated dataset holds (its kind, grid and channels); the others
(parameter ranges, dt, steps, ...) may differ between a run's config and its data."""


class DataIdentity(NamedTuple):
    system: str
    space: tuple[int, ...]
    """Grid points along each spatial axis (the bodies for N-body data)."""
    channels: int

    def to_dict(self) -> dict[str, Any]:
        return {"system": self.system, "space": list(self.space), "channels": self.channels}

    @classmethod
    def from_dict(cls, record: dict[str, Any]) -> DataIdentity:
        return cls(str(record["system"]), tuple(int(n) for n in record["space"]), int(record["channels"]))


def data_identity(dataset: DatasetFolder) -> DataIdentity:
    shape = dataset.manifest["shape"]
    return DataIdentity(dataset.system, tuple(int(n) for n in shape["space"]), int(shape["channels"]))


def data_fingerprint(dataset: DatasetFolder) -> str:
    """Which dataset this is, wherever its folder lies: a hash of its shards' names and SHA-256 (a file of
    another tool: its name and size). Evaluation compares it with the run's to tell its own data."""
    if dataset.foreign is not None:
        listed: Any = [dataset.root.name, dataset.root.stat().st_size]
    else:
        listed = sorted((record["file"], record.get("sha256")) for record in dataset.manifest["shards"])
    return hashlib.sha256(json.dumps(listed).encode()).hexdigest()


def check_config_matches_data(config: Config, dataset: DatasetFolder) -> None:
    """Refuse to train `config` on a dataset generated from a config of another system, grid or channel set
    (data converted from other tools carry no config: their shape is checked by the model's build)."""
    try:
        generated_by = dataset.config.system
    except ConfigError:
        return
    differences = [
        f"system.{key}: {getattr(generated_by, key, None)} (data) != {getattr(config.system, key, None)} (config)"
        for key in SHAPE_KEYS
        if getattr(generated_by, key, None) != getattr(config.system, key, None)
    ]
    if differences:
        generate = command("generate", Blank("CONFIG"), out=Blank("DIR"))
        raise RunError(
            f"{dataset.root} was generated for another system than the config describes:\n    "
            + "\n    ".join(differences)
            + f"\n  Train with the dataset's own config ({dataset.root / 'config.yaml'}) and your model and "
            f"train overrides, or generate data for this config with `{generate}`."
        )


MIXTURE_PREFIX = "mixture:"
"""A mixture-trained run's data identity names its members: `mixture:burgers+heat` (`data.mixture`)."""


def mixture_members(system: str) -> list[str]:
    """The systems of an identity's `system`: its members for a mixture, else the system itself."""
    return system.removeprefix(MIXTURE_PREFIX).split("+") if system.startswith(MIXTURE_PREFIX) else [system]


def check_same_data(trained_on: DataIdentity, dataset: DatasetFolder, run: str) -> None:
    """Refuse to evaluate run `run`, trained on data like `trained_on`, on a dataset of another kind.

    A run pretrained on a mixture reads fields of any system on its grid with its channels: it is scored on
    a member's dataset, or zero-shot on another system's (logged), as a model of many systems is meant to be.
    """
    found = data_identity(dataset)
    mixed = trained_on.system.startswith(MIXTURE_PREFIX)
    differences = [
        f"{name}: {theirs} ({dataset.root}) != {ours} (trained on)"
        for name, ours, theirs in zip(DataIdentity._fields, trained_on, found, strict=True)
        if ours != theirs and not (mixed and name == "system")
    ]
    if mixed and not differences and found.system not in mixture_members(trained_on.system):
        log.info(
            "%s was pretrained on %s, not on %s: scoring it zero-shot", run, trained_on.system, found.system
        )
    if differences:
        raise RunError(
            f"{run} was trained on other data than {dataset.root} holds:\n    "
            + "\n    ".join(differences)
            + f"\n  Pass {DATA} with a dataset of the same system, grid and channels."
        )
