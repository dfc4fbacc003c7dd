"""`dynaforge generate`: run a system over the samples of a config and hand its rows to the store's writer.

Shards are dealt round-robin to workers (`worker_slot`: --shard-index/--num-shards, torchrun's RANK and
WORLD_SIZE, or a SLURM array); each worker writes its own shards and the manifest is rebuilt under a lock,
so workers on different machines make one dataset. A rerun resumes: complete shards are kept.

`processes=N` (`dynaforge generate --processes N`) starts those N workers itself, as processes of this
machine that share its threads (each gets torch's thread count / N): the CPU solvers' Python loop holds the
GIL, so two threads of one process cannot both keep a 1D rollout busy, two processes can. A sample's bytes
depend on its seed and its solver block alone (docs/reproducibility.md), never on the worker that made it, so
the dataset is the same bytes as one process's.
"""

from __future__ import annotations

import logging
import multiprocessing
import multiprocessing.connection
import os
import sys
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

from dynaforge.atomic import remove_stale_temporaries
from dynaforge.config import Config, resolve_device
from dynaforge.errors import DynaforgeError
from dynaforge.machine import local_rank_device
from dynaforge.models.loading import controller_for
from dynaforge.store.format import DatasetError, plan_shards
from dynaforge.store.writer import batches as writer_batches
from dynaforge.store.writer import prepare_folder, shard_is_complete, update_manifest, write_shard
from dynaforge.systems import NBody, System, build_system
from dynaforge.systems.pde.spectral import SpectralSystem

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


def generate(
    config: Config,
    out: str | Path,
    shard_index: int | None = None,
    num_shards: int | None = None,
    progress: bool | None = None,
    processes: int = 1,
) -> dict[str, Any]:
    """Generate (or finish generating) the dataset of `config` in `out`; returns the manifest.

    `progress=None` shows a progress bar only on a terminal. `processes > 1` runs the shards in that many
    worker processes of this machine (module docstring).
    """
    root = Path(out)
    index, count = worker_slot(shard_index, num_shards)
    if processes > 1:
        if count > 1:
            raise DatasetError(
                f"--processes {processes} starts its own workers: it cannot be one of {count} workers "
                "(--shard-index/--num-shards, torchrun or a SLURM array); drop one or the other"
            )
        generate_in_processes(config, root, processes, progress)
        return generate(
            config, root, progress=False
        )  # every shard is complete: checks them, writes the manifest
    if processes < 1:
        raise DatasetError(f"--processes must be at least 1, not {processes}")
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


def generate_in_processes(config: Config, root: Path, processes: int, progress: bool | None = None) -> None:
    """Worker processes 0..processes-1 each generate their round-robin share of the shards, on
    `torch.get_num_threads() // processes` threads (at least one); raises if any of them failed, after all
    have stopped (what they finished is kept: rerunning resumes). The progress bar counts finished shards."""
    prepare_folder(root, config)
    shards = plan_shards(config.dataset.split_sizes(), config.dataset.shard_size)
    count = min(processes, len(shards))
    threads = max(1, torch.get_num_threads() // count)
    log.info("generating %d shard(s) in %d processes of %d thread(s) each", len(shards), count, threads)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no forked torch or HDF5 state
    workers = [
        context.Process(target=worker_main, args=(config, str(root), i, count, threads)) for i in range(count)
    ]
    for worker in workers:
        worker.start()
    total = sum(shard.size for shard in shards) * config.system.steps
    disabled = None if progress is None else not progress
    try:
        with tqdm(total=total, unit="sample-step", unit_scale=True, disable=disabled, desc="generate") as bar:
            while any(worker.is_alive() for worker in workers):
                multiprocessing.connection.wait([w.sentinel for w in workers if w.is_alive()], 1.0)
                done = sum(shard.size for shard in shards if shard_is_complete(root, shard))
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


def worker_main(config: Config, root: str, index: int, count: int, threads: int) -> None:
    """One worker process of `generate_in_processes`: an expected failure is one `error:` line, exit 2."""
    torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s")
    try:
        generate(config, root, shard_index=index, num_shards=count, progress=False)
    except DynaforgeError as error:
        print(f"error: generation worker {index}: {error}", file=sys.stderr)
        raise SystemExit(2) from None
