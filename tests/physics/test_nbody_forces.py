"""The force evaluation against its definition: the in-place (inference) and differentiable paths, the
chunking of large batches, and the opt-in compiled kernel."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import torch

from dynaforge.config import load_config
from dynaforge.systems import build_system
from dynaforge.systems.nbody import physics
from dynaforge.systems.nbody.initial import random_cluster
from dynaforge.systems.nbody.physics import (
    COMPILED_CHUNK,
    BodyParams,
    BodyState,
    CompiledGravity,
    gravity,
    make_params,
    potential_energy,
    systems_per_chunk,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

COMPILE_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
"""Emitted by torch's own modules while inductor compiles; not ours to fix."""
COMPILED_RTOL = 2e-15
"""Compiled vs eager forces, relative to each system's largest acceleration: measured 0 (3 bodies, 130
systems, this file's case) and 6.0e-16 (16 bodies, 1,024 Plummer systems: the fused loop sums in another
order) on a Xeon with AVX-512; 2e-15 leaves a few ulps for other vector widths."""

ROLLOUT_RTOL = 1e-12
"""Compiled vs eager over a 40-step rollout of 3-body Plummer systems, relative to the largest value:
measured 0 on a Xeon with AVX-512 (3 bodies: the forces agree exactly, see COMPILED_RTOL); 1e-12 leaves
room for the ~6e-16 per evaluation of larger systems or other vector widths to grow over the 40 steps."""


def clusters(count: int, bodies: int, seed: int = 0, external: bool = False) -> tuple[BodyState, BodyParams]:
    """Random clusters, every third one unsoftened (eps = 0 must not give 1/0 on the diagonal)."""
    rng = np.random.default_rng(seed)
    drawn = [random_cluster(bodies, rng, 0.5, 1.5, 0.5, 0.01) for _ in range(count)]
    state = BodyState(
        torch.tensor(np.stack([b.positions for b in drawn]), dtype=torch.float64),
        torch.tensor(np.stack([b.velocities for b in drawn]), dtype=torch.float64),
    )
    masses = torch.tensor(np.stack([b.masses for b in drawn]), dtype=torch.float64)
    softening = torch.where(torch.arange(count) % 3 == 0, 0.0, 0.02).to(torch.float64)
    params = make_params(masses, softening)
    if external:
        params = params._replace(
            external_mass=torch.where(torch.arange(count) % 2 == 0, 3.0, 0.0).to(torch.float64),
            external_position=torch.tensor([[2.0, -1.0, 0.5]], dtype=torch.float64).expand(count, 3),
            has_external=True,
        )
    return state, params


def by_definition(x: np.ndarray, m: np.ndarray, eps: float) -> tuple[np.ndarray, float]:
    """a_i = sum_j m_j (x_j - x_i) / (r_ij^2 + eps^2)^(3/2) and the potential energy, pair by pair."""
    n = len(m)
    acc, potential = np.zeros((n, 3)), 0.0
    for i in range(n):
        for j in range(n):
            if i != j:
                d = x[j] - x[i]
                r = np.sqrt(d @ d + eps * eps)
                acc[i] += m[j] * d / r**3
                potential -= 0.5 * m[i] * m[j] / r
    return acc, potential


def test_forces_match_the_definition_in_every_chunk_with_and_without_autograd() -> None:
    bodies = 16
    count = systems_per_chunk(bodies, torch.float64) + 30  # two chunks, the second one partial
    state, params = clusters(count, bodies)
    with torch.inference_mode():
        fast = gravity(state.positions, params)
        alone = potential_energy(state.positions, params)
    positions = state.positions.clone().requires_grad_(True)
    differentiable = gravity(positions, params)
    assert torch.equal(differentiable.accelerations.detach(), fast.accelerations)  # op for op, bit for bit
    assert torch.equal(differentiable.potential.detach(), fast.potential)
    assert torch.equal(alone, fast.potential)
    for i in (0, 1, count - 1):  # unsoftened, softened, and the last system of the partial chunk
        acc, potential = by_definition(
            state.positions[i].numpy(), params.masses[i].numpy(), float(params.softening[i])
        )
        np.testing.assert_allclose(fast.accelerations[i].numpy(), acc, rtol=1e-12, atol=1e-12)
        assert float(fast.potential[i]) == pytest.approx(potential, rel=1e-13)
        with torch.inference_mode():
            one = gravity(
                state.positions[i : i + 1], make_params(params.masses[i : i + 1], params.softening[i])
            )
        assert torch.equal(one.accelerations[0], fast.accelerations[i])  # the chunk does not matter


@pytest.mark.filterwarnings(COMPILE_WARNING)
def test_compiled_forces_agree_with_eager_and_do_not_depend_on_the_batch() -> None:
    count = COMPILED_CHUNK + 2  # the second chunk is padded
    state, params = clusters(count, 3, seed=4, external=True)
    compiled = CompiledGravity()
    with torch.inference_mode():
        eager, fused = gravity(state.positions, params), compiled(state.positions, params)
        part = compiled(state.positions[5:7], BodyParams(*(t[5:7] for t in params[:4]), True))
    assert compiled.kernels, "the kernel was compiled (not the eager fallback)"
    assert next(iter(compiled.kernels.values())) is not None
    scale = eager.accelerations.abs().amax((1, 2), keepdim=True)
    assert float(((fused.accelerations - eager.accelerations).abs() / scale).max()) <= COMPILED_RTOL
    torch.testing.assert_close(fused.potential, eager.potential, rtol=COMPILED_RTOL, atol=0)
    assert torch.equal(part.accelerations, fused.accelerations[5:7])
    assert torch.equal(part.potential, fused.potential[5:7])


def test_compiled_forces_fall_back_to_eager(monkeypatch: pytest.MonkeyPatch, caplog) -> None:
    state, params = clusters(4, 3, seed=2)
    compiled = CompiledGravity()
    positions = state.positions.clone().requires_grad_(True)
    g = compiled(positions, params)  # a gradient asked for: eager, and it flows
    (grad,) = torch.autograd.grad(g.potential.sum(), positions)
    assert torch.isfinite(grad).all() and not compiled.kernels

    def fails(*args: object) -> None:
        raise RuntimeError("no C++ compiler")

    monkeypatch.setattr(physics.torch, "compile", lambda *args, **kwargs: fails)
    with caplog.at_level(logging.WARNING, logger=physics.__name__), torch.inference_mode():
        fallback = compiled(state.positions, params)
        again = compiled(state.positions, params)
        eager = gravity(state.positions, params)
    assert "no C++ compiler" in caplog.text
    assert list(compiled.kernels.values()) == [None]
    assert torch.equal(fallback.accelerations, eager.accelerations)
    assert torch.equal(again.potential, eager.potential)


@pytest.mark.filterwarnings(COMPILE_WARNING)
@pytest.mark.parametrize("control", ["fixed", "adaptive"])
def test_system_forces_compiled_generates_like_eager_whatever_the_batch_and_threads(control: str) -> None:
    """`system.forces: compiled` through a whole rollout: close to eager, the same bytes for a system alone
    or in a batch, and on 1 or 2 threads."""
    overrides = [
        "system.name=nbody",
        "system.bodies=3",
        "system.initial.family=plummer",
        "system.steps=40",
        "system.save_every=10",
        f"system.control.kind={control}",
    ]
    eager = build_system(load_config(None, overrides).system)
    compiled = build_system(load_config(None, [*overrides, "system.forces=compiled"]).system)
    params, initial = eager.draw_samples([np.random.default_rng([3, i]) for i in range(20)])
    with torch.inference_mode():
        reference = eager.rollout(initial, params).fields
        fused = compiled.rollout(initial, params).fields
        alone = compiled.rollout(initial[7:8], params[7:8]).fields
        previous = torch.get_num_threads()
        try:
            torch.set_num_threads(2)
            two_threads = compiled.rollout(initial, params).fields
        finally:
            torch.set_num_threads(previous)
    assert compiled.compiled_forces is not None and all(compiled.compiled_forces.kernels.values())
    scale = reference.abs().amax()
    assert float((fused - reference).abs().max() / scale) <= ROLLOUT_RTOL
    assert torch.equal(alone[0], fused[7])
    assert torch.equal(two_threads, fused)


@pytest.mark.parametrize("bodies", [2, 5, 16, 17, 64])
def test_a_system_gets_the_same_forces_in_a_small_batch_and_a_large_one(bodies: int) -> None:
    """Small batches take the out-of-place path (`SMALL_PAIR_BYTES`), large ones the chunked in-place one:
    the same bits either way, so generation does not depend on the batch size."""
    generator = torch.Generator().manual_seed(bodies)
    x = torch.randn(200, bodies, 3, dtype=torch.float64, generator=generator)
    masses = torch.rand(200, bodies, dtype=torch.float64, generator=generator) + 0.5
    softening = torch.rand(200, dtype=torch.float64, generator=generator) * 0.1
    with torch.inference_mode():
        large = gravity(x, make_params(masses, softening))
        for rows in (slice(0, 1), slice(3, 5), slice(10, 19)):
            small = gravity(x[rows], make_params(masses[rows], softening[rows]))
            assert torch.equal(small.accelerations, large.accelerations[rows])
            assert torch.equal(small.potential, large.potential[rows])
