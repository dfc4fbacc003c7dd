"""A dataset is its config: the same config and seed give the same bytes whatever the batch size, the shard
split and the torch thread count, for every family of systems; `dynaforge verify` checks it."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import h5py
import numpy as np
import pytest
import torch

from dynaforge.config import Config, load_config
from dynaforge.generate import generate
from dynaforge.seeds import SPLITS

from ..conftest import CONFIGS, RANDOM_CNN_TINY

FAMILIES = {
    "burgers_1d": (CONFIGS / "tiny.yaml", ["system.resolution=100"]),
    "cavity": (CONFIGS / "cavity.yaml", ["system.resolution=32", "system.steps=6", "system.save_every=3"]),
    "cylinder": (
        CONFIGS / "cylinder.yaml",
        ["system.resolution=12", "system.spin_up=1", "system.steps=2", "system.save_every=1"],
    ),
    "navier_stokes_2d": (
        CONFIGS / "ns2d-tiny.yaml",
        ["system.resolution=64", "system.steps=8"],
    ),  # 24 x 24 hid the FFT batch dependence
    "random_cnn": (
        None,
        [*RANDOM_CNN_TINY, "system.features=true"],
    ),
    # 40 steps of the adaptive control (the preset's 100 took 33 s of the suite for the same check)
    "darcy": (CONFIGS / "darcy.yaml", ["system.resolution=9", "system.refinement=2", "system.modes=8"]),
    "nbody": (
        CONFIGS / "nbody_tiny.yaml",
        ["system.bodies=3", "system.initial.family=plummer", "system.steps=40"],
    ),
}
"""Tiny presets of each family: a 1D PDE, a 2D PDE, random CNN operators, Darcy (each sample's CG stops on
its own residual), N-body (adaptive steps)."""

SPLIT_SIZES = {"train": 7, "val": 5, "test": 3}
"""Odd split sizes: with shard size 3 the train split is cut into 3 shards, with 16 into one."""

VARIANTS = {
    # name: (batch size, shard size, torch threads)
    "batch 16, 1 shard, 1 thread": (16, 16, 1),
    "batch 5, 3 shards, 2 threads": (5, 3, 2),
    "batch 1, 3 shards, 1 thread": (1, 3, 1),
    "batch 16, 1 shard, 2 threads": (16, 16, 2),
}


def family_config(family: str, batch: int, shard: int) -> Config:
    path, overrides = FAMILIES[family]
    scale = 3 if family == "random_cnn" else 1  # random CNN rows are whole operators of 3 realizations
    sizes = [f"dataset.n_{split}={n * scale}" for split, n in SPLIT_SIZES.items()]
    layout = [f"dataset.batch_size={batch * scale}", f"dataset.shard_size={shard * scale}"]
    return load_config(path, [*overrides, *sizes, *layout])


@pytest.fixture
def threads() -> Iterator[None]:
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def dataset_arrays(root: Path) -> dict[str, np.ndarray]:
    """Every array of every shard, concatenated per split and name (a dimension scale, e.g. `time` or
    `channel`, is the same in every shard: taken from the first), plus the statistics."""
    arrays: dict[str, list[np.ndarray]] = {}
    for split in SPLITS:
        for path in sorted((root / split).glob("shard-*.h5")):
            with h5py.File(path, "r") as h5:
                for name, dataset in h5.items():
                    if name == "sample":
                        continue  # a dimension scale without values (docs/format.md, "Labels")
                    if dataset.shape and dataset.shape[0] and not dataset.is_scale and name != "param_names":
                        arrays.setdefault(f"{split}/{name}", []).append(dataset[...])
                    else:
                        arrays.setdefault(f"{split}/{name}", [dataset[...]])
    manifest = json.loads((root / "manifest.json").read_text())
    out = {name: np.concatenate(parts) if len(parts) > 1 else parts[0] for name, parts in arrays.items()}
    out["stats"] = np.asarray([manifest["stats"][key] for key in ("mean", "std", "min", "max")])
    hashes = [h for s in manifest["shards"] for h in s["sample_sha256"]]
    out["sample_sha256"] = np.asarray(hashes)
    return out


@pytest.mark.reproducibility
@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_generation_is_the_same_bytes_for_any_batch_size_shard_split_and_thread_count(
    family: str, tmp_path: Path, threads: None
) -> None:
    made = {}
    for name, (batch, shard, n_threads) in VARIANTS.items():
        torch.set_num_threads(n_threads)
        root = tmp_path / name.replace(" ", "_").replace(",", "")
        generate(family_config(family, batch, shard), root, progress=False)
        made[name] = dataset_arrays(root)
    first_name, first = next(iter(made.items()))
    assert len(list((tmp_path / "batch_5_3_shards_2_threads" / "train").glob("*.h5"))) == 3
    assert first["train/fields"].shape[0] == SPLIT_SIZES["train"] * (3 if family == "random_cnn" else 1)
    for name, arrays in made.items():
        assert arrays.keys() == first.keys(), name
        for key, values in arrays.items():
            assert values.dtype == first[key].dtype and np.array_equal(values, first[key]), (
                f"{family}: {key} differs between '{first_name}' and '{name}'"
            )


# ---- dynaforge verify -------------------------------------------------------------------------------


@pytest.fixture
def tiny_dataset(tmp_path: Path) -> Path:
    root = tmp_path / "data"
    generate(family_config("burgers_1d", 5, 3), root, progress=False)
    return root


def alter_sample(root: Path, shard: str, local: int, delta: float, rerecord: bool) -> None:
    """Add `delta` to one stored value; with `rerecord`, also record the altered sample's hash (as if a
    different solver had written it), so that only regenerating it can tell."""
    with h5py.File(root / shard, "r+") as h5:
        h5["fields"][local, 3, 10, 0] += delta
        fields, params = h5["fields"][local], h5["params"][local]
    if not rerecord:
        return
    from dynaforge.store.format import sample_sha256

    record_path = (root / shard).with_suffix(".json")
    record = json.loads(record_path.read_text())
    record["sample_sha256"][local] = sample_sha256(fields, params)
    record_path.write_text(json.dumps(record))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["shards"] = [
        record | {"complete": True} if s["file"] == record["file"] else s for s in manifest["shards"]
    ]
    (root / "manifest.json").write_text(json.dumps(manifest))


def verify(*args: str) -> tuple[int, str]:
    import contextlib
    import io

    from dynaforge.cli import main

    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(["verify", *args])
    return code, out.getvalue()


@pytest.mark.reproducibility
def test_verify_passes_on_a_fresh_dataset(tiny_dataset: Path) -> None:
    code, out = verify(str(tiny_dataset), "--samples", "all")
    assert code == 0, out
    assert out.count(": identical") == sum(SPLIT_SIZES.values())
    assert "made on: " in out and "OK: 15 sample(s) regenerated, all identical" in out
    code, out = verify(str(tiny_dataset), "--samples", "2", "--seed", "3", "--json")
    result = json.loads(out)
    assert code == 0 and result["ok"] and len(result["samples"]) == 6
    assert result["made_on"][0]["cpu"] == result["checked_on"]["cpu"]


def test_verify_names_a_sample_altered_after_generation(tiny_dataset: Path) -> None:
    alter_sample(tiny_dataset, "train/shard-00001.h5", 1, 1e-6, rerecord=False)  # train sample 4
    code, out = verify(str(tiny_dataset), "--samples", "all")
    assert code == 2
    assert "train/4 (train/shard-00001.h5): FAIL, the stored sample no longer matches the hash" in out
    assert "FAILED verification: 1 of 15 sample(s) do not match: train/4" in out


def test_verify_fails_a_sample_that_regenerates_differently_unless_within_tolerance(
    tiny_dataset: Path,
) -> None:
    alter_sample(tiny_dataset, "val/shard-00000.h5", 2, 2e-6, rerecord=True)  # val sample 2, |u| <= 1
    code, out = verify(str(tiny_dataset), "--samples", "all")
    assert code == 2
    assert "val/2 (val/shard-00000.h5): FAIL, differs: max |difference| 2e-06" in out
    assert "pass --tolerance" in out
    code, out = verify(str(tiny_dataset), "--samples", "all", "--tolerance", "1e-5")
    assert code == 0, out
    assert "val/2 (val/shard-00000.h5): within tolerance 1e-05" in out
    code, out = verify(str(tiny_dataset), "--samples", "all", "--tolerance", "1e-7")
    assert code == 2


def test_verify_regenerates_whole_random_cnn_operators(tmp_path: Path) -> None:
    root = tmp_path / "cnn"
    generate(family_config("random_cnn", 5, 3), root, progress=False)
    code, out = verify(str(root), "--samples", "2", "--seed", "0")
    assert code == 0, out
    assert out.count(": identical") == 6


def test_auto_precision_is_the_one_the_dataset_was_made_with_on_any_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A random CNN dataset made with `precision: auto` where bf16 matrix units exist (bfloat16) is verified
    in bfloat16, and not resumed in float32, on a machine without them."""
    from dynaforge.store.format import DatasetError
    from dynaforge.systems.random_cnn import grouped

    root = tmp_path / "cnn"
    config = family_config("random_cnn", 5, 3)
    assert config.system.precision == "auto"
    monkeypatch.setattr(grouped, "has_bf16_matrix_units", lambda device="cpu": True)
    generate(config, root, progress=False)
    manifest = json.loads((root / "manifest.json").read_text())
    assert manifest["identity"]["system"]["precision"] == "bfloat16"
    monkeypatch.setattr(grouped, "has_bf16_matrix_units", lambda device="cpu": False)
    code, out = verify(str(root), "--samples", "2", "--seed", "0")
    assert code == 0, out
    assert out.count(": identical") == 6
    with pytest.raises(DatasetError, match=r"system\.precision"):
        generate(config, root, progress=False)


def test_verify_refuses_what_it_cannot_check(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from dynaforge.cli import main

    assert main(["verify", str(tmp_path / "missing")]) == 2
    assert "error: " in capsys.readouterr().err
    assert main(["verify", str(tmp_path), "--samples", "none"]) == 2
    assert "--samples must be a positive number or 'all'" in capsys.readouterr().err
