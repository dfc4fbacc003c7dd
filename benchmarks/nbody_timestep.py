"""N-body time-stepping against REBOUND: force evaluations to reach a target energy error.

For each test system and each target max |E(t) - E0| / |E0| (1e-4 and 1e-8, the maximum over every step of
the whole run), every integrator's one accuracy knob is searched for its cheapest run that meets the target:

- dynaforge: the classical step criterion (knob eta) and the learned controller (knob: its output scale) on
  the symplectic compositions `leapfrog`, `yoshida4`, `yoshida6`, each kick-drift-kick (KDK) or
  drift-kick-drift (`_dkd`), all with the time-symmetric step recursion (`dynaforge.systems.nbody.control`);
- REBOUND (benchmark environment only, never a dependency): IAS15 (knob epsilon), its leapfrog (DKD, fixed
  dt; orders 2 and 4) and, for the system with a dominant central mass (Sun-Jupiter-Saturn), WHFast (fixed
  dt, Jacobi coordinates).

The search is the same for every integrator: from a start knob, jump towards the target with the expected
error scaling, bracket by factors of two, then refine the bracket twice with a geometric grid of knob values
(dynaforge steps a grid as one batch; REBOUND runs them one after another). Of all measured runs, the one
with the fewest force evaluations whose max error met the target is kept: every figure is a measured run.
A run that would take more than `--max-steps` steps is abandoned (the row says so).

Same physics for both: identical initial conditions (float64 arrays handed to both), G = 1, Plummer
softening (REBOUND's `softening` is the same 1 / (r^2 + eps^2)^(3/2) law), and every energy computed by ONE
function, dynaforge's `energy` (REBOUND's own ignores softening): REBOUND's state is read after every step
and its energies evaluated in batches. Force evaluations are counted the same way: dynaforge counts each
evaluation of all forces (the initial one included); for REBOUND an `additional_forces` callback (zero
force, velocity independent) counts every call of its force routine, so IAS15's predictor-corrector
iterations are all included. Wall time per system is that of one run at the chosen knob, dynaforge with its
built-in energy monitor, REBOUND without monitor or counter (`integrate`).

Throughput: 1,024 Plummer systems of 16 bodies, leapfrog at a fixed dt, dynaforge batched (one tensor
program for all systems; forces eager, `gravity`, or compiled, `CompiledGravity`) against REBOUND one system
at a time, both on one core (torch threads = 1), each the best of three interleaved timed runs.

    python benchmarks/nbody_timestep.py [--quick] [--model-yoshida4 RUN] [--model-yoshida6 RUN]
    python benchmarks/nbody_timestep.py --tables [RESULTS.json]     # the markdown tables of the docs

`--quick` is the smoke run (`make bench-smoke`): every integrator and the search on one orbit of a Kepler
binary and of Sun-Jupiter-Saturn at 1e-3, controllers trained for 2 short steps, 8 systems of throughput;
not a figure, written to a temporary folder (smoke.quick_path) unless --out is given.

Without a --model-* option the learned controllers are trained here (configs/nbody_controller_*.yaml) and
the training time is recorded.
"""

from __future__ import annotations

import argparse
import math
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import numpy as np
import rebound
import torch

from dynaforge.atomic import atomic_write_json
from dynaforge.config import load_config
from dynaforge.models.loading import load_learned_controller
from dynaforge.models.step_controller import LearnedStep
from dynaforge.systems.nbody.control import ClassicalStep, Integrator, StepController
from dynaforge.systems.nbody.initial import (
    FIGURE_EIGHT_PERIOD,
    InitialBodies,
    figure_eight,
    kepler_orbit,
    plummer_sphere,
    random_cluster,
)
from dynaforge.systems.nbody.physics import (
    BodyParams,
    BodyState,
    CompiledGravity,
    composition_step,
    energy,
    gravity,
    make_params,
)
from dynaforge.systems.nbody.schemes import LEAPFROG, SCHEMES
from machine import load_note, machine_name
from smoke import quick_path

ROOT = Path(__file__).resolve().parent
RESULTS = ROOT / "results" / "nbody_timestep.json"
TARGETS = (1e-4, 1e-8)
LEARNED_SCHEMES = ("yoshida4", "yoshida6")
JUPITER_PERIOD = 2.0 * math.pi * 5.2026**1.5 / math.sqrt(1.0 + 9.5479e-4)


class Case(NamedTuple):
    name: str
    bodies: InitialBodies
    softening: float
    t_end: float
    description: str
    central: bool = False
    """A dominant central mass (WHFast applies)."""


class Outcome(NamedTuple):
    knob: float
    evaluations: int
    max_error: float
    finished: bool


class Best(NamedTuple):
    """The cheapest measured run meeting the target (None: none found within the step cap)."""

    knob: float | None
    evaluations: int | None
    max_error: float | None
    runs: int
    wall: float | None = None
    note: str = ""


# --------------------------------------------------------------------------------------------------
# Systems


def sun_jupiter_saturn() -> InitialBodies:
    """Sun, Jupiter and Saturn (masses in solar masses, AU, G = 1: a year is 2 pi), from their J2000
    heliocentric elements (a, e, i, longitude of node, argument of perihelion, mean anomaly), moved to the
    centre-of-mass frame."""
    sim = rebound.Simulation()
    sim.G = 1.0
    sim.add(m=1.0)
    deg = math.pi / 180.0
    sim.add(
        m=9.5479e-4,
        a=5.2026,
        e=0.0484,
        inc=1.303 * deg,
        Omega=100.46 * deg,
        omega=273.87 * deg,
        M=20.02 * deg,
    )
    sim.add(
        m=2.8588e-4,
        a=9.5549,
        e=0.0539,
        inc=2.485 * deg,
        Omega=113.67 * deg,
        omega=339.39 * deg,
        M=317.02 * deg,
    )
    sim.move_to_com()
    x, v = np.zeros((3, 3)), np.zeros((3, 3))
    sim.serialize_particle_data(xyz=x, vxvyvz=v)
    return InitialBodies(x, v, np.asarray([1.0, 9.5479e-4, 2.8588e-4]))


def cases(quick: bool, jupiter_orbits: int) -> list[Case]:
    periods = 1 if quick else 10
    crossing = 2.0 * math.sqrt(2.0)  # N-body units
    kepler_period = 2.0 * math.pi  # a = 1, M = 1
    orbits = 1 if quick else jupiter_orbits
    chosen = [
        Case(
            "kepler e=0.9",
            kepler_orbit(1.0, 0.9, 0.5, 0.5, math.pi),
            0.0,
            periods * kepler_period,
            f"two equal masses, a = 1, start at apocentre, {periods} orbits",
        ),
        Case(
            "kepler e=0.99",
            kepler_orbit(1.0, 0.99, 0.5, 0.5, math.pi),
            0.0,
            periods * kepler_period,
            f"two equal masses, a = 1, start at apocentre, {periods} orbits",
        ),
        Case(
            "random 3-body",
            random_cluster(3, np.random.default_rng(2024), 1.0, 1.0, 0.5, 0.01),
            0.01,
            periods * crossing,
            f"virialised random 3-body cluster (seed 2024), eps = 0.01, {periods} crossing times",
        ),
        Case(
            "random 16-body",
            random_cluster(16, np.random.default_rng(2024), 1.0, 1.0, 0.5, 0.01),
            0.01,
            periods * crossing,
            f"virialised random 16-body cluster (seed 2024), eps = 0.01 (collisional: close encounters and "
            f"binaries), {periods} crossing times",
        ),
        Case(
            "plummer 16-body",
            plummer_sphere(16, np.random.default_rng(7), 0.05),
            0.05,
            periods * crossing,
            f"Plummer sphere (seed 7), eps = 0.05, {periods} crossing times",
        ),
        Case(
            "figure-eight",
            figure_eight(),
            0.0,
            periods * FIGURE_EIGHT_PERIOD,
            f"the figure-eight choreography, {periods} periods",
        ),
        Case(
            "sun-jupiter-saturn",
            sun_jupiter_saturn(),
            0.0,
            orbits * JUPITER_PERIOD,
            f"Sun, Jupiter, Saturn (J2000 elements, G = 1, AU), {orbits} Jupiter orbits",
            central=True,
        ),
    ]
    return [chosen[i] for i in (0, 6)] if quick else chosen  # quick: a two-body and the central-mass case


def batch_of(bodies: InitialBodies, softening: float, copies: int) -> tuple[BodyState, BodyParams]:
    x = torch.as_tensor(bodies.positions, dtype=torch.float64).expand(copies, -1, -1).clone()
    v = torch.as_tensor(bodies.velocities, dtype=torch.float64).expand(copies, -1, -1).clone()
    m = torch.as_tensor(bodies.masses, dtype=torch.float64).expand(copies, -1).clone()
    return BodyState(x, v), make_params(m, softening)


# --------------------------------------------------------------------------------------------------
# Runs: dynaforge (a batch of knobs at once) and REBOUND (one knob at a time)


def dynaforge_runs(
    make: Callable[[torch.Tensor], StepController],
    scheme: str,
    case: Case,
    knobs: list[float],
    max_steps: int,
) -> list[Outcome]:
    state, params = batch_of(case.bodies, case.softening, len(knobs))
    integrator = Integrator(
        params, make(torch.as_tensor(knobs, dtype=torch.float64)), scheme, reversible=True
    )
    with torch.inference_mode():
        run = integrator.advance(integrator.start(state), case.t_end, max_steps=max_steps)
    finished = (run.time >= case.t_end * (1 - 1e-12)).tolist()
    return [
        Outcome(k, int(n), float(e), bool(f))
        for k, n, e, f in zip(knobs, run.evaluations.tolist(), run.max_energy_error.tolist(), finished)
    ]


def dynaforge_wall(
    make: Callable[[torch.Tensor], StepController], scheme: str, case: Case, knob: float
) -> float:
    state, params = batch_of(case.bodies, case.softening, 1)
    integrator = Integrator(
        params, make(torch.as_tensor([knob], dtype=torch.float64)), scheme, reversible=True
    )
    with torch.inference_mode():
        start = time.perf_counter()
        integrator.advance(integrator.start(state), case.t_end)
        return time.perf_counter() - start


class Rebound(NamedTuple):
    """A REBOUND integrator and how its knob sets it up."""

    name: str
    label: str
    integrator: str
    fixed: bool
    """Knob = dt (else IAS15's epsilon)."""
    order: int
    """Error ~ knob^order, for the search's first jump."""
    leapfrog_order: int = 2


REBOUND_INTEGRATORS = {
    "ias15": Rebound("ias15", "REBOUND IAS15", "ias15", False, 2),
    "leapfrog": Rebound("leapfrog", "REBOUND leapfrog (DKD, order 2)", "leapfrog", True, 2),
    "leapfrog4": Rebound("leapfrog4", "REBOUND leapfrog order 4 (DKD Yoshida)", "leapfrog", True, 4, 4),
    "whfast": Rebound("whfast", "REBOUND WHFast", "whfast", True, 2),
}


def rebound_simulation(case: Case, kind: Rebound, knob: float) -> rebound.Simulation:
    sim = rebound.Simulation()
    sim.G = 1.0
    sim.softening = case.softening
    b = case.bodies
    for i in range(len(b.masses)):
        x, v = b.positions[i], b.velocities[i]
        sim.add(m=float(b.masses[i]), x=x[0], y=x[1], z=x[2], vx=v[0], vy=v[1], vz=v[2])
    sim.integrator = kind.integrator
    if kind.fixed:
        sim.dt = knob
        if kind.integrator == "leapfrog":
            sim.integrator.order = kind.leapfrog_order
    else:
        sim.integrator.epsilon = knob
    return sim


def rebound_run(case: Case, kind: Rebound, knob: float, max_steps: int) -> Outcome:
    """One REBOUND run: every force evaluation counted, the state read after every step, its energy error
    computed with dynaforge's `energy` (in batches of steps)."""
    if kind.fixed and case.t_end / knob > max_steps:
        return Outcome(knob, 0, math.inf, False)
    sim = rebound_simulation(case, kind, knob)
    count = [0]

    def counter(_: object) -> None:
        count[0] += 1

    sim.additional_forces = counter
    sim.force_is_velocity_dependent = 0
    n = len(case.bodies.masses)
    masses = torch.as_tensor(case.bodies.masses, dtype=torch.float64)
    state0, params0 = batch_of(case.bodies, case.softening, 1)
    e0 = float(energy(state0, params0)[0])
    chunk = 4096
    xs, vs = np.zeros((chunk, n, 3)), np.zeros((chunk, n, 3))
    params = make_params(masses.expand(chunk, -1).clone(), case.softening)
    worst, steps, filled = 0.0, 0, 0

    def flush(k: int) -> float:
        state = BodyState(torch.from_numpy(xs[:k]), torch.from_numpy(vs[:k]))
        part = params if k == chunk else make_params(masses.expand(k, -1).clone(), case.softening)
        return float(((energy(state, part) - e0).abs() / abs(e0)).max())

    t_end = case.t_end
    while sim.t < t_end * (1 - 1e-14):
        if steps >= max_steps:
            return Outcome(knob, count[0], math.inf, False)
        if sim.t + sim.dt >= t_end:
            sim.integrate(t_end)  # the last step lands on t_end
        else:
            sim.steps(1)
        steps += 1
        sim.serialize_particle_data(xyz=xs[filled], vxvyvz=vs[filled])
        filled += 1
        if filled == chunk:
            worst, filled = max(worst, flush(chunk)), 0
    if filled:
        worst = max(worst, flush(filled))
    return Outcome(knob, count[0], worst if math.isfinite(worst) else math.inf, True)


def rebound_wall(case: Case, kind: Rebound, knob: float) -> float:
    sim = rebound_simulation(case, kind, knob)
    start = time.perf_counter()
    sim.integrate(case.t_end)
    return time.perf_counter() - start


# --------------------------------------------------------------------------------------------------
# The search


def cheapest(
    measure: Callable[[list[float]], list[Outcome]],
    start: float,
    target: float,
    order: int,
    grid: int = 4,
) -> Best:
    """The measured run with the fewest force evaluations meeting `target` (see the module docstring).
    The knob grows towards cheaper, less accurate runs."""
    runs = 0
    outcomes: list[Outcome] = []

    def ok(o: Outcome) -> bool:
        return o.finished and o.max_error <= target

    (first,) = measure([start])
    runs += 1
    outcomes.append(first)
    knob = start
    if first.finished and 0 < first.max_error < math.inf:
        knob = start * min(64.0, max(1 / 64.0, 0.8 * (target / first.max_error) ** (1.0 / order)))
    passing: float | None = start if ok(first) else None
    failing: float | None = None if ok(first) else start
    too_costly = not first.finished
    for _ in range(30):
        (o,) = measure([knob])
        runs += 1
        outcomes.append(o)
        if ok(o):
            passing = knob if passing is None else max(passing, knob)
            if failing is not None and failing > knob:
                break
            knob *= 2.0
        else:
            if not o.finished:
                too_costly = True
                break  # smaller knobs cost even more steps
            failing = knob if failing is None else min(failing, knob)
            if passing is not None and passing < knob:
                break
            knob /= 2.0
    if passing is not None and failing is not None and failing > passing:
        for _ in range(2):
            low, high = passing, failing
            knobs = [low * (high / low) ** ((i + 1) / (grid + 1)) for i in range(grid)]
            results = measure(knobs)
            runs += 1
            outcomes.extend(results)
            for r in results:
                if ok(r):
                    passing = max(passing, r.knob)
                elif r.knob > passing:
                    failing = min(failing, r.knob)
    good = [o for o in outcomes if ok(o)]
    if not good:
        note = "no run within the step cap met the target" if too_costly else "could not bracket the target"
        return Best(None, None, None, runs, None, note)
    best = min(good, key=lambda o: o.evaluations)
    return Best(best.knob, best.evaluations, best.max_error, runs)


# --------------------------------------------------------------------------------------------------
# Throughput


class Throughput(NamedTuple):
    """System-steps per second (the best of `repeats` timed runs each, warm-up and compilation excluded)."""

    batched: float
    """dynaforge, all systems in one batch, eager forces (`gravity`)."""
    compiled: float
    """dynaforge, all systems in one batch, `CompiledGravity`."""
    sequential: float
    """dynaforge one system at a time (eager)."""
    rebound: float
    """REBOUND leapfrog one system at a time."""
    compile_seconds: float
    """The compiled kernel's first call (compilation included)."""


def throughput(
    systems: int, bodies: int, steps: int, sequential_systems: int, repeats: int = 3
) -> Throughput:
    """System-steps per second of leapfrog at fixed dt: dynaforge with all systems in one batch (eager and
    compiled forces), dynaforge one system at a time, and REBOUND (leapfrog, C) one system at a time. Each
    is timed `repeats` times, interleaved, and its best run kept (other jobs on a shared machine only ever
    slow a run down)."""
    rng = np.random.default_rng(0)
    drawn = [plummer_sphere(bodies, rng, 0.05) for _ in range(systems)]
    x = torch.as_tensor(np.stack([b.positions for b in drawn]), dtype=torch.float64)
    v = torch.as_tensor(np.stack([b.velocities for b in drawn]), dtype=torch.float64)
    m = torch.as_tensor(np.stack([b.masses for b in drawn]), dtype=torch.float64)
    dt = 1e-3
    compiled = CompiledGravity()

    def advance(state: BodyState, params: BodyParams, n: int, forces: Callable = gravity) -> None:
        g = forces(state.positions, params)
        step = torch.full((state.positions.shape[0],), dt, dtype=torch.float64)
        for _ in range(n):
            state, g = composition_step(state, g, params, step, LEAPFROG, forces)

    def rebound_all() -> None:
        kind = REBOUND_INTEGRATORS["leapfrog"]
        for b in drawn:
            sim = rebound_simulation(Case("", b, 0.05, steps * dt, ""), kind, dt)
            sim.steps(steps)

    def timed(run: Callable[[], None]) -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    best = {"batched": math.inf, "compiled": math.inf, "sequential": math.inf, "rebound": math.inf}
    with torch.inference_mode():
        params = make_params(m, 0.05)
        advance(BodyState(x, v), params, 2)  # warm-up
        compile_seconds = timed(lambda: compiled(x, params))
        for _ in range(repeats):
            best["batched"] = min(best["batched"], timed(lambda: advance(BodyState(x, v), params, steps)))
            best["compiled"] = min(
                best["compiled"], timed(lambda: advance(BodyState(x, v), params, steps, compiled))
            )
            best["sequential"] = min(
                best["sequential"],
                timed(
                    lambda: [
                        advance(BodyState(x[i : i + 1], v[i : i + 1]), make_params(m[i : i + 1], 0.05), steps)
                        for i in range(sequential_systems)
                    ]
                ),
            )
            best["rebound"] = min(best["rebound"], timed(rebound_all))
    return Throughput(
        systems * steps / best["batched"],
        systems * steps / best["compiled"],
        sequential_systems * steps / best["sequential"],
        systems * steps / best["rebound"],
        compile_seconds,
    )


# --------------------------------------------------------------------------------------------------


def train_controller_here(scheme: str, quick: bool, folder: Path) -> float:
    """Train the learned controller of configs/nbody_controller_SCHEME.yaml; returns the seconds it took."""
    from dynaforge.train.step_controller import train_controller  # lazy: only when no --model is given

    overrides = [
        "timestepper.steps=2",
        "timestepper.eval_every=1",
        "timestepper.horizon=0.5",
        "timestepper.batch=4",
        "timestepper.systems.kepler=4",
        "timestepper.systems.snapshots=2",
    ]
    overrides = overrides if quick else []
    start = time.perf_counter()
    train_controller(
        load_config(ROOT.parent / "configs" / f"nbody_controller_{scheme}.yaml", overrides), folder
    )
    return time.perf_counter() - start


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 1 orbit of 2 systems at 1e-3, tiny training and throughput, to a temporary folder",
    )
    for scheme in LEARNED_SCHEMES:
        parser.add_argument(f"--model-{scheme}", default=None, help=f"trained {scheme} controller run folder")
        parser.add_argument(
            f"--train-seconds-{scheme}",
            type=float,
            default=None,
            help="its measured training time, for the record",
        )
    parser.add_argument(
        "--jupiter-orbits", type=int, default=100, help="length of the Sun-Jupiter-Saturn run"
    )
    parser.add_argument(
        "--max-steps",
        type=int,
        default=150_000,
        help="abandon runs longer than this (leapfrog modes: 40,000)",
    )
    parser.add_argument("--out", default=None, help="results JSON (default results/nbody_timestep.json)")
    parser.add_argument(
        "--cases",
        default=None,
        help="comma-separated system names to run (default: all); with --append the records of the other "
        "systems already in --out are kept, so a long run can be split into pieces that each hold the "
        "machine for a few minutes",
    )
    parser.add_argument("--targets", default=None, help="comma-separated targets to run (default: 1e-4,1e-8)")
    parser.add_argument("--append", action="store_true", help="merge into --out instead of replacing it")
    parser.add_argument(
        "--throughput", choices=["yes", "no", "only"], default="yes", help="the throughput rows"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    args.out = args.out or str(quick_path(RESULTS) if args.quick else RESULTS)
    max_steps = 20_000 if args.quick else args.max_steps
    targets = [float(t) for t in args.targets.split(",")] if args.targets else list(TARGETS)
    targets = [1e-3] if args.quick and not args.targets else targets
    chosen = [
        c
        for c in cases(args.quick, args.jupiter_orbits)
        if args.cases is None or c.name in args.cases.split(",")
    ]
    if args.throughput == "only":
        chosen = []
    records: list[dict] = []
    if args.append and Path(args.out).exists():
        import json  # lazy: only --append reads an earlier JSON

        ran = {c.name for c in chosen}
        records = [
            r
            for r in json.loads(Path(args.out).read_text())
            if not (r["case"].split(":")[0] in ran and any(r["case"].endswith(f"<= {t:g}") for t in targets))
            and not (args.throughput != "no" and r["case"].startswith("throughput"))
        ]
    machine = machine_name()
    with tempfile.TemporaryDirectory() as tmp:
        learned: dict[str, LearnedStep] = {}
        training: dict[str, str] = {}
        for scheme in LEARNED_SCHEMES if chosen else ():
            model = getattr(args, f"model_{scheme}")
            if model is None:
                seconds = train_controller_here(scheme, args.quick, Path(tmp) / scheme)
                model = Path(tmp) / scheme
                training[scheme] = f"trained here in {seconds:.0f} s on one thread"
            else:
                given = getattr(args, f"train_seconds_{scheme}")
                training[scheme] = f"--model-{scheme} {model}" + (
                    f", trained in {given:.0f} s on one thread" if given else ""
                )
            learned[scheme] = load_learned_controller(model)
        for case in chosen:
            for target in targets:
                records += benchmark_case(case, target, learned, training, max_steps, machine)
                atomic_write_json(args.out, records)  # partial results survive an interrupted run
        if args.throughput == "no":
            atomic_write_json(args.out, records)
            return 0
        systems, steps = (8, 5) if args.quick else (1024, 100)
        sequential_systems = 2 if args.quick else 64
        rates = throughput(systems, 16, steps, sequential_systems, repeats=1 if args.quick else 3)
        print(
            f"throughput: batched {rates.batched:.3g}, compiled {rates.compiled:.3g}, one at a time "
            f"{rates.sequential:.3g}, REBOUND {rates.rebound:.3g} system-steps/s"
        )
        common = (
            f"dynaforge: all {systems} systems in one batch, KDK leapfrog, fixed dt 1e-3, eps 0.05, {steps} "
            f"steps, forces `gravity` (eager) or `CompiledGravity` (torch.compile, first call "
            f"{rates.compile_seconds:.1f} s, excluded); REBOUND: leapfrog (DKD, same dt and softening), "
            f"`steps({steps})` per system; dynaforge one at a time measured on the first {sequential_systems} "
            f"systems; each the best of {1 if args.quick else 3} interleaved timed runs; {load_note()} (other "
            f"jobs may share the machine: timings are noisy)"
        )
        for mode, value in (
            ("batched, eager forces", rates.batched),
            ("batched, compiled forces", rates.compiled),
        ):
            for label, baseline in (
                ("REBOUND leapfrog one system at a time", rates.rebound),
                ("dynaforge one system at a time", rates.sequential),
            ):
                records.append(
                    {
                        "case": f"throughput: leapfrog, {systems} Plummer systems of 16 bodies, float64, one thread",
                        "baseline": label,
                        "metric": "system-steps/s",
                        "dynaforge_mode": mode,
                        "dynaforge": value,
                        "baseline_value": baseline,
                        "ratio": value / baseline,
                        "notes": common,
                    }
                )
    atomic_write_json(args.out, records)
    print(f"wrote {args.out}")
    return 0


LEAPFROG_MAX_STEPS = 40_000
"""Step cap of the leapfrog modes (run at 1e-4 only): on the systems where leapfrog needs more, the Yoshida
compositions need several times fewer evaluations, and the benchmark stays a few tens of minutes long."""


class Mode(NamedTuple):
    label: str
    scheme: str
    make: Callable[[torch.Tensor], StepController]
    start: float
    max_steps: int | None = None


def dynaforge_modes(target: float, learned: dict[str, LearnedStep]) -> list[Mode]:
    """Every dynaforge mode run at `target`: the classical criterion on each scheme (leapfrog only at the
    loose target: at 1e-8 it needs 100x its 1e-4 evaluations), the learned controllers on theirs."""
    schemes = ["yoshida4", "yoshida4_dkd", "yoshida6", "yoshida6_dkd"]
    modes = [Mode(f"classical {s}", s, ClassicalStep, 0.05) for s in schemes]
    if target >= 1e-5:
        leapfrogs = [
            Mode(f"classical {s}", s, ClassicalStep, 0.02, LEAPFROG_MAX_STEPS)
            for s in ("leapfrog", "leapfrog_dkd")
        ]
        modes = leapfrogs + modes
    for scheme, controller in learned.items():
        net = controller.net
        modes.append(Mode(f"learned {scheme}", scheme, lambda k, net=net: LearnedStep(net, k), 1.0))
    return modes


def benchmark_case(
    case: Case,
    target: float,
    learned: dict[str, LearnedStep],
    training: dict[str, str],
    max_steps: int,
    machine: str,
) -> list[dict]:
    started = time.perf_counter()
    mine: dict[str, Best] = {}
    for mode in dynaforge_modes(target, learned):
        cap = mode.max_steps or max_steps

        def measure(knobs: list[float], mode: Mode = mode, cap: int = cap) -> list[Outcome]:
            return dynaforge_runs(mode.make, mode.scheme, case, knobs, cap)

        best = cheapest(measure, mode.start, target, SCHEMES[mode.scheme].order)
        if best.knob is not None:
            best = best._replace(wall=dynaforge_wall(mode.make, mode.scheme, case, best.knob))
        elif mode.max_steps:
            best = best._replace(note=f"{best.note} ({cap} steps)")
        label = mode.label
        mine[label] = best
        print(
            f"  {case.name} {target:g} {label}: {best.evaluations} (knob {best.knob}) {best.note}", flush=True
        )
    theirs: dict[str, Best] = {}
    kinds = (
        ["ias15", "leapfrog4"]
        + (["leapfrog"] if target >= 1e-5 else [])
        + (["whfast"] if case.central else [])
    )
    for name in kinds:
        kind = REBOUND_INTEGRATORS[name]
        if kind.fixed:
            typical = (
                min(o.evaluations for o in mine.values() if o.evaluations)
                if any(o.evaluations for o in mine.values())
                else 1000
            )
            start = case.t_end / max(10, typical // 3)
        else:
            start = 1e-6
        best = cheapest(
            lambda knobs, kind=kind: [rebound_run(case, kind, k, max_steps) for k in knobs],
            start,
            target,
            kind.order,
        )
        if best.knob is not None:
            best = best._replace(wall=rebound_wall(case, kind, best.knob))
        theirs[kind.label] = best
        print(
            f"  {case.name} {target:g} {kind.label}: {best.evaluations} (knob {best.knob}) {best.note}",
            flush=True,
        )
    seconds = time.perf_counter() - started
    measured_mine = {k: v for k, v in mine.items() if v.evaluations}
    measured_theirs = {k: v for k, v in theirs.items() if v.evaluations}
    nothing = Best(None, None, None, 0, None, "no integrator met the target within the step cap")
    best_mine = min(measured_mine, key=lambda k: measured_mine[k].evaluations) if measured_mine else "none"
    best_theirs = (
        min(measured_theirs, key=lambda k: measured_theirs[k].evaluations) if measured_theirs else "none"
    )
    head = f"{case.name}: force evaluations at max|dE/E| <= {target:g}"
    common = (
        f"{case.description}; every integrator's knob tuned by the same search to its cheapest measured run with "
        f"max |dE/E| <= {target:g} over every step, energies all from dynaforge's `energy`; {load_note()} "
        f"(other jobs shared the machine: wall times are noisy); case searched in {seconds:.0f} s"
    )

    def describe(best: Best, knob_name: str) -> str:
        if best.evaluations is None:
            return f"not measured: {best.note} ({best.runs} runs)"
        return (
            f"{knob_name} {best.knob:.4g}, max |dE/E| {best.max_error:.3g}, wall {best.wall:.3g} s per system, "
            f"{best.runs} search runs"
        )

    records = []
    ref = mine.get(best_mine, nothing)
    for label, best in theirs.items():
        knob_name = "epsilon" if "IAS15" in label else "dt"
        records.append(
            {
                "case": head,
                "baseline": label,
                "metric": "force evaluations",
                "dynaforge": ref.evaluations,
                "baseline_value": best.evaluations,
                "ratio": best.evaluations / ref.evaluations if best.evaluations and ref.evaluations else None,
                "notes": f"dynaforge's best mode: {best_mine} ({describe(ref, 'knob')}); {label}: "
                f"{describe(best, knob_name)}; {common}",
            }
        )
    rb = theirs.get(best_theirs, nothing)
    for label, best in mine.items():
        learned_scheme = label.split()[-1] if label.startswith("learned") else None
        extra = f"; learned controller {training[learned_scheme]}" if learned_scheme else ""
        records.append(
            {
                "case": head,
                "baseline": f"{best_theirs} (REBOUND's best here)",
                "metric": "force evaluations",
                "dynaforge_mode": label,
                "dynaforge": best.evaluations,
                "baseline_value": rb.evaluations,
                "ratio": rb.evaluations / best.evaluations if best.evaluations and rb.evaluations else None,
                "notes": f"{label}: {describe(best, 'knob')}{extra}; {best_theirs}: {describe(rb, 'knob')}; {common}",
            }
        )
    for scheme in learned:
        lm, cm = mine[f"learned {scheme}"], mine[f"classical {scheme}"]
        records.append(
            {
                "case": head,
                "baseline": f"dynaforge classical criterion on {scheme}",
                "metric": "force evaluations",
                "dynaforge_mode": f"learned {scheme}",
                "dynaforge": lm.evaluations,
                "baseline_value": cm.evaluations,
                "ratio": cm.evaluations / lm.evaluations if lm.evaluations and cm.evaluations else None,
                "notes": f"learned controller {training[scheme]}; learned {describe(lm, 'scale')}; classical "
                f"{describe(cm, 'eta')}; {common}",
            }
        )
    return records


def tables(records: list[dict]) -> str:
    """Markdown: one table of force evaluations per target, a row per system, a column per integrator, the
    best of each row in bold (docs/nbody.md and the README print these)."""
    out = []
    for target in TARGETS:
        suffix = f"at max|dE/E| <= {target:g}"
        rows: dict[str, dict[str, int | None]] = {}
        for r in records:
            if not r["case"].endswith(suffix) or "REBOUND" not in r["baseline"]:
                continue
            row = rows.setdefault(r["case"].split(":")[0], {})
            if "dynaforge_mode" in r:
                row[r["dynaforge_mode"]] = r["dynaforge"]
            else:
                row[r["baseline"]] = r["baseline_value"]
        seen = list(dict.fromkeys(c for row in rows.values() for c in row))
        columns = [c for c in seen if "REBOUND" not in c] + [c for c in seen if "REBOUND" in c]
        out.append(f"Force evaluations {suffix} (n/m: no run within the step cap met it; -: not run):\n")
        short = {kind.label: f"REBOUND {kind.name}" for kind in REBOUND_INTEGRATORS.values()}
        out.append("| system | " + " | ".join(short.get(c, c) for c in columns) + " |")
        out.append("|---" * (len(columns) + 1) + "|")
        for system, row in rows.items():
            measured = [v for v in row.values() if v]
            best = min(measured) if measured else None
            cells = []
            for c in columns:
                v = row.get(c)
                text = "-" if c not in row else ("n/m" if v is None else f"{v:,}")
                cells.append(f"**{text}**" if v is not None and v == best else text)
            out.append(f"| {system} | " + " | ".join(cells) + " |")
        out.append("")
    return "\n".join(out)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--tables"]:
        import json

        print(tables(json.loads(Path(sys.argv[2] if len(sys.argv) > 2 else RESULTS).read_text())))
        sys.exit(0)
    sys.exit(main())
