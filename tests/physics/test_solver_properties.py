"""Properties every batched spectral rollout must have: batching changes nothing, precision is what was
asked for, and Burgers conserves the spatial mean."""

from __future__ import annotations

import zlib
from collections.abc import Callable

import numpy as np
import pytest
import torch
from physics_helpers import system_from_overrides

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.pde import spectral
from dynaforge.systems.pde.spectral import SpectralSystem

SETTINGS = {
    "burgers": {
        "resolution": 64,
        "dt": 0.01,
        "steps": 40,
        "save_every": 4,
        "viscosity": "{low: 0.01, high: 0.05}",
    },
    "ks": {
        "resolution": 64,
        "dt": 0.05,
        "steps": 40,
        "save_every": 4,
        "domain_length": "{low: 20.0, high: 40.0}",
    },
    "heat": {
        "resolution": 32,
        "dt": 0.01,
        "steps": 10,
        "save_every": 5,
        "diffusivity": "{low: 0.01, high: 0.1}",
    },
    "advection": {
        "resolution": 32,
        "dt": 0.01,
        "steps": 10,
        "save_every": 5,
        "speed": "{low: -1.0, high: 1.0}",
    },
}


def drawn_batch(system: SpectralSystem, size: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    rngs = [np.random.default_rng([seed, i]) for i in range(size)]
    params, initial = system.draw_samples(rngs)
    return params, initial


BATCHES = (1, 3, 5, 7, 16, 19)
"""Batch sizes of the invariance tests: not all multiples of 2, 4, 8 or 16."""

INVARIANCE_SETTINGS = {
    # Broadband initial fields (short correlation length) and a parameter drawn per sample, so that every
    # Fourier mode carries signal and the per-sample and shared coefficient layouts both occur.
    "burgers": ("resolution=200", "dt=0.01", "steps=8", "save_every=4", "viscosity={low: 0.01, high: 0.05}"),
    "ks": ("resolution=64", "dt=0.05", "steps=8", "save_every=4", "domain_length={low: 20.0, high: 40.0}"),
    "heat": ("resolution=30", "dt=0.01", "steps=8", "save_every=4", "diffusivity={low: 0.01, high: 0.1}"),
    "advection": ("resolution=100", "dt=0.01", "steps=8", "save_every=4", "speed={low: -1.0, high: 1.0}"),
    "navier_stokes": ("resolution=20", "dt=0.01", "steps=4", "save_every=2", "viscosity={low: 0.001, high: 0.01}",
                      "forcing_amplitude={low: 0.5, high: 1.0}"),
    "gray_scott": ("resolution=32", "dt=1.0", "steps=4", "save_every=2", "feed={low: 0.02, high: 0.04}"),
    "ks2d": ("resolution=24", "dt=0.05", "steps=4", "save_every=2", "domain_length={low: 20.0, high: 40.0}"),
}  # fmt: skip


def invariance_system(name: str, dtype: str, order: int = 4) -> SpectralSystem:
    overrides = [f"system.name={name}", f"system.dtype={dtype}", f"system.order={order}"]
    overrides += [f"system.{setting}" for setting in INVARIANCE_SETTINGS[name]]
    if name != "gray_scott":  # Gray-Scott seeds its state from a field of its own (blobs by default)
        overrides += ["system.initial.families={grf: 1.0}", "system.initial.length_scale=0.02"]
    return build_system(load_config(None, overrides).system)


def rollout_with_threads(
    system: SpectralSystem, initial: torch.Tensor, params: torch.Tensor, threads: int
) -> torch.Tensor:
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return system.rollout(initial, params).fields
    finally:
        torch.set_num_threads(previous)


@pytest.mark.reproducibility
@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("name", sorted(INVARIANCE_SETTINGS))
def test_a_sample_is_the_same_bytes_in_any_batch_on_any_thread_count(name: str, dtype: str) -> None:
    """Every sample of every batch composition, on 1, 2 and 3 threads, equals the sample stepped alone on
    one thread, byte for byte. Before the blocks of `systems/batching.py` float64 Burgers differed here
    (the contour-integral coefficients of a row depended on the rows set up with it)."""
    system = invariance_system(name, dtype)
    params, initial = drawn_batch(system, max(BATCHES), seed=7)
    assert len({tuple(row) for row in params.tolist()}) == max(BATCHES), (
        "samples must differ in their parameters"
    )
    alone = [
        rollout_with_threads(system, initial[i : i + 1], params[i : i + 1], 1) for i in range(len(params))
    ]
    for size in BATCHES:
        for threads in (1, 2, 3):
            start = 2 if size < max(BATCHES) else 0  # batches that do not start at sample 0 too
            rows = slice(start, start + size)
            batched = rollout_with_threads(system, initial[rows], params[rows], threads)
            for i in range(size):
                assert torch.equal(batched[i : i + 1], alone[start + i]), (
                    f"{name} {dtype}: sample {start + i} differs in a batch of {size} on {threads} threads"
                )


TRANSFORMS = ("fft", "ifft", "rfft", "irfft", "fftn", "ifftn", "rfftn", "irfftn", "fft2", "ifft2", "rfft2", "irfft2")  # fmt: skip
"""Every transform of `torch.fft` a solver might call."""


def shape_keyed(transform: Callable[..., torch.Tensor]) -> Callable[..., torch.Tensor]:
    """`transform` whose result is scaled by 1 + k 2^-20, k in 1 .. 4093 a checksum of the input's shape.

    An FFT library may round a transform differently for another batch shape (an AMD EPYC's MKL does, for
    float64 2D transforms of fewer than 8 samples, where the Intel CPUs this was first tested on did not):
    this makes any such dependence visible on every CPU, as a difference far above rounding."""

    def wrapped(input: torch.Tensor, *args: object, **kwargs: object) -> torch.Tensor:
        key = zlib.crc32(repr(tuple(input.shape)).encode())
        return transform(input, *args, **kwargs) * (1 + (1 + key % 4093) * 2.0**-20)

    return wrapped


SMALL_BLOCKS = {1: 2**13, 2: 2**15, 3: 2**15}
"""Block budgets that cut the invariance batches into several blocks and a partial last one, each block
several lane groups (1D: 32 samples of 200 points; Navier-Stokes 20^2: 64 samples; Gray-Scott 32^2: 16)."""


@pytest.mark.reproducibility
@pytest.mark.parametrize("name", sorted(INVARIANCE_SETTINGS))
def test_no_transform_sees_the_batch(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With every transform's result keyed to the batch shape it is called with, a sample is still the same
    bytes alone, in the first block, in a later one and in a partial last block, on 1 and 2 threads: every
    transform a sample goes through has a shape that comes from the grid alone, never from the batch. The
    same test without the keying (above) only sees what the CPU it runs on happens to round differently."""
    for transform in TRANSFORMS:
        monkeypatch.setattr(torch.fft, transform, shape_keyed(getattr(torch.fft, transform)))
    monkeypatch.setattr(spectral, "BLOCK_VALUES", SMALL_BLOCKS)
    system = invariance_system(name, "float64")
    size = 3 * system.block_samples() + 3
    params, initial = drawn_batch(system, size, seed=11)
    for i in (0, size - 1, system.block_samples() + 1):
        alone = rollout_with_threads(system, initial[i : i + 1], params[i : i + 1], 1)
        for threads in (1, 2):
            batched = rollout_with_threads(system, initial, params, threads)
            assert torch.equal(batched[i : i + 1], alone), (
                f"{name}: sample {i} of {size} differs from the sample alone on {threads} threads "
                f"({system.block_samples()}-sample blocks)"
            )


@pytest.mark.reproducibility
def test_a_rows_coefficients_do_not_depend_on_the_rows_set_up_with_it() -> None:
    """Before the distinct rows were padded to whole lane groups, the complex128 contour integral of a row
    depended on how many rows were set up with it: sample 10 of this batch got another Q (measured)."""
    system = system_from_overrides(
        "burgers", dtype="float64", order=4, resolution=256, viscosity="{low: 0.01, high: 0.05}"
    )
    params, _ = drawn_batch(system, 19)
    together = system.operators(params, torch.device("cpu")).coefficients
    for i in range(len(params)):
        alone = system.operators(params[i : i + 1], torch.device("cpu")).coefficients
        for name in ("E", "E2", "Q", "f1", "f2", "f3"):
            assert torch.equal(getattr(together, name)[i], getattr(alone, name)[0]), f"row {i}: {name}"


@pytest.mark.reproducibility
@pytest.mark.parametrize("name", sorted(SETTINGS))
@pytest.mark.parametrize("order", [2, 4])
def test_batched_rollout_equals_one_sample_at_a_time(name: str, order: int) -> None:
    system = system_from_overrides(name, order=order, **SETTINGS[name])
    params, initial = drawn_batch(system, 7)
    assert len(set(params[:, -1].tolist())) == 7, "samples must differ in their parameters"
    batched = system.rollout(initial, params).fields
    for i in range(7):
        single = system.rollout(initial[i : i + 1], params[i : i + 1]).fields
        # Blocks of whole lane groups, each on one intra-op thread (systems/batching.py): a sample's
        # arithmetic is the same whether it runs alone or in a batch, bit for bit.
        assert torch.equal(batched[i : i + 1], single), f"{name}: sample {i} differs when batched"


def test_float32_by_default_and_float64_on_request() -> None:
    default = system_from_overrides("burgers", **SETTINGS["burgers"])
    double = system_from_overrides("burgers", dtype="float64", **SETTINGS["burgers"])
    params, initial = drawn_batch(default, 3)
    low = default.rollout(initial, params)
    high = double.rollout(initial, params)
    assert low.fields.dtype == torch.float32
    assert high.fields.dtype == torch.float64
    assert high.time.dtype == torch.float64
    # The two precisions solve the same problem: over 40 smooth steps (|u| <= 1) float32 rounding (~6e-8
    # per operation, a few dozen operations per step; measured 1.5e-7) stays well below 1e-5, itself far
    # below how much the fields change over the run (> 1e-2).
    difference = (low.fields.double() - high.fields).abs().max().item()
    assert difference < 1e-5, f"float32 and float64 rollouts differ by {difference:.2e}"
    assert difference > 0, "float64 was requested but the run was not more precise"


@pytest.mark.parametrize(("dtype", "tolerance"), [("float64", 1e-14), ("float32", 1e-6)])
def test_burgers_conserves_the_mean(dtype: str, tolerance: float) -> None:
    system = system_from_overrides("burgers", dtype=dtype, **SETTINGS["burgers"])
    params, initial = drawn_batch(system, 4)
    initial = initial + torch.tensor([0.0, 0.3, -0.7, 1.5], dtype=torch.float64).view(
        4, 1, 1
    )  # non-zero means
    fields = system.rollout(initial, params).fields.double()
    means = fields.mean(dim=-1)  # (batch, time, channels)
    drift = (means - means[:, :1]).abs().max().item()
    # The k = 0 mode is multiplied by E = 1 and receives P * N = 0 (N = -(ik/2) FFT(u^2) vanishes at k = 0),
    # so it is constant in spectral space; the mean read back from the physical field carries only the
    # inverse-FFT rounding (~eps * |u| each frame): 1e-14 in float64, 1e-6 in float32 (|u| ~ 2.5).
    assert drift < tolerance, f"mean drifted by {drift:.2e}"
    # Meanwhile the field itself does evolve (a frozen solver would also conserve the mean).
    assert (fields[:, -1] - fields[:, 0]).abs().max().item() > 1e-2


@pytest.mark.reproducibility
def test_shared_parameters_broadcast_gives_the_same_numbers() -> None:
    # With a constant parameter range the operators are set up once and broadcast over the batch; each
    # sample must still get exactly what it gets alone.
    system = system_from_overrides("burgers", **{**SETTINGS["burgers"], "viscosity": 0.02})
    params, initial = drawn_batch(system, 4)
    assert len(set(params[:, -1].tolist())) == 1
    ops = system.operators(params, torch.device("cpu"))
    assert ops.coefficients.E.shape[0] == 1, "shared parameters should be set up once"
    batched = system.rollout(initial, params).fields
    for i in range(4):
        assert torch.equal(batched[i : i + 1], system.rollout(initial[i : i + 1], params[i : i + 1]).fields)
