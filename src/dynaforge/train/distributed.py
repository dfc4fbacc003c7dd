"""Data-parallel training through `torchrun`: process group, samplers, reductions, rank-0 writes.

`torchrun --nproc-per-node=K -m dynaforge.cli train ...` sets RANK, WORLD_SIZE and LOCAL_RANK; the trainer
then joins a process group (NCCL when training on CUDA, gloo on CPU), trains a DDP-wrapped model on its
share of each global batch, reduces losses and metrics across ranks, and lets rank 0 alone write files
(with barriers around checkpoints). Without those variables everything runs in one process.

Data order: `dynaforge.data.order.EpochOrder` gives rank r the positions r, r + W, r + 2W, ... of an
order fixed by (seed, epoch), so the micro-batch i of all ranks together is exactly the batch i of one
process with a W times larger batch, and a resumed run can start anywhere in an epoch.
"""

from __future__ import annotations

import logging
import os
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch import Tensor, nn

from dynaforge.machine import local_rank_device

log = logging.getLogger(__name__)


class Cluster(NamedTuple):
    """Where this process stands among the training processes."""

    rank: int
    world_size: int
    local_rank: int
    owns_group: bool
    """True when this process created the process group (and must destroy it)."""

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one process that writes files and logs."""
        return self.rank == 0


def launched_world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def join_cluster(device: torch.device) -> Cluster:
    """Join (or create) the process group torchrun describes in the environment; one process otherwise."""
    world_size = launched_world_size()
    if world_size <= 1:
        return Cluster(0, 1, 0, owns_group=False)
    owns = not dist.is_initialized()
    if owns:
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend=backend, device_id=device if device.type == "cuda" else None)
    return Cluster(dist.get_rank(), dist.get_world_size(), int(os.environ.get("LOCAL_RANK", "0")), owns)


def rank_device(name: str) -> str:
    """Under torchrun, `auto`/`cuda` mean this rank's GPU (cuda:LOCAL_RANK; `machine.local_rank_device`)."""
    return local_rank_device(name) if launched_world_size() > 1 else name


def leave_cluster(cluster: Cluster) -> None:
    if cluster.owns_group and dist.is_initialized():
        dist.destroy_process_group()


def barrier(cluster: Cluster) -> None:
    if cluster.distributed:
        dist.barrier()


def sum_across_ranks(values: Tensor, cluster: Cluster) -> Tensor:
    """The element-wise sum of `values` over all ranks (a copy; `values` itself is unchanged)."""
    if not cluster.distributed:
        return values
    total = values.clone()
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    return total


def gather_objects(value: Any, cluster: Cluster) -> list[Any]:
    """Every rank's `value`, in rank order (pickled through the process group)."""
    if not cluster.distributed:
        return [value]
    values: list[Any] = [None] * cluster.world_size
    dist.all_gather_object(values, value)
    return values


def check_ranks_agree(model: nn.Module, cluster: Cluster) -> None:
    """Raise if the ranks' weights have drifted apart (compares a float64 checksum of all parameters).

    DDP keeps replicas equal only if every rank applies the same update to the same weights; a model
    or optimiser that breaks that (rank-dependent code, an unsynchronised custom update) would otherwise
    train silently on diverging copies.
    """
    if not cluster.distributed:
        return
    with torch.no_grad():
        local = torch.stack([p.detach().to(torch.float64).sum() for p in model.parameters()]).sum()
        checksums = [torch.zeros_like(local) for _ in range(cluster.world_size)]
        dist.all_gather(checksums, local)
    values = [float(c) for c in checksums]
    if any(v != values[0] for v in values):
        raise RuntimeError(
            f"the {cluster.world_size} ranks hold different weights (parameter checksums {values}); the "
            "model or optimiser does something rank-dependent"
        )


def wrap_data_parallel(model: nn.Module, cluster: Cluster, device: torch.device) -> nn.Module:
    """`model` wrapped in DistributedDataParallel when there are several ranks, else `model` itself.

    Gradients are averaged across ranks during backward and written into each parameter's `.grad` in
    place (not as bucket views: the Muon hybrid's gradient views rely on that).
    """
    if not cluster.distributed:
        return model
    device_ids = [device.index] if device.type == "cuda" else None
    return nn.parallel.DistributedDataParallel(model, device_ids=device_ids, gradient_as_bucket_view=False)
