"""The `dynaforge` command: one verb per pipeline stage. Argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

from dynaforge.config import ConfigError, load_config

log = logging.getLogger("dynaforge")


def choose_threads(resumed: Path | None = None) -> tuple[int | None, str]:
    """The torch thread count for this command (None: keep torch's own) and why.

    - OMP_NUM_THREADS is set: the user's choice; torch reads it itself.
    - torch is already loaded (`main` called from a Python program): that program's setting is kept.
    - a run is being resumed and recorded the count it started with: that count, so that training continues
      bit for bit as an uninterrupted run would.
    - otherwise the cores other processes leave free: cores - round(1-minute load average), at least 1.
      torch's OpenMP threads spin while they wait for each other; when another process holds one of them,
      a spinning thread keeps losing its core and every parallel region stalls. On this project's 2-core
      machine the quickstart took 54 s alone with 2 threads, but over 19 minutes beside one busy process;
      with 1 thread it took 60 s there (README, quickstart).
    Generation and evaluation give the same bytes whatever the count (`dynaforge.threads`); training
    depends on it, which its run log and checkpoints record.
    """
    if "OMP_NUM_THREADS" in os.environ:
        return None, f"OMP_NUM_THREADS={os.environ['OMP_NUM_THREADS']}"
    if "torch" in sys.modules:
        return None, "the calling program's torch setting"
    if resumed is not None:
        started = started_with_threads(resumed)
        if started is not None:
            return started, f"the count {resumed} started with"
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = max(1, cores - round(os.getloadavg()[0]))
    if free < cores:
        return free, f"{cores - free} of {cores} cores busy with other processes"
    return cores, f"all {cores} cores"


def started_with_threads(run: Path) -> int | None:
    """The torch thread count recorded at the top of a run's log (None when there is none)."""
    log_path = Path(run) / "metrics.jsonl"
    try:
        with open(log_path) as handle:
            header = json.loads(handle.readline())
    except (OSError, json.JSONDecodeError):
        return None
    threads = header.get("torch_threads") if header.get("kind") == "header" else None
    return int(threads) if isinstance(threads, int) and threads > 0 else None


def resumed_run(args: argparse.Namespace) -> Path | None:
    """The training run this command continues, if any: `train --resume`'s --out, `run`'s ROOT/run."""
    if args.verb == "train" and getattr(args, "resume", False):
        return Path(args.out)
    if args.verb == "run":
        return Path(args.out) / "run"
    return None


@contextlib.contextmanager
def command_threads(args: argparse.Namespace) -> Iterator[None]:
    """`choose_threads` for the command, the previous count restored after it (main() may be called in a
    process that goes on); nothing for `rollout`, which runs without PyTorch."""
    if args.verb == "rollout":
        yield
        return
    threads, reason = choose_threads(resumed_run(args))
    log.debug("torch threads: %s (%s)", threads if threads is not None else "torch's own", reason)
    with torch_threads(threads):
        yield


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Under torchrun only rank 0 reports progress; the other ranks speak up for warnings and errors.
    worker = int(os.environ.get("RANK", "0")) > 0
    logging.basicConfig(
        level=logging.WARNING if args.quiet or worker else logging.INFO, format="%(levelname)s %(message)s"
    )
    from dynaforge.errors import RunError

    expected: tuple[type[Exception], ...] = (ConfigError, RunError, FileNotFoundError)
    if args.verb != "rollout":  # `rollout` runs without PyTorch, which dynaforge.store imports
        from dynaforge.store import DatasetError

        expected += (DatasetError,)
    try:
        with command_threads(args):
            return int(args.handler(args) or 0)
    except expected as error:
        # Expected failures (a bad config, a bad dataset) get one clear line, not a traceback.
        print(f"error: {error}", file=sys.stderr)
        return 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynaforge", description=__doc__.split(":")[0])
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    verbs = parser.add_subparsers(dest="verb", required=True)

    generate = verbs.add_parser("generate", help="generate a dataset folder from a config")
    add_config_arguments(generate)
    generate.add_argument("--out", required=True, help="dataset folder (created, or resumed if it exists)")
    generate.add_argument(
        "--shard-index", type=int, default=None, help="this worker's index (default: RANK or SLURM)"
    )
    generate.add_argument("--num-shards", type=int, default=None, help="number of workers sharing the job")
    generate.add_argument("--no-progress", action="store_true", help="no progress bar")
    generate.set_defaults(handler=run_generate)

    inspect = verbs.add_parser("inspect", help="validate a dataset folder and summarise it")
    inspect.add_argument("path", help="dataset folder")
    inspect.add_argument("--json", action="store_true", help="print the summary as JSON")
    inspect.add_argument("--no-checksums", action="store_true", help="skip SHA-256 verification (faster)")
    inspect.set_defaults(handler=run_inspect)

    verify = verbs.add_parser(
        "verify",
        help="regenerate samples from a dataset's config and seeds and compare them with the stored ones",
    )
    verify.add_argument("path", help="dataset folder made by `dynaforge generate`")
    verify.add_argument(
        "--samples",
        default=None,
        help="samples per split, chosen at random (default 3), or 'all'",
    )
    verify.add_argument(
        "--tolerance",
        type=float,
        default=None,
        help="accept a regenerated sample whose largest difference, relative to the sample's largest "
        "value, is at most this (another CPU family or a GPU may differ in the last bits); default: "
        "identical bytes only",
    )
    verify.add_argument("--seed", type=int, default=None, help="seed of the random choice of samples")
    verify.add_argument("--json", action="store_true", help="print the result as JSON")
    verify.set_defaults(handler=run_verify)

    convert = verbs.add_parser(
        "convert", help="convert a PDEBench or The Well HDF5 file into a dataset folder"
    )
    convert.add_argument("input", help="PDEBench or The Well .hdf5/.h5 file")
    convert.add_argument("--out", required=True, help="dataset folder to create")
    convert.add_argument(
        "--format", choices=["pdebench", "the_well"], default=None, help="source format (default: detected)"
    )
    convert.add_argument(
        "--splits",
        default="0.8,0.1,0.1",
        metavar="TRAIN,VAL,TEST",
        help="fractions of the file's samples per split, contiguous in file order (default 0.8,0.1,0.1)",
    )
    convert.add_argument("--shard-size", type=int, default=256, help="samples per shard (default 256)")
    convert.set_defaults(handler=run_convert)

    train = verbs.add_parser("train", help="train a surrogate on a dataset folder into a run folder")
    add_config_arguments(train)
    train.add_argument(
        "--data",
        required=True,
        help="dataset folder (from `dynaforge generate` or `convert`), or a PDEBench / The Well file",
    )
    train.add_argument("--out", required=True, help="run folder to create (or to continue, with --resume)")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from its last checkpoint (start it if it has none)",
    )
    train.add_argument(
        "--resume-from-artifact",
        default=None,
        metavar="REF",
        help="continue from a W&B checkpoint artifact (entity/project/checkpoint-ID:alias) into a new --out",
    )
    train.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="profile N optimiser steps into RUN/profile/ (Chrome trace, top operators)",
    )
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=run_train)

    evaluate = verbs.add_parser("evaluate", help="score a run on the test split; writes RUN/eval/")
    evaluate.add_argument("run", help="run folder (from `dynaforge train`)")
    evaluate.add_argument(
        "--data",
        default=None,
        help="dataset folder or PDEBench / The Well file (default: the one trained on)",
    )
    evaluate.set_defaults(handler=run_evaluate)

    run = verbs.add_parser("run", help="generate, train and evaluate from one config (skips finished stages)")
    add_config_arguments(run)
    run.add_argument("--out", required=True, help="root folder: ROOT/data, ROOT/run")
    run.add_argument("--no-progress", action="store_true", help="no progress bars")
    run.set_defaults(handler=run_run)
    add_nbody_parser(verbs)
    add_tune_export_parsers(verbs)
    add_twophase_parser(verbs)
    return parser


def add_nbody_parser(verbs: argparse._SubParsersAction) -> None:
    nbody = verbs.add_parser("nbody", help="N-body simulation and the learned step controller")
    actions = nbody.add_subparsers(dest="action", required=True)
    simulate = actions.add_parser(
        "simulate", help="run N-body systems; write invariants.json, plots and an animation"
    )
    add_config_arguments(simulate)
    simulate.add_argument("--out", required=True, help="output folder")
    simulate.add_argument(
        "--controller",
        choices=("fixed", "adaptive", "learned"),
        default=None,
        help="step control (default: system.control.kind from the config)",
    )
    simulate.add_argument("--model", default=None, help="run folder of a trained controller (for learned)")
    simulate.add_argument("--systems", type=int, default=1, help="systems drawn and stepped together")
    simulate.add_argument(
        "--animation",
        choices=("auto", "gif", "mp4", "none"),
        default="auto",
        help="auto: MP4 when ffmpeg is on PATH, else GIF",
    )
    simulate.add_argument("--frames", type=int, default=120, help="animation frames")
    simulate.add_argument("--threads", type=int, default=None, help="torch threads (1 suits small systems)")
    simulate.set_defaults(handler=run_nbody_simulate)
    train = actions.add_parser("train", help="train the learned step controller into a run folder")
    add_config_arguments(train)
    train.add_argument("--out", required=True, help="run folder (config.yaml, metrics.jsonl, checkpoints/)")
    train.add_argument(
        "--resume", action="store_true", help="continue the run in --out from checkpoints/last.pt"
    )
    train.add_argument("--threads", type=int, default=None, help="torch threads (1 suits small systems)")
    train.add_argument("--no-progress", action="store_true", help="no progress bar")
    train.set_defaults(handler=run_nbody_train)


def add_tune_export_parsers(verbs: argparse._SubParsersAction) -> None:
    tune = verbs.add_parser("tune", help="an Optuna study over a training config (tune.space in the YAML)")
    add_config_arguments(tune)
    tune.add_argument(
        "--trials", type=int, required=True, help="finished trials the study should hold (resumes to N)"
    )
    tune.add_argument(
        "--study", default=None, help="study name (default: tune.study, else the config's name)"
    )
    tune.add_argument(
        "--storage", default=None, help="Optuna storage URL (default: tune.storage, else STUDY/study.db)"
    )
    tune.add_argument("--out", default=None, help="study folder (default: studies/NAME)")
    tune.add_argument(
        "--data", default=None, help="dataset folder for PDE trials (default: generated into STUDY/data)"
    )
    tune.add_argument("--threads", type=int, default=None, help="torch threads per trial")
    tune.set_defaults(handler=run_tune)

    export = verbs.add_parser("export", help="export a run's model to ONNX and verify it in onnxruntime")
    export.add_argument("run", help="run folder (from `dynaforge train`, `nbody train` or STUDY/best)")
    export.add_argument("--out", required=True, help="the .onnx file to write")
    export.add_argument("--checkpoint", choices=("best", "last"), default="best", help="which checkpoint")
    export.add_argument(
        "--data", default=None, help="dataset for the real-input check (default: the one trained on)"
    )
    export.set_defaults(handler=run_export)

    rollout = verbs.add_parser(
        "rollout", help="autoregressive rollout of an exported model with onnxruntime alone (no PyTorch)"
    )
    rollout.add_argument("--onnx", required=True, help="model exported by `dynaforge export`")
    rollout.add_argument("--data", required=True, help="dataset folder whose trajectories to roll out")
    rollout.add_argument("--split", default="test", choices=("train", "val", "test"), help="default test")
    rollout.add_argument("--frames", type=int, default=None, help="frames to predict (default: all stored)")
    rollout.add_argument("--samples", type=int, default=None, help="trajectories (default: all of the split)")
    rollout.set_defaults(handler=run_rollout)


def add_twophase_parser(verbs: argparse._SubParsersAction) -> None:
    twophase = verbs.add_parser(
        "twophase", help="two-phase (equilibrium propagation) training of energy-based models"
    )
    actions = twophase.add_subparsers(dest="action", required=True)
    train = actions.add_parser("train", help="train the `twophase` section's model into a run folder")
    add_config_arguments(train)
    train.add_argument("--out", required=True, help="run folder (config.yaml, metrics.jsonl, checkpoints/)")
    train.add_argument(
        "--resume",
        action="store_true",
        help="continue the run in --out from checkpoints/last.pt (start it if it has none)",
    )
    train.add_argument("--threads", type=int, default=None, help="torch threads (1 suits small networks)")
    train.set_defaults(handler=run_twophase_train)


def run_twophase_train(args: argparse.Namespace) -> int:
    from dynaforge.train.two_phase import train_two_phase

    config = load_config(args.config, args.overrides)
    with torch_threads(args.threads):
        summary = train_two_phase(config, args.out, resume=args.resume)
    print(
        f"{summary.run}: {summary.epochs} epochs, {summary.steps} windows, "
        f"best validation loss {summary.best_val_loss:.4e}"
    )
    return 0


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", help="YAML preset (see configs/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. system.dt=0.005 (train, run: stage=all trains the staged latent stack)",
    )


def run_generate(args: argparse.Namespace) -> int:
    from dynaforge.generate import generate

    config = load_config(args.config, args.overrides)
    manifest = generate(
        config,
        args.out,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        progress=False if args.no_progress else None,
    )
    done = sum(1 for s in manifest["shards"] if s["complete"])
    state = "complete" if manifest["complete"] else "partial (other workers' shards pending)"
    print(f"{args.out}: {done}/{len(manifest['shards'])} shards, {state}")
    return 0


def nbody_overrides(args: argparse.Namespace) -> list[str]:
    overrides = list(args.overrides)
    if getattr(args, "controller", None):
        overrides.append(f"system.control.kind={args.controller}")
    if getattr(args, "model", None):
        overrides.append(f"system.control.model={args.model}")
    return overrides


@contextlib.contextmanager
def torch_threads(threads: int | None) -> Iterator[None]:
    """Run with `threads` torch threads (None: unchanged), restoring the previous count afterwards."""
    if threads is None:
        yield
        return
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def run_nbody_simulate(args: argparse.Namespace) -> int:
    from dynaforge.evaluate.nbody_report import simulate

    config = load_config(args.config, nbody_overrides(args))
    with torch_threads(args.threads):
        summary = simulate(config, args.out, args.systems, args.animation, args.frames)
    for i, system in enumerate(summary["systems"]):
        drift = system["max_relative_drift"]
        print(
            f"system {i}: t={system['t_end']:.6g} steps={system['steps']} force evaluations={system['force_evaluations']} "
            f"max |dE/E|={drift['energy']:.3g} |dP|={drift['momentum']:.3g} |dL|={drift['angular_momentum']:.3g}"
        )
    print(f"wrote {args.out}/invariants.json, plots and {summary.get('animation', 'no animation')}")
    return 0


def run_nbody_train(args: argparse.Namespace) -> int:
    from dynaforge.train.step_controller import train_controller

    config = load_config(args.config, args.overrides)
    with torch_threads(args.threads):
        summary = train_controller(
            config, args.out, resume=args.resume, progress=False if args.no_progress else None
        )
    print(f"{summary.run}: {summary.steps} steps, best validation loss {summary.best_val_loss:.4g}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    from dynaforge.store import validate_dataset

    result = validate_dataset(args.path, checksums=not args.no_checksums)
    if args.json:
        print(
            json.dumps(
                {"ok": result.ok, "errors": result.errors, "warnings": result.warnings, **result.summary},
                indent=2,
            )
        )
    else:
        print(format_summary(result.summary))
        for warning in result.warnings:
            print(f"warning: {warning}")
        for error in result.errors:
            print(f"error: {error}", file=sys.stderr)
        print("valid" if result.ok else f"INVALID: {len(result.errors)} problem(s)")
    return 0 if result.ok else 1


def run_verify(args: argparse.Namespace) -> int:
    from dynaforge.generate.verify import dumps, verify_dataset
    from dynaforge.machine import machine_summary
    from dynaforge.store import DatasetFolder

    samples = parse_sample_count(args.samples)
    DatasetFolder(args.path)  # a clear error for a missing or incomplete folder before any output
    show = None if args.json else (lambda check: print(f"  {check.describe()}", flush=True))
    if not args.json:
        amount = "every sample" if samples is None else f"{samples} random sample(s) per split"
        print(f"verify {args.path}: regenerating {amount} from its config and seeds")
    result = verify_dataset(args.path, samples, args.tolerance, args.seed, on_sample=show)
    if args.json:
        print(dumps(result))
        return 0 if result.ok else 1
    made = "; ".join(machine_summary(m) for m in result.made_on) or "not recorded (an older dataset)"
    print(f"made on: {made}")
    print(f"checked on: {machine_summary(result.checked_on)}")
    failed = [check for check in result.checks if not check.passed]
    if not failed:
        exact = all(check.identical for check in result.checks)
        print(
            f"OK: {len(result.checks)} sample(s) regenerated, "
            f"{'all identical' if exact else f'identical or within tolerance {args.tolerance:g}'}"
        )
        return 0
    names = ", ".join(f"{c.split}/{c.index}" for c in failed[:10]) + (" ..." if len(failed) > 10 else "")
    regenerated_differently = any(c.stored_matches_record is not False for c in failed)
    hint = (
        "; if the dataset was made on another CPU family or a GPU (see 'made on'), pass --tolerance (e.g. 1e-5)"
        if regenerated_differently and args.tolerance is None
        else ""
    )
    print(f"FAILED: {len(failed)} of {len(result.checks)} sample(s) do not match: {names}{hint}")
    return 1


def parse_sample_count(text: str | None) -> int | None:
    """--samples: a positive count per split, or 'all' (None)."""
    from dynaforge.generate.verify import DEFAULT_SAMPLES

    if text is None:
        return DEFAULT_SAMPLES
    if text == "all":
        return None
    if not text.isdigit() or int(text) < 1:
        raise ConfigError(f"--samples must be a positive number or 'all', got {text!r}")
    return int(text)


def run_convert(args: argparse.Namespace) -> int:
    from dynaforge.store.convert import convert
    from dynaforge.store.interop import parse_fractions

    manifest = convert(
        args.input,
        args.out,
        format=args.format,
        fractions=parse_fractions(args.splits),
        shard_size=args.shard_size,
    )
    source, shape = manifest["source"], manifest["shape"]
    splits = "   ".join(f"{k}={v['n_samples']}" for k, v in manifest["splits"].items())
    print(f"{args.out}: {source['format']} ({source['layout']}) {source['name']}, {splits}")
    print(f"shape     frames={shape['frames']} space={shape['space']} channels={source['channel_names']}")
    print(f"check it with `dynaforge inspect {args.out}`")
    return 0


def run_train(args: argparse.Namespace) -> int:
    from dynaforge.train import train

    if args.profile < 0:
        raise ConfigError(f"--profile takes a number of steps >= 0, got {args.profile}")
    stage = [item for item in args.overrides if item.startswith("stage=")]
    if stage:
        return run_train_stages(args, stage[-1].split("=", 1)[1])
    config = load_config(args.config, args.overrides)
    if args.resume_from_artifact:
        from dynaforge.train.log import start_from_artifact

        start_from_artifact(args.resume_from_artifact, args.out, config)
    summary = train(
        config,
        args.data,
        args.out,
        progress=False if args.no_progress else None,
        resume=args.resume or bool(args.resume_from_artifact),
        profile_steps=args.profile,
    )
    if int(os.environ.get("RANK", "0")) > 0:
        return 0
    print(f"{summary.run}: {summary.epochs} epochs, best validation loss {summary.best_val_loss:.4e}")
    if args.profile:
        print(f"profile: {summary.run / 'profile'}")
    return 0


def run_train_stages(args: argparse.Namespace, stage: str) -> int:
    """`dynaforge train CONFIG stage=all|NAME`: the staged latent stack (dynaforge.train.stages)."""
    from dynaforge.train.stages import run_stages

    overrides = [item for item in args.overrides if not item.startswith("stage=")]
    config = load_config(args.config, overrides)
    status = run_stages(config, args.data, args.out, stage, progress=False if args.no_progress else None)
    for name, record in status["stages"].items():
        print(
            f"{args.out}/{name}: {record['status']}, best validation metric {record.get('best_val', float('nan')):.4e}"
        )
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from dynaforge.evaluate import evaluate

    result = evaluate(args.run, args.data)
    print_evaluation(result.metrics)
    print(f"report: {result.report}")
    return 0


def run_run(args: argparse.Namespace) -> int:
    from dynaforge.pipeline import run_pipeline

    stage = [item.split("=", 1)[1] for item in args.overrides if item.startswith("stage=")]
    overrides = [item for item in args.overrides if not item.startswith("stage=")]
    config = load_config(args.config, overrides)
    progress = False if args.no_progress else None
    report = run_pipeline(config, args.out, progress=progress, stage=stage[-1] if stage else None)
    print_evaluation(json.loads((report.parent / "metrics.json").read_text()))
    print(f"report: {report}")
    return 0


def run_tune(args: argparse.Namespace) -> int:
    from pathlib import Path

    try:
        from dynaforge.tune import run_study
    except ImportError as error:
        raise ConfigError(f"dynaforge tune needs Optuna: pip install 'dynaforge[tune]' ({error})") from error
    if args.quiet:
        import optuna

        optuna.logging.set_verbosity(optuna.logging.WARNING)  # Optuna logs each trial through its own handler
    config = load_config(args.config, args.overrides)
    name = args.study or config.tune.study or Path(args.config).stem
    out = args.out or str(Path("studies") / name)
    with torch_threads(args.threads):
        result = run_study(config, args.trials, out, name, storage=args.storage, data=args.data)
    summary = result.summary
    states = ", ".join(f"{n} {k}" for k, n in summary["states"].items())
    print(f"study {name}: {summary['trials']} trial{'' if summary['trials'] == 1 else 's'} ({states})")
    for best in summary["best"]:
        params = ", ".join(f"{k}={v}" for k, v in best["params"].items())
        print(f"best trial {best['number']}: {best['values']} with {params}")
    print(f"summary: {result.folder / 'summary.md'}; best run: {summary['best_run']}")
    return 0


def run_export(args: argparse.Namespace) -> int:
    try:
        from dynaforge.export.onnx_export import export_run
    except ImportError as error:
        raise ConfigError(
            f"dynaforge export needs onnx, onnxruntime and onnxscript: pip install 'dynaforge[export]' ({error})"
        ) from error
    result = export_run(args.run, args.out, checkpoint=args.checkpoint, data=args.data)
    for check in result.checks:
        print(
            f"{check.name:<7} max |onnxruntime - torch| {check.max_abs:.3e}  relative {check.relative:.3e}  "
            f"(tolerance {check.tolerance:.1e}) ok"
        )
    print(f"wrote {result.path} (opset {result.opset}, inputs {result.inputs}, outputs {result.outputs})")
    return 0


def run_rollout(args: argparse.Namespace) -> int:
    from dynaforge.export.onnx_rollout import rollout_onnx

    result = rollout_onnx(args.onnx, args.data, split=args.split, frames=args.frames, samples=args.samples)
    print(f"{result.samples} trajectories of {args.split}, {len(result.nrmse)} predicted frames")
    for step in sorted({1, len(result.nrmse) // 2 or 1, len(result.nrmse)}):
        print(f"rollout nRMSE, step {step:<3d} {result.nrmse[step - 1]:.4e}")
    return 0


def print_evaluation(metrics: dict) -> None:
    rollout = metrics["rollout_nrmse"]
    print(f"test one-step nRMSE        {metrics['one_step_nrmse']:.4e}")
    print(f"test rollout nRMSE, step {len(rollout):<3d} {rollout[-1]:.4e}")


def format_summary(summary: dict) -> str:
    if not summary:
        return ""
    lines = [
        f"dataset   {summary['root']}",
        f"system    {summary['system']}   format v{summary['format_version']}   {summary['bytes'] / 2**20:.1f} MiB",
        "samples   " + "   ".join(f"{k}={v}" for k, v in summary["splits"].items()),
        f"shape     frames={summary['frames']} space={summary['space']} channels={summary['channels']}",
    ]
    if "source" in summary:
        source = summary["source"]
        lines.append(
            f"source    {source['format']} ({source['layout']}) {source['file']}, splits {source['fractions']}"
        )
    for name, bounds in summary["parameters"].items():
        lines.append(f"param     {name:<14} [{bounds['min']:.6g}, {bounds['max']:.6g}]")
    stats = summary.get("stats")
    if stats:
        lines.append(
            f"train     mean={_fmt(stats['mean'])} std={_fmt(stats['std'])} min={_fmt(stats['min'])} max={_fmt(stats['max'])}"
        )
    return "\n".join(lines)


def _fmt(values: list[float]) -> str:
    return "[" + ", ".join(f"{v:.4g}" for v in values) + "]"


if __name__ == "__main__":
    sys.exit(main())
