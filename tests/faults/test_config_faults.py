"""Config faults: values outside their declared range are refused when the config loads, naming the dotted key,
the value and the valid range; a generated batch holding NaN or Inf stops generation and is never recorded
as complete."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.config import ConfigError, Range, load_config
from dynaforge.seeds import Rows
from dynaforge.store.format import DatasetError
from dynaforge.store.writer import check_finite
from dynaforge.systems.base import SampleRows
from tests.conftest import CONFIGS, run_cli
from tests.faults.conftest import fails_cleanly

TINY = str(CONFIGS / "tiny.yaml")


@pytest.mark.parametrize("preset", sorted(CONFIGS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_preset_loads(preset: Path) -> None:
    load_config(preset)


def test_negative_viscosity_is_refused_before_anything_is_written(tmp_path: Path) -> None:
    out = tmp_path / "data"
    result = run_cli("generate", TINY, "system.viscosity.low=-0.01", "--out", str(out), check=False)
    line = fails_cleanly(result, "system.viscosity.low", "-0.01", "> 0")
    assert "reduce dt" not in line
    assert not out.exists()


def test_empty_train_split_is_refused_at_load(tmp_path: Path) -> None:
    out = tmp_path / "data"
    result = run_cli("generate", TINY, "dataset.n_train=0", "--out", str(out), check=False)
    fails_cleanly(result, "dataset.n_train", ">= 1")
    assert not out.exists()


def test_run_with_an_empty_val_split_is_refused_before_generating(tmp_path: Path) -> None:
    root = tmp_path / "root"
    result = run_cli("run", TINY, "dataset.n_val=0", "--out", str(root), check=False)
    fails_cleanly(result, "dataset.n_val", "> 0")
    assert not (root / "data").exists()


def test_diverging_solver_stops_generation_and_nothing_non_finite_is_complete(tmp_path: Path) -> None:
    # Valid values, but a time step 50x too large for Burgers at nu = 1e-4 on 64 points: the explicit
    # nonlinear term blows up within the 20 steps.
    out = tmp_path / "data"
    args = ("system.dt=0.5", "system.viscosity=0.0001")
    load_config(TINY, args)  # passes the range checks
    result = run_cli("generate", TINY, *args, "--out", str(out), "--no-progress", check=False)
    fails_cleanly(
        result, "NaN or Inf", "train split", "viscosity=0.0001", "system.dt=0.5", "reduce system.dt"
    )
    manifest_path = out / "manifest.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        assert manifest["complete"] is False
        assert not any(shard["complete"] for shard in manifest["shards"])
    for record_path in out.rglob("*.json"):
        if record_path.name == "manifest.json":
            continue
        moments = json.loads(record_path.read_text()).get("moments", {})
        assert all(math.isfinite(v) for key in ("mean", "m2", "min", "max") for v in moments.get(key, []))
    assert not list(out.rglob("shard-*.h5"))


def test_non_finite_sample_with_a_parameter_out_of_range_names_the_parameter() -> None:
    config = load_config(TINY)
    config.system.viscosity = Range(-0.5, -0.5)  # past the load checks, as a config edited in code would be
    fields = np.zeros((2, 3, 8, 1), dtype=np.float32)
    fields[1, 2, 4, 0] = np.inf
    rows = SampleRows(torch.from_numpy(fields), np.asarray([[1.0, -0.5], [1.0, -0.5]]), np.arange(3.0), {})
    with pytest.raises(DatasetError) as error:
        check_finite(rows, Rows("val", 4, 6, 0), ("domain_length", "viscosity"), config)
    message = str(error.value)
    assert "sample 5 of the val split" in message
    assert "system.viscosity=-0.5 is outside its physical range" in message and "> 0" in message
    assert "system.dt" not in message


@pytest.mark.parametrize(
    ("override", "names"),
    [
        ("system.dt=0", ("system.dt=0.0", "> 0")),  # positive
        ("system.steps=0", ("system.steps=0", ">= 1")),  # at least one
        ("system.order=5", ("system.order=5", "1, 2, 3 or 4")),  # a set
        ("system.viscosity=-1", ("system.viscosity.low=-1.0", "> 0")),  # a Range (both ends; low first)
        ("train.schedule.min_lr_ratio=1.5", ("train.schedule.min_lr_ratio=1.5", "in [0, 1]")),  # a fraction
        ("train.optimizer.betas=[0.9,1.0]", ("train.optimizer.betas[1]=1.0", "in [0, 1)")),  # list items
        ("train.grad_clip=-1", ("train.grad_clip=-1.0", "> 0")),  # optional, set
        ("dataset.shard_size=0", ("dataset.shard_size=0", ">= 1")),
        ("data.batch_size=0", ("data.batch_size=0", ">= 1")),
        ("train.lr=0", ("train.lr=0.0", "> 0")),
        ("train.epochs=0", ("train.epochs=0", ">= 1")),
        ("system.initial.families={fourier: -1}", ("system.initial.families.fourier=-1.0", ">= 0")),  # dict
        ("system.dt=.inf", ("system.dt=inf", "finite")),
    ],
)
def test_range_checks_name_the_key_the_value_and_the_range(override: str, names: tuple[str, ...]) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(TINY, [override])
    for name in names:
        assert name in str(error.value), f"{name!r} not in {error.value}"


@pytest.mark.parametrize(
    ("preset", "override", "name"),
    [
        ("nbody_tiny.yaml", "system.softening.low=-0.1", "system.softening.low"),
        ("ns2d-tiny.yaml", "system.viscosity=0", "system.viscosity.low"),
        ("gray_scott.yaml", "system.diffusion_v=-1e-5", "system.diffusion_v.low"),
        ("two_phase_tiny.yaml", "twophase.momentum=1.0", "twophase.momentum"),
        (
            "nbody_controller.yaml",
            "timestepper.systems.cluster_bodies=[4,1]",
            "timestepper.systems.cluster_bodies[1]",
        ),
        (
            "tiny-latent.yaml",
            "stages.diffusion_residual.val_samples=1",
            "stages.diffusion_residual.val_samples",
        ),
        ("tiny-tune.yaml", "tune.pruner.percentile=100", "tune.pruner.percentile"),
    ],
)
def test_range_checks_cover_every_section(preset: str, override: str, name: str) -> None:
    with pytest.raises(ConfigError, match="must be") as error:
        load_config(CONFIGS / preset, [override])
    assert str(error.value).startswith(name), str(error.value)
