"""The elementwise work of an ETDRK step fused by `torch.compile` (`system.fused: true`).

`etd_step` runs each product and combination of a stage as its own pass over the complex spectrum
(`c.E * v`, then `addcmul(..., c.Q, Nv)`, ...). Here each stage's arithmetic, between two evaluations of the
nonlinear term, is one function over the real and imaginary parts (`torch.view_as_real`, no copy) that
inductor compiles into one loop: order 4 does four passes a step instead of twelve. The transforms and the
nonlinear term stay as they are.

The numbers are those of `etd_step` to rounding, not its bytes: a complex product is written out as
(ar br - ai bi, ar bi + ai br) in float arithmetic, which torch's complex kernels order differently
(tests/unit/test_fused_step.py measures the difference). They do not depend on the batch or the thread
count, by construction: every operation of a fused stage is an IEEE product, sum or difference of two
values, which rounds the same in a vector lane and in a loop's scalar remainder, since inductor compiles
with `-ffp-contract=off` (no fused multiply-add, `FP_CONTRACT`); the stages are compiled with static
shapes, each block on one intra-op thread (`run_pieces`), and nothing in them reduces across values. The
tests check the bytes across batch sizes and thread counts all the same, since a torch release could
change how inductor compiles; `fused_step_guarantees` refuses to run where the compile flag differs.

Compilation takes seconds per stage and input layout, once per process (a broadcast coefficient row and
per-sample rows are two layouts); it is worth it for long rollouts and large grids, where the measured
figures are in docs/generation_speed.md.
"""

from __future__ import annotations

import threading
import warnings
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from dynaforge.errors import ConfigError
from dynaforge.systems.pde.etdrk import ETDCoefficients

Pair = tuple[Tensor, Tensor]


def cmul(c: Tensor, x: Tensor) -> Pair:
    """(re, im) of the complex product of two real views (..., 2): (cr xr - ci xi, cr xi + ci xr)."""
    cr, ci, xr, xi = c[..., 0], c[..., 1], x[..., 0], x[..., 1]
    return cr * xr - ci * xi, cr * xi + ci * xr


def cmul_pair(c: Tensor, xr: Tensor, xi: Tensor) -> Pair:
    cr, ci = c[..., 0], c[..., 1]
    return cr * xr - ci * xi, cr * xi + ci * xr


def joined(re: Tensor, im: Tensor) -> Tensor:
    return torch.stack((re, im), dim=-1)


def stage_axpy(e: Tensor, v: Tensor, q: Tensor, n: Tensor) -> Tensor:
    """e v + q n (order 1's step; the first stage of orders 2-4; order 4's second stage)."""
    er, ei = cmul(e, v)
    qr, qi = cmul(q, n)
    return joined(er + qr, ei + qi)


def stage_difference(a: Tensor, f: Tensor, na: Tensor, nv: Tensor) -> Tensor:
    """a + f (na - nv) (order 2's step)."""
    fr, fi = cmul_pair(f, na[..., 0] - nv[..., 0], na[..., 1] - nv[..., 1])
    return joined(a[..., 0] + fr, a[..., 1] + fi)


def stage_twice_less(e: Tensor, a: Tensor, q: Tensor, nb: Tensor, nv: Tensor) -> Tensor:
    """e a + q (2 nb - nv) (order 4's third stage, order 3's second)."""
    er, ei = cmul(e, a)
    qr, qi = cmul_pair(q, 2 * nb[..., 0] - nv[..., 0], 2 * nb[..., 1] - nv[..., 1])
    return joined(er + qr, ei + qi)


def stage_final3(
    e: Tensor, v: Tensor, f1: Tensor, nv: Tensor, f2: Tensor, na: Tensor, f3: Tensor, nb: Tensor
) -> Tensor:
    """e v + f1 nv + f2 (4 na) + f3 nb, summed left to right as `etd_step` does (order 3's step)."""
    er, ei = cmul(e, v)
    ar, ai = cmul(f1, nv)
    br, bi = cmul_pair(f2, 4 * na[..., 0], 4 * na[..., 1])
    cr, ci = cmul(f3, nb)
    return joined(er + ar + br + cr, ei + ai + bi + ci)


def stage_final4(
    e: Tensor, v: Tensor, f1: Tensor, nv: Tensor, f2: Tensor, na: Tensor, nb: Tensor, f3: Tensor, nc: Tensor
) -> Tensor:
    """e v + f1 nv + f2 (2 (na + nb)) + f3 nc, summed left to right as `etd_step` does (order 4's step)."""
    er, ei = cmul(e, v)
    ar, ai = cmul(f1, nv)
    br, bi = cmul_pair(f2, 2 * (na[..., 0] + nb[..., 0]), 2 * (na[..., 1] + nb[..., 1]))
    cr, ci = cmul(f3, nc)
    return joined(er + ar + br + cr, ei + ai + bi + ci)


LAYOUTS = 64
"""Compiled layouts (shape, strides, dtype) a stage may hold per process: a rollout uses one or two."""


class FusedStages:
    """The compiled stages of one process (compiled on first use, for each input layout; thread-safe)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.seen: set[tuple[Any, ...]] = set()
        options = {"dynamic": False, "fullgraph": True}
        self.compiled: dict[str, Callable[..., Tensor]] = {
            name: torch.compile(function, **options)  # type: ignore[arg-type]
            for name, function in {
                "axpy": stage_axpy,
                "difference": stage_difference,
                "twice_less": stage_twice_less,
                "final3": stage_final3,
                "final4": stage_final4,
            }.items()
        }

    def __call__(self, name: str, *args: Any) -> Tensor:
        """Stage `name` on complex tensors (and plain numbers); returns a complex tensor."""
        views = [torch.view_as_real(a) if isinstance(a, Tensor) else a for a in args]
        key = (name, *((v.shape, v.stride(), v.dtype) if isinstance(v, Tensor) else v for v in views))
        if key in self.seen:
            out = self.compiled[name](*views)
        else:
            # dynamo compiles one layout at a time; torch's own modules warn of deprecations as it imports them
            # (each layout is a recompilation of the same function: dynamo's limit of 8 is raised for it)
            with self.lock, warnings.catch_warnings(), torch._dynamo.config.patch(recompile_limit=LAYOUTS):
                warnings.simplefilter("ignore", DeprecationWarning)
                out = self.compiled[name](*views)
                self.seen.add(key)
        return torch.view_as_complex(out)


_stages: FusedStages | None = None
_stages_lock = threading.Lock()


def fused_stages() -> FusedStages:
    """This process's compiled stages (one set: dynamo caches a compiled loop per input layout)."""
    global _stages
    with _stages_lock:
        if _stages is None:
            fused_step_guarantees()
            _stages = FusedStages()
        return _stages


def fused_step_guarantees() -> None:
    """Refuse the fused step where its numbers could depend on the batch: inductor must compile without
    floating-point contraction (its default, `-ffp-contract=off`)."""
    from torch._inductor import config as inductor_config  # lazy: inductor loads only for the fused path

    contract = inductor_config.cpp.enable_floating_point_contract_flag
    if contract != "off":
        raise ConfigError(
            f"system.fused: true needs inductor's C++ floating-point contraction off (it is {contract!r}: "
            "TORCHINDUCTOR_CPP_ENABLE_FLOATING_POINT_CONTRACT_FLAG), or a sample's numbers could depend on its "
            "batch; unset the variable or set system.fused: false"
        )


def fused_etd_step(v: Tensor, c: ETDCoefficients, nonlinear: Callable[[Tensor], Tensor]) -> Tensor:
    """One ETDRK step of order 1-4 with the stages of `etd_step` fused (module docstring); `nonlinear`
    returns R(v), the multiplier M already in the coefficients (`etd_step`)."""
    run = fused_stages()
    Nv = nonlinear(v)
    if c.order == 1:
        return run("axpy", c.E, v, c.P, Nv)
    if c.order == 2:
        a = run("axpy", c.E, v, c.P, Nv)
        return run("difference", a, c.f2, nonlinear(a), Nv)
    if c.order == 3:
        a = run("axpy", c.E2, v, c.Q, Nv)
        Na = nonlinear(a)
        b = run("twice_less", c.E, v, c.P, Na, Nv)
        return run("final3", c.E, v, c.f1, Nv, c.f2, Na, c.f3, nonlinear(b))
    a = run("axpy", c.E2, v, c.Q, Nv)
    Na = nonlinear(a)
    b = run("axpy", c.E2, v, c.Q, Na)
    Nb = nonlinear(b)
    cc = run("twice_less", c.E2, a, c.Q, Nb, Nv)
    return run("final4", c.E, v, c.f1, Nv, c.f2, Na, Nb, c.f3, nonlinear(cc))
