"""Training to a wall-clock budget (`train.time_budget`): the part of `Engine` that turns the budget into a
number of epochs before the first step (`plan_budget`, from a few timed steps), counts them again at the end
of the first epoch from that epoch's measured time and once more when a quarter of the budget is spent, from
the epochs since the first (`settle_budget`), and ends a run that has overrun its budget by `OVERRUN`
(`end_if_out_of_time`). The count is kept in checkpoints (`run_checkpoints.py`): a run resumed after the
last count is a run of that many epochs like any other.

Why twice: the first epoch pays for warm-up (caches, allocator, lazy compilation) and for whatever else ran
on the machine at the start, and the whole run was planned on it. A 3,600 s run whose first epoch ran
beside a benchmark stopped at 2,404 s (docs/benchmarks.md, issue 36's hour); one whose first epoch ran
faster than the rest would overrun. The second count reads the epochs after the first. It comes a quarter
of the way in, where the cosine schedule is still near its peak: laying it over another count then moves
the lr little (at most from 0.85 to 0.93 of the peak for a count 1.5 times larger).

`TimeBudget` is a part of `Engine`, split out by concern: its methods read and set the engine's attributes
(`settings`, `task`, `epoch_count`, `scheduler`, `records`, `meter`, ...) and call its steps.
"""

from __future__ import annotations

import copy
import logging
import time

import torch

from dynaforge.runs import save_checkpoint
from dynaforge.train.checkpoint import load_trained_state, restore_rng_state, rng_state, trained_state
from dynaforge.train.distributed import sum_across_ranks
from dynaforge.train.schedule import epochs_in_budget, epochs_to_run

log = logging.getLogger(__name__)

PROBE_MICRO_BATCHES = 6
"""Micro-batches a time budget's plan times (the first is not counted: it pays for warm-up)."""
OVERRUN = 1.25
"""A time-budget run that has spent this multiple of its budget with epochs still planned ends there."""
RECOUNT_AT = 0.25
"""The fraction of its budget after which a budget run counts its epochs a second time, at the end of the
first epoch after the first that ends past it (module docstring)."""


class TimeBudget:
    """The time-budget methods of `Engine` (see the module docstring)."""

    # Where the plan stands (set by `Engine.__init__`, restored on resume): when the first epoch began, what
    # an epoch's checkpoints cost, when the first epoch's count was made (the epochs after it are timed from
    # there), and whether the second count is still to come.
    budget_epoch_began: float
    budget_checkpoint_seconds: float
    budget_first_counted: float
    budget_recount_due: bool
    elapsed_before: float
    started: float

    def plan_budget(self, budget: float) -> None:
        """`train.time_budget` as a whole number of epochs (`schedule.epochs_in_budget`), timed by
        `time_an_epoch`, with the schedule laid over them; logged as a `budget` record."""
        micro_batch, validation, checkpoints = self.time_an_epoch()
        micro_batches = self.task.micro_batches(0)
        (now,) = self.averaged([self.elapsed()])  # every process plans alike
        self.span_epochs(epochs_in_budget(budget - now, micro_batches, micro_batch, validation + checkpoints))
        self.budget_checkpoint_seconds = checkpoints
        self.budget_epoch_began = self.elapsed()
        plan = {
            "epochs": self.epoch_count,
            "micro_batch_seconds": micro_batch,
            "validation_seconds": validation,
            "checkpoint_seconds": checkpoints,
        }
        self.records.write({"kind": "budget", "budget": budget, "elapsed": now, **plan})
        log.info(
            "time budget %.0f s: %d epochs (%.3g s per micro-batch, %.3g s per validation and checkpoints)",
            budget,
            self.epoch_count,
            micro_batch,
            validation + checkpoints,
        )

    def span_epochs(self, epochs: int) -> None:
        """Make this a run of `epochs` epochs, the schedule laid over them (from the step it has reached)."""
        self.epoch_count = epochs
        self.scheduler.respan(self.schedule_length(epochs))

    def settle_budget(self, epoch: int) -> None:
        """Count a time-budget run's epochs again: at the end of the first epoch from that epoch's measured
        time (a few probe steps mispredicted whole runs by up to a fifth: 92 to 143 s of a 120 s budget,
        docs/literature.md), and at the end of the first later epoch that ends past `RECOUNT_AT` of the budget
        from the epochs since the first (module docstring), unless it is the last planned. Times are averaged
        over the processes. The schedule continues from where it is, laid over the new count, which is saved
        in checkpoints. Each count is logged as a `budget` record."""
        budget = self.settings.time_budget
        first = epoch == 0  # a run resumed after its first epoch never ends epoch 0 again
        if budget is None or not (first or (self.budget_recount_due and epoch + 1 < self.epoch_count)):
            return
        # Every process decides alike, on the times averaged over them (a collective, so all must call it).
        since = self.budget_epoch_began if first else self.budget_first_counted
        own = self.elapsed()
        now, spent = self.averaged([own, own - since])
        checkpoints = self.budget_checkpoint_seconds
        if first:
            # Its checkpoints are not written yet; the later epochs' time includes theirs.
            epoch_seconds = spent + checkpoints
            self.budget_first_counted, self.budget_recount_due = own, True
        elif now >= RECOUNT_AT * budget:
            epoch_seconds = spent / epoch  # the epochs after the first
            self.budget_recount_due = False
        else:
            return
        planned = self.epoch_count
        self.span_epochs(epochs_to_run(epoch + 1, budget - now - checkpoints, epoch_seconds))
        self.records.write(
            {
                "kind": "budget",
                "budget": budget,
                "elapsed": now,
                "settled": True,
                "step": self.step,  # a resumed run keeps only the counts its checkpoint holds (log.py)
                "after_epoch": epoch + 1,
                "epochs": self.epoch_count,
                "planned_epochs": planned,
                "epoch_seconds": epoch_seconds,
                "checkpoint_seconds": checkpoints,
            }
        )
        if self.epoch_count != planned:
            log.info(
                "time budget %.0f s: %d epochs after all (%.3g s per epoch after epoch %d; %d were planned)",
                budget,
                self.epoch_count,
                epoch_seconds,
                epoch + 1,
                planned,
            )

    def time_an_epoch(self) -> tuple[float, float, float]:
        """Seconds of a micro-batch's step (the median of a few, after one that warms up), of a validation
        and of an epoch's checkpoint files, averaged over the processes; then every trace of the timed steps
        is undone (weights, optimiser, schedule, EMA, generators, meters)."""
        saved, generators = copy.deepcopy(trained_state(self.trained())), rng_state()
        self.model.train()
        self.current_epoch = 0
        probe = min(PROBE_MICRO_BATCHES, self.task.micro_batches(0))
        steps = []
        for index, batch in zip(range(probe), self.task.epoch_batches(0, 0), strict=False):
            began = time.perf_counter()
            self.batches_done = index + 1
            self.micro_step(batch)
            if self.device.type == "cuda":
                torch.cuda.synchronize(self.device)
            steps.append(time.perf_counter() - began)
        began = time.perf_counter()
        self.validate()
        validation = time.perf_counter() - began
        checkpoints = 0.0
        if self.cluster.main:  # last.pt, best.pt when improved, and a kept snapshot (only rank 0 writes)
            began, probe_file = time.perf_counter(), self.run.last.with_name("budget-probe.pt")
            save_checkpoint(probe_file, saved)
            files = 2 + (self.settings.keep_every > 0)
            checkpoints = (time.perf_counter() - began) * files * self.cluster.world_size
            probe_file.unlink()
        timed = sorted(steps[1:] or steps)
        measured = torch.tensor(
            [timed[len(timed) // 2], validation, checkpoints], dtype=torch.float64, device=self.device
        )
        load_trained_state(self.trained(), saved)
        restore_rng_state(generators)
        self.free_gradients()
        self.batches_done, self.step_samples, self.val_details = 0, 0, {}
        self.meter.reset()
        self.meter.epoch.zero_()
        micro_batch, validation, checkpoints = (
            sum_across_ranks(measured, self.cluster) / self.cluster.world_size
        ).tolist()
        return micro_batch, validation, checkpoints

    def end_if_out_of_time(self, epoch: int) -> None:
        """A time budget's safety net: when a slowed-down machine has spent `OVERRUN` times the budget with
        epochs still planned, this epoch becomes the last (its checkpoint then says the run is complete). A
        plan that misses by less runs to its end, so that the schedule does."""
        budget = self.settings.time_budget
        if budget is None or epoch + 1 >= self.epoch_count:
            return
        (spent,) = self.averaged([self.elapsed()])  # every process ends at the same epoch
        if spent < OVERRUN * budget:
            return
        log.warning(
            "%.0f s spent of a time budget of %.0f s after epoch %d of the %d planned; training ends here, "
            "its schedule cut short",
            spent,
            budget,
            epoch + 1,
            self.epoch_count,
        )
        self.epoch_count = epoch + 1

    def averaged(self, values: list[float]) -> list[float]:
        """`values` averaged over the processes (a collective: every process must call it), so that a
        decision taken on them is the same on every process; under DDP one that differed would leave the
        processes waiting on each other."""
        measured = torch.tensor(values, dtype=torch.float64, device=self.device)
        return (sum_across_ranks(measured, self.cluster) / self.cluster.world_size).tolist()

    def elapsed(self) -> float:
        """Seconds this run has trained, over every process that worked on it (resumes included)."""
        return self.elapsed_before + time.perf_counter() - self.started
