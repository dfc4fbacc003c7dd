"""`dynaforge run`: generate -> train -> evaluate from one config, into ROOT/data and ROOT/run.

With `data.source: stream` ROOT/data holds only the val and test splits (`stored_part`); training generates
its samples as it runs and validates on ROOT/data's val split.

Each stage is skipped when its complete output already exists for the same config: a complete dataset
with the same identity, a run whose last checkpoint is complete, an evaluation made from the current
checkpoint with the same `evaluate` section. An unfinished training run of the same config is resumed
from its last checkpoint (a dataset is resumed shard by shard). A different config for an existing stage output is an error
(nothing is overwritten), except the `evaluate` section, which only reruns the evaluation.

`evaluate_members` (`dynaforge evaluate RUN --members`) scores a run trained on a mixture on each member's
own test trajectories, generated into RUN/members/ once. A mixture config runs as train (from the stream,
into ROOT/run) -> evaluate on every member (`run_mixture`): there is no dataset to generate.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from pathlib import Path

from dynaforge.atomic import atomic_write_bytes, atomic_write_json, check_output_folder
from dynaforge.config import (
    Config,
    EvaluateConfig,
    config_differences,
    config_to_dict,
    load_config,
    save_config,
)
from dynaforge.data.mixture import member_seed
from dynaforge.errors import OUT, ConfigError, RunError
from dynaforge.evaluate import EvaluationResult, evaluate, evaluation_is_current
from dynaforge.evaluate.plots import figure_to_png, members_figure
from dynaforge.generate import generate
from dynaforge.runs import check_same_run, holds_run, load_checkpoint, run_folder
from dynaforge.store.format import MANIFEST
from dynaforge.store.writer import identity_of
from dynaforge.train import train
from dynaforge.train.stages import run_stages

log = logging.getLogger(__name__)


def run_pipeline(
    config: Config, root: str | Path, progress: bool | None = None, stage: str | None = None
) -> Path:
    """Run every stage that is not done yet; returns the path of the HTML report (a mixture: of its
    members' figure, `run_mixture`). `stage` (`all` or a stage's name, from `dynaforge run CONFIG
    stage=all`): ROOT/run is a staged latent stack (`dynaforge.train.stages`, whose own stages.json skips
    finished stages), evaluated with its stack section (always rerun)."""
    root = Path(root)
    if config.mixture:
        return run_mixture(config, root, progress, stage)
    check_no_empty_split(config)
    check_output_folder(root, ("data", "run"), "a `run` folder (data/, run/)", RunError)
    data, run = root / "data", run_folder(root / "run")
    stored = stored_part(config)
    if dataset_is_complete(data, stored):
        log.info("generate: skipped, %s is complete", data)
    else:
        generate(stored, data, progress=progress)
    if stage is not None:
        run_stages(config, data, run.root, stage, progress=progress)
        return evaluate(run.root, data, config.evaluate).report
    if training_is_complete(run.root, config):
        log.info("train: skipped, %s is complete", run.root)
    else:
        train(config, data, run.root, progress=progress, resume=True)
    if evaluation_is_current(run, config.evaluate):
        log.info("evaluate: skipped, %s is up to date", run.eval)
        return run.eval / "report.html"
    return evaluate(run.root, data, config.evaluate).report


def run_mixture(config: Config, root: Path, progress: bool | None, stage: str | None) -> Path:
    """`dynaforge run` of a mixture: train from the stream into ROOT/run (a mixture has no dataset: its
    val split is generated in memory), then score the run on each member (`evaluate_members`); returns the
    members' figure. A finished run is not retrained; the members' test data is generated once."""
    if stage is not None:
        raise ConfigError(
            f"stage={stage} trains the staged stack on one system's dataset; a mixture trains one surrogate "
            "from the stream: drop stage=..."
        )
    check_no_empty_split(config)  # train: the trajectories streamed per epoch
    check_output_folder(root, ("run",), "a `run` folder of a mixture (run/)", RunError)
    run = run_folder(root / "run")
    if training_is_complete(run.root, config):
        log.info("train: skipped, %s is complete", run.root)
    else:
        train(config, None, run.root, progress=progress, resume=True)
    evaluate_members(run.root, config.evaluate, progress=progress)
    return run.root / MEMBERS_FIGURE


def check_no_empty_split(config: Config) -> None:
    """Refuse, before anything is generated, a config whose train, val or test split is empty: training
    needs the first two and evaluation the third."""
    for name, size in config.dataset.split_sizes().items():
        if size == 0:
            raise RunError(
                f"dataset.n_{name} is 0, but `dynaforge run` trains on train, validates on val and evaluates "
                f"on test; set dataset.n_{name} > 0"
            )


def stored_part(config: Config) -> Config:
    """What ROOT/data holds: the config's dataset, or with `data.source: stream` its val and test splits
    only (plus the one train sample the format asks for: training streams its own)."""
    if config.data.source != "stream":
        return config
    return dataclasses.replace(config, dataset=dataclasses.replace(config.dataset, n_train=1))


def dataset_is_complete(root: Path, config: Config) -> bool:
    """True when `root` holds a complete dataset generated with this config's identity."""
    path = root / MANIFEST
    if not path.exists():
        return False
    try:
        manifest = json.loads(path.read_text())
    except json.JSONDecodeError:
        return False
    return bool(manifest.get("complete")) and not config_differences(
        manifest.get("identity", {}), identity_of(config)
    )


def training_is_complete(root: Path, config: Config) -> bool:
    """True when `root` holds a finished run of this config; an error when it holds a run of another.

    A run with the same config that did not finish is not complete (False): `train(resume=True)` continues it.
    """
    run = run_folder(root)
    if not holds_run(root):
        return False
    if run.config.exists():
        saved = config_to_dict(load_config(run.config))
        wanted = config_to_dict(config)
        check_same_run(saved, wanted, str(root), f"Use another {OUT} folder, or pass the same config.")
        if saved.get("evaluate") != wanted.get("evaluate"):
            save_config(config, run.config)  # the evaluation follows the new evaluate section
    if not run.last.exists():
        return False
    return bool(load_checkpoint(run.last).get("complete"))


MEMBERS = "members"
"""RUN/members/NAME: a mixture member's test trajectories (`evaluate_members`)."""
MEMBERS_SUMMARY = "eval-members.json"
"""RUN/eval-members.json: every member's headline figures and where its evaluation lies."""
MEMBERS_FIGURE = "eval-members.png"
"""RUN/eval-members.png: every member's rollout nRMSE against the step, one-step nRMSE beside."""


def evaluate_members(
    run: str | Path,
    config: EvaluateConfig | None = None,
    checkpoint: str | None = None,
    progress: bool | None = None,
) -> dict[str, EvaluationResult]:
    """Score a run trained on a mixture on the test trajectories of each of its members, by member name.

    Member i's test split is generated into RUN/members/NAME (once; a killed generation resumes) from the
    run's config with `system` set to the member's and `dataset.seed` to the member's base seed: the very
    trajectories the stream draws for that member's test split, never seen in training (which draws the
    train and val splits). Each is evaluated as `dynaforge evaluate RUN --data RUN/members/NAME` would
    (into RUN/eval-NAME); RUN/eval-members.json lists the headline figures and RUN/eval-members.png draws
    every member's rollout error. NAME is the member's system, with its index appended when two members
    share one.
    """
    folder = run_folder(run)
    if not folder.config.is_file():
        raise RunError(f"{folder.root} holds no config.yaml: pass a run folder made by `dynaforge train`")
    trained = load_config(folder.config)
    if not trained.mixture:
        raise RunError(
            f"{folder.root} was trained on one system ({trained.system.name}), not on a mixture: "
            f"`dynaforge evaluate {folder.root}` scores it (--members is for runs trained on a mixture)"
        )
    results: dict[str, EvaluationResult] = {}
    summary = []
    for name, member in member_configs(trained).items():
        data = folder.root / MEMBERS / name
        if dataset_is_complete(data, member):
            log.info("member %s: %s is complete", name, data)
        else:
            log.info(
                "member %s: generating its %d test trajectories into %s", name, member.dataset.n_test, data
            )
            generate(member, data, progress=progress)
        result = evaluate(folder.root, data, config, checkpoint)
        results[name] = result
        metrics = result.metrics
        summary.append(
            {
                "member": name,
                "system": member.system.name,
                "data": str(data),
                "evaluation": str(result.report.parent),
                "test_samples": metrics["test_samples"],
                "one_step_nrmse": metrics["one_step_nrmse"],
                "rollout_nrmse_mean": metrics["rollout_nrmse_mean"],
                "rollout_nrmse_last": metrics["rollout_nrmse"][-1],
                "rollout_frames": metrics["rollout_frames"],
                "rollout_nrmse": metrics["rollout_nrmse"],
            }
        )
    atomic_write_json(folder.root / MEMBERS_SUMMARY, summary)
    frame_dt = shared_frame_dt([result.metrics["frame_dt"] for result in results.values()])
    atomic_write_bytes(folder.root / MEMBERS_FIGURE, figure_to_png(members_figure(summary, frame_dt)))
    return results


def shared_frame_dt(frame_dts: list[float | None]) -> float | None:
    """The time between two model frames when every member has the same, else None (the figure then has no
    time axis): members share the number of frames, not their time (Burgers' frames 0.05 apart, KS's 1.0
    in the universal preset)."""
    return frame_dts[0] if len(set(frame_dts)) == 1 else None


def member_configs(config: Config) -> dict[str, Config]:
    """Each mixture member's dataset config, by name: the run's config with the member's `system`, its base
    seed, its test split at `dataset.n_test` and one train sample (the format asks for one), no val split."""
    names = [member.system.name for member in config.mixture]
    configs = {}
    for i, member in enumerate(config.mixture):
        name = names[i] if names.count(names[i]) == 1 else f"{names[i]}-{i}"
        dataset = dataclasses.replace(
            config.dataset, seed=member_seed(config.dataset.seed, i), n_train=1, n_val=0
        )
        configs[name] = dataclasses.replace(config, mixture=[], system=member.system, dataset=dataset)
    return configs
