"""docs/config.md, the reference of every config key, is what scripts/config_reference.py makes of the code."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path
from types import ModuleType

from dynaforge.config import TrainConfig

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "config_reference.py"


def reference_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("config_reference", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_config_reference_is_current() -> None:
    reference = reference_module()
    assert reference.DOC.read_text() == reference.render(), "run: python scripts/config_reference.py"


def test_every_key_has_its_default_and_a_meaning() -> None:
    reference = reference_module()
    rows = reference.rows(TrainConfig, "train.")
    keys = {key for key, _, _ in rows}
    assert {
        "train.time_budget",
        "train.keep_every",
        "train.optimizer.name",
        "train.schedule.warmup_fraction",
    } <= keys
    assert all(meaning for _, _, meaning in rows)
    by_key = {key: default for key, default, _ in rows}
    assert by_key["train.lr"] == f"`{TrainConfig().lr}`" and by_key["train.time_budget"] == "`null`"
    assert len([f for f in dataclasses.fields(TrainConfig)]) < len(rows)  # nested sections are flattened
