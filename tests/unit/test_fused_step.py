"""`system.fused: true`: the ETDRK step with its elementwise stages compiled by inductor (fused.py) gives the
numbers of the eager step, and the same bytes for a sample whatever its batch and the thread count."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.config import load_config
from dynaforge.errors import ConfigError
from dynaforge.generate import generate
from dynaforge.systems import build_system
from dynaforge.systems.pde.fused import fused_etd_step, fused_step_guarantees
from dynaforge.systems.pde.spectral import SpectralSystem, etd_step

from ..conftest import CONFIGS
from ..integration.test_reproducibility import SPLIT_SIZES, dataset_arrays

CASES = {
    "burgers_1d": (CONFIGS / "tiny.yaml", ["system.resolution=48"]),
    "navier_stokes_2d": (CONFIGS / "ns2d-tiny.yaml", ["system.resolution=16"]),  # complex multiplier
}

FUSED_TOLERANCE = 0.0
"""Largest difference between a fused and an eager step, relative to the state's largest value. Measured
on the AMD EPYC (AVX2, torch 2.13.0+cpu) for orders 1-4 of both cases, float32 and float64: 0 (the same
bytes: inductor and torch's complex kernels both round (ar br - ai bi, ar bi + ai br) product by product, no
fused multiply-add). The docs promise rounding only, so another CPU or torch release may raise this; the
test then says by how much."""


@pytest.fixture(scope="module")
def threads() -> Iterator[None]:
    previous = torch.get_num_threads()
    yield
    torch.set_num_threads(previous)


def spectral(case: str, order: int, dtype: str = "float32") -> SpectralSystem:
    path, overrides = CASES[case]
    config = load_config(path, [*overrides, f"system.order={order}", f"system.dtype={dtype}"])
    system = build_system(config.system)
    assert isinstance(system, SpectralSystem)
    return system


@pytest.mark.parametrize(
    ("order", "dtype"), [(1, "float32"), (2, "float32"), (3, "float32"), (4, "float32"), (4, "float64")]
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_the_fused_step_is_the_eager_step_to_rounding(case: str, order: int, dtype: str) -> None:
    system = spectral(case, order, dtype)
    drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(5)])  # 5 parameter rows
    ops = system.operators(drawn.params, torch.device("cpu"))
    assert ops.nonlinear is not None
    v = system.to_spectral(drawn.initial.to(system.real_dtype))
    for _ in range(3):
        fused, eager = fused_etd_step(v, ops.coefficients, ops.nonlinear), etd_step(v, ops)
        difference = (fused - eager).abs().max().item() / eager.abs().max().item()
        assert difference <= FUSED_TOLERANCE, f"{case} order {order} {dtype}: {difference:.3g}"
        v = eager


VARIANTS = {  # (batch size, shard size, torch threads)
    "batch 16, 1 shard, 1 thread": (16, 16, 1),
    "batch 5, 3 shards, 2 threads": (5, 3, 2),
    "batch 1, 3 shards, 1 thread": (1, 3, 1),
    "batch 16, 1 shard, 2 threads": (16, 16, 2),
}


@pytest.mark.reproducibility
@pytest.mark.parametrize("case", sorted(CASES))
def test_fused_generation_is_the_same_bytes_for_any_batch_and_thread_count(
    case: str, tmp_path: Path, threads: None
) -> None:
    path, overrides = CASES[case]
    sizes = [f"dataset.n_{split}={n}" for split, n in SPLIT_SIZES.items()]
    made = {}
    for name, (batch, shard, count) in VARIANTS.items():
        torch.set_num_threads(count)
        layout = [f"dataset.batch_size={batch}", f"dataset.shard_size={shard}", "system.fused=true"]
        config = load_config(path, [*overrides, "system.steps=8", "system.save_every=2", *sizes, *layout])
        root = tmp_path / name.replace(" ", "_").replace(",", "")
        generate(config, root, progress=False)
        made[name] = dataset_arrays(root)
    first_name, first = next(iter(made.items()))
    for name, arrays in made.items():
        for key, values in arrays.items():
            assert np.array_equal(values, first[key]), (
                f"{case}: {key} differs between '{first_name}' and '{name}'"
            )
            if values.dtype != object:
                assert values.tobytes() == first[key].tobytes(), key
    # a sample alone: the first training sample of a batch of 1 against the same sample inside a batch of 16
    assert (
        made["batch 1, 3 shards, 1 thread"]["train/fields"][:1].tobytes()
        == first["train/fields"][:1].tobytes()
    )


def test_fused_is_refused_where_inductor_would_contract() -> None:
    from torch._inductor import config as inductor_config

    # inductor's own patch context (monkeypatch's undo left the flag unreadable for later compilations)
    with (
        inductor_config.patch({"cpp.enable_floating_point_contract_flag": "fast"}),
        pytest.raises(ConfigError, match=r"needs inductor's C\+\+ floating-point contraction off"),
    ):
        fused_step_guarantees()
    assert inductor_config.cpp.enable_floating_point_contract_flag == "off"
