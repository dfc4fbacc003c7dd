"""The transforms a generation step must do, replayed with each FFT implementation a PyTorch package can call
on the CPU: which one is fastest on this machine, case by case.

For every case of `generate_pde.py` the torch.fft calls of one step of one block are recorded
(`generate_pde.step_fft_calls`: the nonlinear evaluations and the saved frame's inverse transform, with their
shapes, strides and dtypes) and replayed, on one thread, by:
- `torch.fft`, as dynaforge calls it (MKL on x86 builds of torch): the baseline every record is against;
- `torch.fft` writing into preallocated outputs (`out=`), which removes the allocation of each result;
- `scipy.fft` (pocketfft, C++), `workers=1`, on numpy views of the same tensors;
- `ducc0.fft` (pocketfft's successor by its author, in the benchmark environment only), `nthreads=1`, into
  preallocated outputs;
- XLA (`jax.numpy.fft`, the transforms exponax's steps run): the step's transforms jitted as one computation,
  so that no Python dispatch sits between them, on one thread.
Each option's results are checked against torch's before it is timed (largest difference relative to the
largest value, in the notes). Timings are process CPU time, medians of `--repeats` interleaved rounds of 30
replays; the process is held to one core.

Records: one per case and option, `dynaforge` = step transforms per second of torch.fft (what dynaforge
runs), `baseline_value` = the option's, ratio > 1: torch.fft faster. An option that beats torch.fft on a
machine is a candidate transform for generation there (issue 37: pick per machine by measurement).

Run: `.venv-bench/bin/python benchmarks/fft_backends.py [--quick] [--cases burgers,ks2d_64] [--repeats 7]`
(about a minute); writes benchmarks/results/fft_backends.json (`--out` for a file per machine). `--quick` is
the smoke run (`make bench-smoke`): one case of each PDE at its smaller grid, one round, written to a
temporary folder.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import scipy
import scipy.fft
import torch

from dynaforge.atomic import atomic_write_json
from dynaforge.floating import flush_denormals
from generate_pde import (
    CASES,
    Case,
    add_out_argument,
    dynaforge_system,
    initial_batch,
    selected_cases,
    set_threads,
    step_fft_calls,
)
from machine import load_note, machine_name
from smoke import quick_path

RESULTS = Path(__file__).resolve().parent / "results" / "fft_backends.json"
REPLAYS = 30
"""Replays of one step's transforms per timed round."""
AGREEMENT = 1e-5
"""Largest difference from torch.fft's result, relative to its largest value, that an option may show before
it is timed: float32 transforms of these sizes differ by a few units of 6e-8 (measured on the Xeon AMX,
2026-11-29: at most 3.6e-7 over all ten cases and options)."""

Call = tuple[Callable[..., Any], tuple[Any, ...], dict[str, Any]]


def bound_arguments(call: Call) -> tuple[str, dict[str, Any]]:
    """The aten function's name (`fft_rfft`, ...) and its arguments by name, from its schema (the defaults of
    those the call left out included)."""
    func, args, kwargs = call
    schema = func._schema.arguments
    defaults = {a.name: a.default_value for a in schema if a.has_default_value() and a.name != "out"}
    return func.__name__.split(".")[0], {**defaults, **dict(zip([a.name for a in schema], args)), **kwargs}


def torch_replay(call: Call) -> Callable[[], Any]:
    func, args, kwargs = call
    return lambda: func(*args, **kwargs)


def torch_out_replay(call: Call) -> Callable[[], Any]:
    """The same torch.fft function writing into an output allocated once."""
    name, bound = bound_arguments(call)
    function = getattr(torch.fft, name.removeprefix("fft_"))
    x = bound.pop("self")
    size = bound.pop("n", None) if "n" in bound else bound.pop("s", None)
    dims = bound.pop("dim")
    out = function(x, size, dims, bound.get("norm"))
    return lambda: function(x, size, dims, bound.get("norm"), out=out)


def scipy_replay(call: Call) -> Callable[[], Any]:
    name, bound = bound_arguments(call)
    function = getattr(scipy.fft, name.removeprefix("fft_"))
    x = bound["self"].numpy()
    if "n" in bound:  # the 1D transforms
        return lambda: function(x, n=bound["n"], axis=bound["dim"], norm=bound["norm"], workers=1)
    return lambda: function(x, s=bound["s"], axes=bound["dim"], norm=bound["norm"], workers=1)


def ducc_replay(call: Call) -> Callable[[], Any]:
    """ducc0.fft's r2c, c2r and c2c with numpy's normalisation (1/n on the inverse: inorm=2), into outputs
    allocated once."""
    import ducc0  # benchmark environment only

    name, bound = bound_arguments(call)
    if bound.get("norm") not in (None, "backward"):
        raise ValueError(
            f"{name} with norm={bound['norm']!r}: only numpy's default normalisation is replayed"
        )
    x = bound["self"].numpy()
    dims = bound["dim"]
    axes = tuple(d % x.ndim for d in ([dims] if isinstance(dims, int) else dims))
    size = bound.get("n") if "n" in bound else (bound["s"][-1] if bound.get("s") else None)
    last = axes[-1]
    if name in ("fft_rfft", "fft_rfftn"):
        shape = list(x.shape)
        shape[last] = x.shape[last] // 2 + 1
        out = np.empty(shape, np.complex64 if x.dtype == np.float32 else np.complex128)
        return lambda: ducc0.fft.r2c(x, axes=axes, out=out, nthreads=1)
    if name in ("fft_irfft", "fft_irfftn"):
        length = size if size is not None else 2 * (x.shape[last] - 1)
        shape = list(x.shape)
        shape[last] = length
        out = np.empty(shape, np.float32 if x.dtype == np.complex64 else np.float64)
        return lambda: ducc0.fft.c2r(
            x, axes=axes, lastsize=length, forward=False, inorm=2, out=out, nthreads=1
        )
    if name in ("fft_fft", "fft_fftn", "fft_ifft", "fft_ifftn"):
        forward = not name.startswith("fft_i")
        out = np.empty_like(x)
        return lambda: ducc0.fft.c2c(
            x, axes=axes, forward=forward, inorm=0 if forward else 2, out=out, nthreads=1
        )
    raise ValueError(f"{name} is not replayed by ducc0")


def one_by_one(make: Callable[[Call], Callable[[], Any]]) -> Callable[[list[Call]], Callable[[], list[Any]]]:
    """An option that replays the step's calls one at a time, each with `make(call)`."""

    def replay_step(calls: list[Call]) -> Callable[[], list[Any]]:
        replays = [make(call) for call in calls]
        return lambda: [replay() for replay in replays]

    return replay_step


def jax_step(calls: list[Call]) -> Callable[[], list[Any]]:
    """The step's transforms as one jitted XLA computation (what exponax's step runs them as: no dispatch
    between them), on arrays placed once; `jax.numpy.fft` with numpy's normalisation."""
    import jax  # benchmark environment only
    import jax.numpy as jnp

    pieces = []
    for call in calls:
        name, bound = bound_arguments(call)
        if bound.get("norm") not in (None, "backward"):
            raise ValueError(f"{name} with norm={bound['norm']!r}: only numpy's default is replayed")
        function = getattr(jnp.fft, name.removeprefix("fft_"))
        if "n" in bound:
            pieces.append((function, {"n": bound["n"], "axis": bound["dim"]}))
        else:
            s = tuple(bound["s"]) if bound.get("s") else None
            pieces.append((function, {"s": s, "axes": tuple(bound["dim"])}))
    inputs = [jnp.asarray(bound_arguments(call)[1]["self"].numpy()) for call in calls]

    @jax.jit
    def step(*arrays: Any) -> tuple[Any, ...]:
        return tuple(function(a, **kwargs) for (function, kwargs), a in zip(pieces, arrays))

    def replay() -> list[Any]:
        return list(jax.block_until_ready(step(*inputs)))

    return replay


Option = tuple[str, Callable[[list[Call]], Callable[[], list[Any]]]]


def options() -> dict[str, Option]:
    """Each option's label and how it builds a replay of a step's calls; ducc0 and jax where installed."""
    found: dict[str, Option] = {
        "torch.fft, out=": ("torch.fft into preallocated outputs (out=)", one_by_one(torch_out_replay)),
        "scipy.fft": (f"scipy.fft {scipy.__version__} (pocketfft), workers=1", one_by_one(scipy_replay)),
    }
    try:
        import ducc0
    except ImportError:
        print("ducc0 not installed (make bench-env installs it): its option is left out")
    else:
        found["ducc0"] = (f"ducc0.fft {ducc0.__version__}, nthreads=1", one_by_one(ducc_replay))
    try:
        import jax
    except ImportError:
        print("jax not installed (make bench-env installs it): its option is left out")
    else:
        found["XLA"] = (
            f"jax.numpy.fft {jax.__version__} (XLA), the step's transforms jitted as one",
            jax_step,
        )
    return found


def largest_difference(calls: list[Call], replay: Callable[[], list[Any]]) -> float:
    """The largest |option - torch.fft| over the step's calls, relative to the largest |torch.fft| value."""
    worst = 0.0
    for call, got in zip(calls, replay(), strict=True):
        reference = torch_replay(call)().numpy()
        got = got.numpy() if isinstance(got, torch.Tensor) else np.asarray(got)
        if got.shape != reference.shape:
            raise AssertionError(f"{bound_arguments(call)[0]}: shape {got.shape} against {reference.shape}")
        worst = max(worst, float(np.abs(got - reference).max() / np.abs(reference).max()))
    return worst


def round_time(replay: Callable[[], Any]) -> float:
    """Process CPU seconds of one replay of a step's transforms, over REPLAYS replays."""
    start = time.process_time()
    for _ in range(REPLAYS):
        replay()
    return (time.process_time() - start) / REPLAYS


def run_case(
    case: Case,
    chosen: dict[str, Option],
    repeats: int,
    machine: str,
    cores: str,
) -> list[dict[str, Any]]:
    system = dynaforge_system(case)
    params, initial = initial_batch(system, case.samples)
    initial = initial.to(torch.float32)
    calls, block = step_fft_calls(system, params, initial)
    names = [bound_arguments(call)[0] for call in calls]
    with torch.inference_mode(), flush_denormals():
        replays = {"torch.fft": one_by_one(torch_replay)(calls)}
        differences = {}
        for key, (_, make) in chosen.items():
            replays[key] = make(calls)
            differences[key] = largest_difference(calls, replays[key])
            if differences[key] > AGREEMENT:
                raise AssertionError(f"{case.name}: {key} differs from torch.fft by {differences[key]:.2e}")
        times: dict[str, list[float]] = {key: [] for key in replays}
        for _ in range(repeats + 1):  # the first round warms every option up and is dropped
            for key, replay in replays.items():
                times[key].append(round_time(replay))
    medians = {key: statistics.median(values[1:]) for key, values in times.items()}
    print(
        f"{case.name:18s} {block:4d}-sample block, {len(calls)} transforms: "
        + ", ".join(f"{key} {1e6 * medians[key]:.0f} us" for key in replays)
    )
    base = medians["torch.fft"]
    common = (
        f"the {len(calls)} torch.fft calls of one step of one {block}-sample block ({', '.join(names)}), "
        f"replayed {REPLAYS} times a round; medians of {repeats} interleaved rounds of process CPU time "
        f"(a warm-up round dropped); torch.fft {1e6 * base:.1f} us a step; torch {torch.__version__} with "
        f"{torch.get_num_threads()} intra-op thread(s), {cores}; {load_note(machine)}"
    )
    return [
        {
            "case": f"{case.label()}, step transforms, {key}",
            "baseline": label,
            "metric": "block-steps of transforms per second, one thread",
            "dynaforge": 1 / base,
            "baseline_value": 1 / medians[key],
            "ratio": medians[key] / base,
            "machine": machine,
            "notes": f"{key} {1e6 * medians[key]:.1f} us a step, largest difference from torch.fft "
            f"{differences[key]:.1e} of the largest value; every round (us): "
            + ", ".join(f"{1e6 * t:.0f}" for t in times[key][1:])
            + f"; {common}",
        }
        for key, (label, _) in chosen.items()
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--quick", action="store_true", help="smoke run: each PDE's smaller grid, one round")
    parser.add_argument("--repeats", type=int, default=7, help="timed rounds per option (median reported)")
    parser.add_argument(
        "--cases",
        default="",
        help=f"comma-separated case names (default all: {', '.join(c.name for c in CASES)})",
    )
    add_out_argument(parser, RESULTS)
    args = parser.parse_args()
    chosen = selected_cases(args.cases, args.quick)
    machine = machine_name()  # before the process is held to one core: the machine's count
    cores = set_threads(1)
    repeats = 1 if args.quick else args.repeats
    out = args.out or (quick_path(RESULTS) if args.quick else RESULTS)
    replayers = options()
    records = []
    for case in chosen:
        records.extend(run_case(case, replayers, repeats, machine, cores))
        atomic_write_json(out, records)
    print(f"\nwrote {out}")


if __name__ == "__main__":
    main()
