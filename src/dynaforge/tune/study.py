"""`dynaforge tune`: an Optuna study over any training config, in a study folder.

STUDY/study.db           the Optuna storage (default; or `--storage URL`, e.g. PostgreSQL: see `storage.py`)
STUDY/config.yaml        the study's config (a later process must bring the same one)
STUDY/data/              the dataset every PDE trial trains on (generated once, unless `--data` is given)
STUDY/trials/NNNN/       the run folder of trial NNNN (kept, pruned trials included)
STUDY/best/              the best trial's config.yaml, metrics.jsonl, checkpoints/ and trial.json
STUDY/plots/*.png        optimisation history, parameter importances, parallel coordinates
STUDY/summary.md, .json  trial counts by state, the best trial(s), their values and parameters

`--trials N` is the number of finished (complete or pruned) trials the study should hold: a process runs
trials until the study has N, so a study that was interrupted resumes where it stopped when the same
command is run again, and several processes (on one machine, or on several sharing a PostgreSQL database,
each machine with its own study folder) can work on one study at once. A process starts a trial only
while the study holds fewer than N finished or running ones, counted under a lock (`storage.py`), so the
study ends with N finished trials, not one more per process. A failed trial is retried `tune.retries`
times with the same values, continuing its run folder from its last checkpoint (where that folder is on
another machine's study folder, the retry starts the run afresh in its own). A trial whose process was
killed is failed (and so retried) by the next process that joins the study: at once on the killed process's
own host, where the trial's recorded PID and process start show that the process is gone (`processes.py`);
on other hosts once its heartbeat, sent every `tune.heartbeat` seconds, is twice that old (as the next
process starts a trial).
"""

from __future__ import annotations

import logging
import math
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

import optuna
from optuna.storages import RDBStorage, RetryHeartbeatStaleTrialCallback
from optuna.trial import TrialState

from dynaforge.atomic import check_output_folder
from dynaforge.config import Config, ConfigError, config_to_dict, load_config, save_config
from dynaforge.errors import OUT, RunError
from dynaforge.generate import generate
from dynaforge.pipeline import dataset_is_complete
from dynaforge.runs import check_same_run
from dynaforge.tune.folder import STUDY_ENTRIES, StudyFolder, optuna_warnings_quiet, study_folder
from dynaforge.tune.processes import PROCESS_ATTR, fail_trials_of_gone_processes, this_process
from dynaforge.tune.report import write_outputs
from dynaforge.tune.space import DATA_SECTIONS, check_space, config_with_values, suggest
from dynaforge.tune.storage import StudyLock, check_storage_url, engine_kwargs
from dynaforge.tune.trials import (
    check_objectives,
    known_metrics,
    objective_values,
    reporter_for,
    train_controller_trial,
    train_pde_trial,
)

log = logging.getLogger(__name__)

FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
"""Trial states that count towards `--trials`."""


class StudyResult(NamedTuple):
    folder: Path
    study: optuna.Study
    summary: dict[str, Any]


def is_controller(config: Config) -> bool:
    """N-body configs tune the learned step controller; every other config tunes a PDE surrogate."""
    return config.system.name == "nbody"


def run_study(
    config: Config,
    trials: int,
    out: str | Path,
    study_name: str,
    storage: str | None = None,
    data: str | Path | None = None,
    progress: bool | None = None,
) -> StudyResult:
    """Run trials of `config` until study `study_name` holds `trials` finished trials; write the outputs."""
    if trials < 1:
        raise ConfigError(f"--trials must be >= 1, got {trials}")
    folder = study_folder(out)
    url = storage or config.tune.storage or f"sqlite:///{folder.database.resolve()}"
    check_storage_url(url)
    check_space(config, () if is_controller(config) else DATA_SECTIONS)
    check_objectives(config.tune.objectives, known_metrics(config, is_controller(config)))
    check_output_folder(folder.root, STUDY_ENTRIES, "a study folder", RunError)
    with StudyLock(url, folder.root, study_name, "setup"):
        claim_folder(folder, config)
        data_root = None if is_controller(config) else prepare_data(config, folder, data, progress)
        study = open_study(config, url, study_name)
        with optuna_warnings_quiet():
            fail_trials_of_gone_processes(study, retry_callback(config))
    finished = count_finished(study)
    if finished < trials:
        log.info("study %s: %d of %d trials finished; running the rest", study_name, finished, trials)
        run_trials(
            study,
            trials,
            trials - finished,
            StudyLock(url, folder.root, study_name, "claim"),
            lambda trial: run_trial(trial, config, folder, data_root, study_name),
        )
    else:
        log.info("study %s already holds %d finished trials", study_name, finished)
    summary = write_outputs(study, folder, config)
    return StudyResult(folder.root, study, summary)


def run_trials(
    study: optuna.Study,
    trials: int,
    attempts: int,
    claim: StudyLock,
    objective: Callable[[optuna.Trial], float | list[float]],
) -> None:
    """Start trials one at a time, each under the claim lock while the study holds fewer than `trials`
    finished or running ones, at most `attempts` of them (failed trials do not count towards `trials`, so
    a study whose every trial fails still ends)."""

    def claimed(trial: optuna.Trial) -> float | list[float]:
        claim.release()  # the trial is RUNNING in the database now: the next claim counts it
        return objective(trial)

    for _ in range(attempts):
        with claim, optuna_warnings_quiet():
            # A trial whose heartbeat stopped (its process died on another host) frees its place first.
            optuna.storages.fail_stale_trials(study)
            if count_finished(study) + count_running(study) >= trials:
                return
            study.optimize(
                claimed,
                n_trials=1,
                # A trial that diverges or whose values do not fit together (a ValueError of the model, e.g.
                # more Fourier modes than the grid has) fails alone; Optuna logs why, the study goes on.
                catch=(RunError, ValueError),
            )


def claim_folder(folder: StudyFolder, config: Config) -> None:
    """Save the study's config, or check that it is the one the folder's study was started with."""
    folder.root.mkdir(parents=True, exist_ok=True)
    if folder.config.exists():
        check_same_run(
            config_to_dict(load_config(folder.config)),
            config_to_dict(config),
            f"study folder {folder.root}",
            f"Pass the study's own config ({folder.config}), or use another {OUT} folder.",
            ignored=(),  # the search (tune section) is part of what a study is
        )
    else:
        save_config(config, folder.config)


def prepare_data(config: Config, folder: StudyFolder, data: str | Path | None, progress: bool | None) -> Path:
    """The dataset every PDE trial trains on: `data` when given, else STUDY/data (generated once)."""
    if data is not None:
        return Path(data).resolve()
    if not dataset_is_complete(folder.data, config):
        generate(config, folder.data, progress=progress)
    return folder.data.resolve()


def open_study(config: Config, url: str, name: str) -> optuna.Study:
    """Create the study or load it (same name and storage): sampler, pruner, heartbeat storage."""
    tune = config.tune
    with optuna_warnings_quiet():
        storage = RDBStorage(
            url,
            engine_kwargs=engine_kwargs(url),
            heartbeat_interval=tune.heartbeat,
            grace_period=2 * tune.heartbeat,
            heartbeat_stale_trial_callback=retry_callback(config),
        )
        directions = [o.direction for o in tune.objectives]
        study = optuna.create_study(
            study_name=name, storage=storage, directions=directions, load_if_exists=True
        )
    if [d.name.lower() for d in study.directions] != directions:
        raise ConfigError(
            f"study {name!r} in {url} optimises {[d.name.lower() for d in study.directions]}, but "
            f"tune.objectives asks for {directions}; use another --study name"
        )
    # Each process that joins the study draws from its own stream: the seed plus its arrival number (so two
    # processes started together do not draw the same values; a study run by one process is reproducible).
    arrival = int(study.user_attrs.get("processes", 0))
    study.set_user_attr("processes", arrival + 1)
    study.sampler = build_sampler(tune.sampler, tune.seed + 1000 * arrival, len(directions))
    study.pruner = build_pruner(config)
    return study


def retry_callback(config: Config) -> RetryHeartbeatStaleTrialCallback:
    """What happens to a trial failed for its process: a WAITING copy with its values and reports, up to
    `tune.retries` times."""
    with optuna_warnings_quiet():
        return RetryHeartbeatStaleTrialCallback(
            max_retry=config.tune.retries, inherit_intermediate_values=True
        )


def build_sampler(name: str, seed: int, objectives: int) -> optuna.samplers.BaseSampler:
    with optuna_warnings_quiet():
        if name == "random":
            return optuna.samplers.RandomSampler(seed=seed)
        if name == "nsga2":
            return optuna.samplers.NSGAIISampler(seed=seed)
        return optuna.samplers.TPESampler(seed=seed, multivariate=objectives == 1)


def build_pruner(config: Config) -> optuna.pruners.BasePruner:
    pruner = config.tune.pruner
    if pruner.name == "none":
        return optuna.pruners.NopPruner()
    if pruner.name == "percentile":
        return optuna.pruners.PercentilePruner(
            pruner.percentile, n_startup_trials=pruner.startup_trials, n_warmup_steps=pruner.warmup_epochs
        )
    if pruner.name == "successive_halving":
        return optuna.pruners.SuccessiveHalvingPruner()
    if pruner.name == "hyperband":
        return optuna.pruners.HyperbandPruner(min_resource=1, max_resource=max_resource(config))
    return optuna.pruners.MedianPruner(
        n_startup_trials=pruner.startup_trials, n_warmup_steps=pruner.warmup_epochs
    )


def max_resource(config: Config) -> int:
    """Intermediate values of a full trial's last report: its last epoch (the controller's epochs are
    `timestepper.eval_every` steps)."""
    if is_controller(config):
        return math.ceil(config.timestepper.steps / config.timestepper.eval_every)
    return config.train.epochs


def count_finished(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=FINISHED))


def count_running(study: optuna.Study) -> int:
    return len(study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)))


def run_trial(
    trial: optuna.Trial, config: Config, folder: StudyFolder, data: Path | None, study_name: str
) -> float | list[float]:
    """The objective: draw the values, train the trial's config, return its objective value(s)."""
    trial.set_user_attr(PROCESS_ATTR, this_process(trial.number))  # first: a killed trial is known at once
    values = suggest(trial, config.tune.space)
    root = root_trial_number(trial)
    trial_config = config_for_trial(config_with_values(config, values), study_name, root)
    run = folder.trial(root)
    resume = root != trial.number
    trial.set_user_attr("run", str(run.relative_to(folder.root)))
    trial.set_user_attr("host", socket.gethostname())
    trial.set_user_attr("pid", os.getpid())
    reported = inherited_steps(trial, root)
    report = reporter_for(trial, config.tune.objectives, reported)
    log.info(
        "trial %d%s: %s",
        trial.number,
        f" (retry of {root}, continuing {run})" if resume else "",
        ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()),
    )
    if data is None:
        metrics = train_controller_trial(trial_config, run, report, resume)
    else:
        metrics = train_pde_trial(trial_config, data, run, report, resume)
    for key, value in metrics.items():
        trial.set_user_attr(f"metric:{key}", value)
    result = objective_values(metrics, config.tune.objectives)
    return result[0] if len(result) == 1 else result


def retry_history(trial: optuna.Trial) -> list[int]:
    """Numbers of the failed trials this one retries, the first trial of the chain first."""
    frozen = next(t for t in trial.study.get_trials(deepcopy=False) if t.number == trial.number)
    with optuna_warnings_quiet():
        return list(RetryHeartbeatStaleTrialCallback.retry_history(frozen))


def root_trial_number(trial: optuna.Trial) -> int:
    """The number of the first trial in a chain of retries (whose run folder the retries continue)."""
    history = retry_history(trial)
    return history[0] if history else trial.number


def inherited_steps(trial: optuna.Trial, root: int) -> set[int]:
    """Steps already reported by the trials this one retries (their values were inherited)."""
    if root == trial.number:
        return set()
    retried = set(retry_history(trial))
    steps: set[int] = set()
    for frozen in trial.study.get_trials(deepcopy=False):
        if frozen.number in retried:
            steps |= set(frozen.intermediate_values)
    return steps


def config_for_trial(config: Config, study_name: str, number: int) -> Config:
    """The trial's config: W&B runs (when enabled) grouped by study and named after the trial."""
    wandb = config.train.wandb
    if not wandb.enabled:
        return config
    return config_with_values(
        config,
        {
            "train.wandb.group": wandb.group or study_name,
            "train.wandb.name": wandb.name or f"{study_name}-trial-{number:04d}",
        },
    )
