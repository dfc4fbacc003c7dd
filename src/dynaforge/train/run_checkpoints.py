"""The engine's checkpoints: best.pt, last.pt and kept snapshots written at an epoch's end, last.pt
mid-epoch (every `train.checkpoint_every` steps and on Ctrl-C), and a run restored from its last one. What a
checkpoint holds is listed in `dynaforge.runs`; the state of the objects training updates is
`checkpoint.py`'s.

`RunCheckpoints` is a part of `Engine`, split out by concern: its methods read and set the engine's
attributes (`run`, `task`, `cluster`, `step`, `epoch`, `batches_done`, the losses, ...).
"""

from __future__ import annotations

import logging
import shutil
from typing import Any

import torch

import dynaforge
from dynaforge.config import config_to_dict
from dynaforge.errors import OUT, RunError
from dynaforge.runs import CHECKPOINT_VERSION, save_checkpoint
from dynaforge.train.checkpoint import load_trained_state, restore_rng_state, rng_state, trained_state
from dynaforge.train.distributed import barrier, check_ranks_agree, gather_objects
from dynaforge.train.log import epoch_metrics
from dynaforge.train.setup import warn_if_threads_changed

log = logging.getLogger(__name__)


class RunCheckpoints:
    """The checkpoint methods of `Engine` (see the module docstring)."""

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint written by `save_checkpoints` of a run of the same config."""
        if "rng" not in state or "position" not in state:
            raise RunError(f"{self.resume_from} predates resumable checkpoints; train this run afresh")
        if state.get("kind") != self.task.kind:
            raise RunError(
                f"{self.resume_from} was written by another kind of training ({state.get('kind')!r}); "
                f"train into another {OUT} folder"
            )
        load_trained_state(self.trained(), state)
        ranks = state["rng"] if isinstance(state["rng"], list) else [state["rng"]]
        if len(ranks) != self.cluster.world_size:
            log.warning(
                "resuming %d-process training with %d processes: random streams differ",
                len(ranks),
                self.cluster.world_size,
            )
        restore_rng_state(ranks[self.cluster.rank % len(ranks)])
        warn_if_threads_changed(self.run.root, state.get("torch_threads"))
        self.task.restore(state)
        self.step = int(state["step"])
        self.epoch = int(state["position"]["epoch"])
        self.batches_done = int(state["position"]["batches"])
        self.best_val_loss = float(state["best_val_loss"])
        self.val_loss = float(state["val_loss"])
        self.skipped_steps = int(state["skipped_steps"])
        self.elapsed_before = float(state.get("elapsed", 0.0))
        self.epoch_count = int(state.get("budget_epochs", self.epoch_count))
        self.budget_epoch_began = float(state.get("budget_epoch_began", 0.0))
        self.budget_checkpoint_seconds = float(state.get("budget_checkpoint_seconds", 0.0))
        self.budget_first_counted = float(state.get("budget_first_counted", 0.0))
        # Checkpoints from before the second count have no flag: their runs keep the count they saved.
        self.budget_recount_due = bool(state.get("budget_recount_due", False))
        self.meter.epoch.copy_(torch.tensor(state["epoch_loss"], dtype=torch.float64))
        if state["complete"]:
            log.info("%s has finished training; nothing to resume", self.run.root)
            return
        if self.cluster.main:
            shutil.rmtree(self.run.eval, ignore_errors=True)  # made from weights training moves on from
        where = {"step": self.step, "epoch": self.epoch + 1, "batch": self.batches_done}
        self.records.resume(self.step, {"kind": "resume", **where, "world_size": self.cluster.world_size})
        log.info("resuming %s from %s at %s", self.run.root, self.resume_from.name, where)

    def report_finished_epochs(self) -> None:
        """Callbacks also hear of the epochs a resumed run had finished (a killed run may not have told them)."""
        if not self.callbacks:
            return
        for epoch, metrics in epoch_metrics(self.run.metrics, self.epoch):
            for callback in self.callbacks:
                callback(epoch, metrics)

    def save_progress_if_due(self, epoch: int) -> None:
        """A mid-epoch last.pt every `checkpoint_every` steps (the epoch's end writes its own), and when
        Ctrl-C asked to stop (`StopRequest`), which training then does."""
        every = self.settings.checkpoint_every
        if self.batches_done < self.task.micro_batches(epoch):
            if self.stop.asked or (every and self.step % every == 0):
                self.save_checkpoints(epochs_done=epoch)
            self.stop.stop_if_asked(self.run.last, self.step)

    def save_checkpoints(self, epochs_done: int) -> None:
        """At an epoch's end: best.pt when the validation loss improved, then last.pt (so a complete last.pt
        implies best.pt). Mid-epoch (`epochs_done` = the current epoch): last.pt only. Rank 0 writes."""
        at_epoch_end = self.batches_done == self.task.micro_batches(self.current_epoch)
        improved = at_epoch_end and self.val_loss < self.best_val_loss
        if improved:
            self.best_val_loss = self.val_loss
        position = {"epoch": epochs_done, "batches": 0 if at_epoch_end else self.batches_done}
        epoch_loss = [0.0, 0.0] if at_epoch_end else self.meter.epoch.tolist()
        check_ranks_agree(self.model, self.cluster)
        generators = gather_objects(rng_state(), self.cluster)  # every rank takes part
        if self.cluster.main:
            state = self.checkpoint_state(epochs_done, position, generators, epoch_loss)
            if improved:
                save_checkpoint(self.run.best, state)
            save_checkpoint(self.run.last, state)
            keep = self.settings.keep_every
            if at_epoch_end and keep and epochs_done % keep == 0:
                save_checkpoint(self.run.last.with_name(f"epoch-{epochs_done}.pt"), state)
            if at_epoch_end:
                aliases = ["latest", f"epoch-{epochs_done}"] + (["best"] if improved else [])
                metadata = {"epoch": epochs_done, "step": self.step, "val_loss": self.val_loss}
                self.records.checkpoint(self.run.last, aliases, metadata)
        barrier(self.cluster)
        if at_epoch_end:
            self.epoch = epochs_done
            self.batches_done = 0
            self.meter.epoch.zero_()
            metrics = {
                "val_loss": self.val_loss,
                **self.val_details,
                "best_val_loss": self.best_val_loss,
                "train_loss": self.train_loss,
            }
            for callback in self.callbacks:
                callback(epochs_done, metrics)

    def checkpoint_state(
        self,
        epochs_done: int,
        position: dict[str, int],
        generators: list[dict[str, Any]],
        epoch_loss: list[float],
    ) -> dict[str, Any]:
        state: dict[str, Any] = {
            "format_version": CHECKPOINT_VERSION,
            "dynaforge_version": dynaforge.__version__,
            **trained_state(self.trained()),
            "rng": generators,
            "epoch": epochs_done,
            "step": self.step,
            "position": position,
            "epoch_loss": epoch_loss,
            "skipped_steps": self.skipped_steps,
            "complete": epochs_done == self.epoch_count and position["batches"] == 0,
            "val_loss": self.val_loss,
            "best_val_loss": self.best_val_loss,
            "config": config_to_dict(self.config),
            "world_size": self.cluster.world_size,
            "torch_threads": torch.get_num_threads(),
            "elapsed": self.elapsed(),
        }
        if self.settings.time_budget is not None:
            state["budget_epochs"] = self.epoch_count
            state["budget_epoch_began"] = self.budget_epoch_began
            state["budget_checkpoint_seconds"] = self.budget_checkpoint_seconds
            state["budget_first_counted"] = self.budget_first_counted
            state["budget_recount_due"] = self.budget_recount_due
        if self.task.kind is not None:
            state["kind"] = self.task.kind
        state.update(self.task.checkpoint_extras())
        return state
