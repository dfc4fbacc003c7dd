"""`dynaforge generate`: run a system over the samples of a config and hand its rows to the store's writer.

Shards are dealt round-robin to workers (`worker_slot`: --shard-index/--num-shards, torchrun's RANK and
WORLD_SIZE, or a SLURM array); each worker writes its own shards and the manifest is rebuilt under a lock,
so workers on different machines make one dataset. A rerun resumes: complete shards are kept.

`processes=N` (`dynaforge generate --processes N`) starts those N workers itself, as processes of this
machine that share its threads (each gets torch's thread count / N): the CPU solvers' Python loop holds the
GIL, so two threads of one process cannot both keep a 1D rollout busy, two processes can. A sample's bytes
depend on its seed and its solver block alone (docs/reproducibility.md), never on the worker that made it, so
the dataset is the same bytes as one process's. `processes="auto"` (the CLI's default) picks the count by the
rule of `auto_processes`, measured on the machine it names.
"""

from __future__ import annotations

import ctypes
import logging
import multiprocessing
import multiprocessing.connection
import os
import signal
import sys
import threading
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dynaforge.atomic import remove_stale_temporaries
from dynaforge.config import Config, resolve_device
from dynaforge.errors import ConfigError, DynaforgeError
from dynaforge.machine import local_rank_device
from dynaforge.models.loading import controller_for
from dynaforge.store.format import DatasetError, plan_shards, read_record
from dynaforge.store.writer import batches as writer_batches
from dynaforge.store.writer import prepare_folder, shard_is_complete, update_manifest, write_shard
from dynaforge.systems import NBody, System, build_system
from dynaforge.systems.pde.spectral import SpectralSystem
from dynaforge.systems.registry import system_class

log = logging.getLogger(__name__)


def worker_slot(shard_index: int | None, num_shards: int | None) -> tuple[int, int]:
    """This process's (index, count) among generators: explicit flags, else torchrun, else SLURM arrays."""
    if shard_index is not None or num_shards is not None:
        index, count = shard_index or 0, num_shards or 1
    elif "WORLD_SIZE" in os.environ and "RANK" in os.environ:
        index, count = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    elif "SLURM_ARRAY_TASK_ID" in os.environ and "SLURM_ARRAY_TASK_COUNT" in os.environ:
        first = int(os.environ.get("SLURM_ARRAY_TASK_MIN", "0"))
        index, count = (
            int(os.environ["SLURM_ARRAY_TASK_ID"]) - first,
            int(os.environ["SLURM_ARRAY_TASK_COUNT"]),
        )
    else:
        index, count = 0, 1
    if count < 1 or not 0 <= index < count:
        raise DatasetError(
            f"shard index {index} is not in [0, {count}); pass --shard-index I --num-shards K with 0 <= I < K"
        )
    return index, count


def generation_device(name: str) -> torch.device:
    """The device this process generates on, from `dataset.device`: `auto` is CUDA when available, else
    the CPU; under torchrun `auto` and `cuda` are this rank's GPU, cuda:LOCAL_RANK (`local_rank_device`)."""
    return torch.device(resolve_device(local_rank_device(name)))


def system_for(config: Config, device: torch.device | str = "cpu") -> System:
    """The system of `config.system`; an N-body system with learned step control gets its trained
    controller here (`models.step_controller`), since simulators never load networks."""
    system_config = config.system
    if system_config.name == "nbody" and system_config.control.kind == "learned":
        controller = controller_for(system_config.control, system_config.dt, str(device))
        return NBody(system_config, controller)
    return build_system(system_config)


def note_block_padding(config: Config, system: System, device: torch.device, shards: list[Any]) -> None:
    """Say so when the batches the writer steps leave a PDE solver's blocks on the CPU partly empty: each
    batch is padded to whole blocks (so that a sample's numbers never depend on its batch), which costs
    time only."""
    if not isinstance(system, SpectralSystem) or device.type != "cpu":
        return
    block = system.block_samples(device)
    batches = [
        hi - lo for shard in shards for lo, hi in writer_batches(shard.size, config.dataset.batch_size)
    ]
    stepped = sum(-(-n // block) * block for n in batches)
    if stepped > 1.25 * sum(batches):
        log.info(
            "the %s solver steps whole blocks of %d samples on the CPU, so these batches cost %.1fx their "
            "samples' work; dataset.batch_size and dataset.shard_size multiples of %d avoid the padding",
            system.name,
            block,
            stepped / sum(batches),
            block,
        )


AUTO_MIN_WORK = 2**26
"""`processes="auto"` starts worker processes only for at least this many grid-point steps (samples x steps
x grid points): about 1.5 s of one core for a 1D Burgers rollout (ETDRK4, 256 points: 4.4e7 point-steps/s),
so that a small dataset is not split where starting the workers would cost more than it saves."""


def parse_processes(value: int | str) -> int | str:
    """`--processes` / `processes=`: "auto" or a whole number >= 1 (a bad value: a DatasetError naming it)."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return "auto"
    try:
        number = int(value)
    except (TypeError, ValueError):
        number = 0
    if isinstance(value, bool) or number < 1 or str(value).strip() != str(number):
        raise DatasetError(f"--processes must be 'auto' or a whole number of at least 1, not {value!r}")
    return number


def auto_processes(config: Config, shards: int, threads: int, workers: int) -> tuple[int, str]:
    """The worker processes `processes="auto"` starts, and why.

    The rule: a 1D periodic PDE (a `SpectralSystem` of one dimension) generated on the CPU runs as
    min(threads, shards) processes of one thread each when its dataset holds at least `AUTO_MIN_WORK`
    grid-point steps; everything else runs in one process on all the threads. A 1D step is many small
    operations (20-40 us each), so two threads of one process contend for the GIL that issues them, while
    two processes do not; a 2D step's transforms and products are large and run on the threads of one
    process well (docs/benchmarks.md, "Two threads"). Measured on an AMD EPYC (2 vCPUs, AVX2, torch
    2.13.0+cpu), Burgers N=256 ETDRK4, 1,536 samples x 200 steps in shards of 256: the figures and command
    in benchmarks/results/generate_processes.json (`benchmarks/generate_processes.py`). Systems not measured
    (bounded flows, N-body, random CNN, 2D PDEs) keep one process.
    """
    if workers > 1:
        return 1, f"this is one of {workers} workers already"
    try:
        kind = system_class(config.system.name)
    except DynaforgeError:
        return 1, "a system of unknown kind"
    ndim = getattr(config.system, "ndim", 1)
    if not (isinstance(kind, type) and issubclass(kind, SpectralSystem)) or ndim != 1:
        return 1, "not a 1D periodic PDE: its threads work inside one process"
    if resolve_device(config.dataset.device) != "cpu":
        return 1, "generated on a GPU"
    work = sum(config.dataset.split_sizes().values()) * config.system.steps * config.system.resolution
    if work < AUTO_MIN_WORK:
        return 1, f"a small dataset ({work:.3g} grid-point steps < {AUTO_MIN_WORK:.3g})"
    count = min(threads, shards)
    if count < 2:
        return 1, f"{threads} thread(s) and {shards} shard(s)"
    return (
        count,
        f"a 1D PDE on the CPU: {count} processes of one thread beat one process of {threads} threads",
    )


def generate(
    config: Config,
    out: str | Path,
    shard_index: int | None = None,
    num_shards: int | None = None,
    progress: bool | None = None,
    processes: int | str = 1,
) -> dict[str, Any]:
    """Generate (or finish generating) the dataset of `config` in `out`; returns the manifest.

    `progress=None` shows a progress bar only on a terminal. `processes > 1` runs the shards in that many
    worker processes of this machine, "auto" as many as `auto_processes` finds fastest (module docstring).
    """
    check_single_system(config)
    root = Path(out)
    index, count = worker_slot(shard_index, num_shards)
    processes = parse_processes(processes)
    if processes == "auto":
        shards = len(plan_shards(config.dataset.split_sizes(), config.dataset.shard_size))
        processes, why = auto_processes(config, shards, torch.get_num_threads(), count)
        log.info("generation processes: %d (auto: %s)", processes, why)
    assert isinstance(processes, int)
    if processes > 1:
        if count > 1:
            raise DatasetError(
                f"--processes {processes} starts its own workers: it cannot be one of {count} workers "
                "(--shard-index/--num-shards, torchrun or a SLURM array); drop one or the other"
            )
        generate_in_processes(config, root, processes, progress)
        # Each worker checked the shards it wrote (their SHA-256 is taken as they are written); the manifest
        # is rebuilt from their records with a `stat` per shard, not a second pass over every byte. Should
        # one be missing, the pass of one process below finds and makes it.
        manifest = update_manifest(root, config, system_for(config, generation_device(config.dataset.device)))
        return manifest if manifest["complete"] else generate(config, root, progress=False)
    prepare_folder(root, config)
    shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
    mine = [shard for g, shard in enumerate(shards) if g % count == index]
    removed = [
        path for shard in mine for path in remove_stale_temporaries(root / shard.split, Path(shard.file).name)
    ]
    if removed:
        log.info("removed %d partial file(s) left by an interrupted run", len(removed))
    todo = [shard for shard in mine if not shard_is_complete(root, shard)]
    if len(todo) < len(mine):
        log.info(
            "resuming: %d of this worker's %d shards are already complete", len(mine) - len(todo), len(mine)
        )
    device = generation_device(config.dataset.device)
    system = system_for(config, device)
    if todo:
        note_block_padding(config, system, device, todo)
        total = sum(shard.size for shard in todo) * config.system.steps
        disabled = None if progress is None else not progress
        try:
            with tqdm(
                total=total, unit="sample-step", unit_scale=True, disable=disabled, desc="generate"
            ) as bar:
                for shard in todo:
                    write_shard(root, shard, config, system, device, on_steps=bar.update)
        except DatasetError:
            update_manifest(root, config, system)  # a partial dataset: the shards finished so far are listed
            raise
    return update_manifest(root, config, system)


def check_single_system(config: Config) -> None:
    """Refuse a mixture config: a dataset holds one system, and the `system` section a mixture config
    leaves at its defaults would be generated instead of its members."""
    if config.mixture:
        members = ", ".join(member.system.name for member in config.mixture)
        raise ConfigError(
            f"the config is a mixture ({members}): a mixture is generated while training from the stream "
            "(`dynaforge train CONFIG`); to store one member's trajectories, generate a config whose `system` "
            "section is that member's"
        )


def generate_in_processes(config: Config, root: Path, processes: int, progress: bool | None = None) -> None:
    """Worker processes 0..processes-1 each generate their round-robin share of the shards, on
    `torch.get_num_threads() // processes` threads (at least one); raises if any of them failed, after all
    have stopped (what they finished is kept: rerunning resumes). The progress bar counts finished shards."""
    prepare_folder(root, config)
    shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
    count = min(processes, len(shards))
    threads = max(1, torch.get_num_threads() // count)
    log.info("generating %d shard(s) in %d processes of %d thread(s) each", len(shards), count, threads)
    context = multiprocessing.get_context(start_method(config, threads))
    workers = [
        context.Process(target=worker_main, args=(config, str(root), i, count, threads, os.getpid()))
        for i in range(count)
    ]
    for worker in workers:
        worker.start()
    total = sum(shard.size for shard in shards) * config.system.steps
    disabled = None if progress is None else not progress
    try:
        with tqdm(total=total, unit="sample-step", unit_scale=True, disable=disabled, desc="generate") as bar:
            while any(worker.is_alive() for worker in workers):
                multiprocessing.connection.wait([w.sentinel for w in workers if w.is_alive()], 1.0)
                # A record is written after its shard (and checked by its worker): reading the records
                # costs nothing beside the workers, where `shard_is_complete` would hash every finished file
                # again each second.
                done = sum(shard.size for shard in shards if read_record(root / shard.record) is not None)
                bar.update(done * config.system.steps - bar.n)
    finally:
        for worker in workers:  # Ctrl-C: the workers got it too; wait for them to stop
            worker.join()
    failed = [i for i, worker in enumerate(workers) if worker.exitcode != 0]
    if failed:
        raise DatasetError(
            f"generation worker(s) {failed} of {len(workers)} failed (their errors are above); the shards they "
            f"finished are kept in {root}: rerun the same command to resume"
        )


def start_method(config: Config, threads: int) -> str:
    """How `generate_in_processes` starts its workers: "fork" on Linux for CPU generation at one thread per
    worker from a process with no other Python thread and no CUDA context (a fork starts in milliseconds and
    shares the loaded torch; a spawned interpreter imports torch and dynaforge again, 4-7 s on the AMD EPYC
    while generating, measured), else "spawn" (a fresh interpreter: no forked OpenMP pool, CUDA or HDF5
    state). A worker of one thread enters no OpenMP parallel region, so a pool the parent started is never
    used in the child."""
    forkable = (
        sys.platform.startswith("linux")
        and threads == 1
        and threading.active_count() == 1
        and not torch.cuda.is_initialized()
        and resolve_device(config.dataset.device) == "cpu"
    )
    return "fork" if forkable else "spawn"


def die_with_parent(parent: int) -> None:
    """On Linux, this worker gets SIGKILL when the process that started it dies (a killed `generate` leaves
    no orphan writing shards beside the rerun that resumes it)."""
    if not sys.platform.startswith("linux"):
        return
    PR_SET_PDEATHSIG = 1
    with_errors = ctypes.CDLL(None, use_errno=True)
    with_errors.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent:  # the parent died before the call above
        os._exit(1)


def worker_main(config: Config, root: str, index: int, count: int, threads: int, parent: int = 0) -> None:
    """One worker process of `generate_in_processes`: an expected failure is one `error:` line, exit 2."""
    if parent:
        die_with_parent(parent)
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        generate(config, root, shard_index=index, num_shards=count, progress=False)
    except DynaforgeError as error:
        print(f"error: generation worker {index}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
