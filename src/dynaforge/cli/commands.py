"""What each `dynaforge` verb does: the handlers `main` dispatches to. Each imports what its verb needs
inside it, so a command loads only its own part of the package (`rollout` runs without PyTorch)."""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from dynaforge.cli.threads import torch_threads
from dynaforge.config import ConfigError, EvaluateConfig, load_config


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


def progress_of(args: argparse.Namespace) -> bool | None:
    """--no-progress: no bars (False); without it None, bars when stderr is a terminal."""
    return False if args.no_progress else None


def run_generate(args: argparse.Namespace) -> int:
    from dynaforge.generate import generate

    config = load_config(args.config, args.overrides)
    manifest = generate(
        config,
        args.out,
        shard_index=args.shard_index,
        num_shards=args.num_shards,
        progress=progress_of(args),
        processes=args.processes,
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


def run_nbody_simulate(args: argparse.Namespace) -> int:
    from dynaforge.evaluate.nbody_report import simulate

    config = load_config(args.config, nbody_overrides(args))
    with torch_threads(args.threads):
        summary = simulate(
            config,
            args.out,
            args.systems,
            args.animation,
            args.frames,
            progress=progress_of(args),
        )
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
        summary = train_controller(config, args.out, resume=args.resume, progress=progress_of(args))
    print(f"{summary.run}: {summary.steps} steps, best validation loss {summary.best_val_loss:.4g}")
    return 0


def run_inspect(args: argparse.Namespace) -> int:
    """0 for a valid dataset; a folder that is not one (missing, interrupted, corrupt) is an expected
    failure: the problems, then one `error:` line, status 2 (docs/exit-codes.md)."""
    from dynaforge.store import DatasetError, validate_dataset

    say_system_code(args.path, json_output=args.json)
    result = validate_dataset(args.path, checksums=not args.no_checksums)
    if args.json:
        print(
            json.dumps(
                {"ok": result.ok, "errors": result.errors, "warnings": result.warnings, **result.summary},
                indent=2,
            )
        )
    else:
        if result.summary:
            print(format_summary(result.summary))
        for warning in result.warnings:
            print(f"warning: {warning}")
    if result.ok:
        if not args.json:
            print("valid")
        return 0
    if not result.summary:  # not a dataset at all: the reader's one message names the path and the fix
        raise DatasetError(result.errors[0])
    if len(result.errors) > 1 and not args.json:
        for problem in result.errors:
            print(f"problem: {problem}", file=sys.stderr)
    more = f" (and {len(result.errors) - 1} more problem(s), listed above)" if len(result.errors) > 1 else ""
    raise DatasetError(f"{args.path} is not a valid dataset: {result.errors[0]}{more}")


def run_verify(args: argparse.Namespace) -> int:
    """0 when every sample checked regenerates identically (or within --tolerance); a folder that cannot
    be checked, or a sample that does not match, is an expected failure: one `error:` line, status 2."""
    from dynaforge.generate.verify import dumps, verify_dataset
    from dynaforge.machine import machine_summary
    from dynaforge.store import DatasetError, DatasetFolder

    samples = parse_sample_count(args.samples)
    say_system_code(args.path, json_output=args.json)
    DatasetFolder(args.path)  # a clear error for a missing or incomplete folder before any output
    show = None if args.json else (lambda check: print(f"  {check.describe()}", flush=True))
    if not args.json:
        amount = "every sample" if samples is None else f"{samples} random sample(s) per split"
        print(f"verify {args.path}: regenerating {amount} from its config and seeds")
    result = verify_dataset(args.path, samples, args.tolerance, args.seed, on_sample=show)
    failed = [check for check in result.checks if not check.passed]
    if args.json:
        print(dumps(result))
    else:
        made = "; ".join(machine_summary(m) for m in result.made_on) or "not recorded (an older dataset)"
        print(f"made on: {made}")
        print(f"checked on: {machine_summary(result.checked_on)}")
    if not failed:
        if not args.json:
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
    raise DatasetError(
        f"{args.path} FAILED verification: {len(failed)} of {len(result.checks)} sample(s) do not match: "
        f"{names}{hint}"
    )


def say_system_code(path: str, json_output: bool) -> None:
    """Say which code a dataset's config names (a user's system, by import path) before anything loads the
    config, which imports that code (docs/user-systems.md); on stderr under --json, which keeps stdout JSON."""
    import yaml

    from dynaforge.store.format import CONFIG
    from dynaforge.systems.registry import system_code

    try:
        saved = yaml.safe_load((Path(path) / CONFIG).read_text())
    except (OSError, yaml.YAMLError):
        return  # no readable config: the checks that follow report it
    section = saved.get("system") if isinstance(saved, dict) else None
    name = section.get("name") if isinstance(section, dict) else None
    line = system_code(name) if isinstance(name, str) else None
    if line:
        print(line, file=sys.stderr if json_output else sys.stdout, flush=True)


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
    from dynaforge.store.convert import convert, export
    from dynaforge.store.interop import parse_fractions

    if args.to is not None:
        written, how = export(args.input, args.out, args.to, progress=progress_of(args))
        print(f"{args.out}: {', '.join(written)}")
        print(how)
        return 0

    manifest = convert(
        args.input,
        args.out,
        format=args.format,
        fractions=parse_fractions(args.splits),
        shard_size=args.shard_size,
        progress=progress_of(args),
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
    stage, overrides = stage_override(args.overrides)
    if stage is not None:
        if args.init_from is not None:
            raise ConfigError("--from fine-tunes a surrogate; the staged stack (stage=...) trains without it")
        return run_train_stages(args, stage, overrides)
    config = load_config(args.config, overrides)
    if args.resume_from_artifact:
        from dynaforge.train.log import start_from_artifact

        start_from_artifact(args.resume_from_artifact, args.out, config)
    summary = train(
        config,
        args.data,
        args.out,
        progress=progress_of(args),
        resume=args.resume or bool(args.resume_from_artifact),
        profile_steps=args.profile,
        init_from=args.init_from,
    )
    if int(os.environ.get("RANK", "0")) > 0:
        return 0
    print(f"{summary.run}: {summary.epochs} epochs, best validation loss {summary.best_val_loss:.4e}")
    if args.profile:
        print(f"profile: {summary.run / 'profile'}")
    return 0


def stage_override(overrides: list[str]) -> tuple[str | None, list[str]]:
    """The `stage=all|NAME` override of `train` and `run` (the last one given; None: no stage) and the others."""
    stages = [item.split("=", 1)[1] for item in overrides if item.startswith("stage=")]
    others = [item for item in overrides if not item.startswith("stage=")]
    return (stages[-1] if stages else None), others


def run_train_stages(args: argparse.Namespace, stage: str, overrides: list[str]) -> int:
    """`dynaforge train CONFIG stage=all|NAME`: the staged latent stack (dynaforge.train.stages)."""
    from dynaforge.train.refiner import REFINER_STAGES
    from dynaforge.train.stages import STAGES, run_stages

    config = load_config(args.config, overrides)
    if args.data is None:
        raise ConfigError("the staged stack trains on a dataset folder: pass --data DIR")
    if stage != "all" and stage not in STAGES and stage not in REFINER_STAGES:
        names = ", ".join([*STAGES, *REFINER_STAGES])
        raise ConfigError(f"stage={stage!r} is not valid; choose all or one of: {names}")
    table = REFINER_STAGES if stage in REFINER_STAGES else None  # named only, never part of stage=all
    status = run_stages(config, args.data, args.out, stage, progress=progress_of(args), stages=table)
    for name, record in status["stages"].items():
        print(
            f"{args.out}/{name}: {record['status']}, best validation metric {record.get('best_val', float('nan')):.4e}"
        )
    return 0


def run_evaluate(args: argparse.Namespace) -> int:
    from dynaforge.evaluate import evaluate

    config = evaluate_settings(args.run, args.overrides) if args.overrides else None
    if args.members:
        return run_evaluate_members(args, config)
    result = evaluate(args.run, args.data, config=config, checkpoint=args.checkpoint)
    print_evaluation(result.metrics)
    print(f"report: {result.report}")
    return 0


def run_evaluate_members(args: argparse.Namespace, config: EvaluateConfig | None) -> int:
    from dynaforge.pipeline import MEMBERS_FIGURE, MEMBERS_SUMMARY, evaluate_members

    if args.data is not None:
        raise ConfigError(
            "--members scores each member of the run's mixture on its own generated test trajectories; "
            "--data names one dataset: pass one or the other"
        )
    evaluate_members(args.run, config, args.checkpoint)  # generation bars on a terminal only
    print_members(Path(args.run) / MEMBERS_SUMMARY, Path(args.run) / MEMBERS_FIGURE)
    return 0


def print_members(summary: Path, figure: Path) -> None:
    """The table of a mixture run's members (`evaluate --members`, `run` of a mixture) from its summary."""
    rows = json.loads(summary.read_text())
    width = max(len("member"), *(len(row["member"]) for row in rows))
    print(f"{'member':<{width}}  one-step nRMSE  rollout nRMSE (mean, last frame)  report")
    for row in rows:
        print(
            f"{row['member']:<{width}}  {row['one_step_nrmse']:.4e}      {row['rollout_nrmse_mean']:.4e}, "
            f"{row['rollout_nrmse_last']:.4e} (step {row['rollout_frames']})  "
            f"{Path(row['evaluation']) / 'report.html'}"
        )
    print(f"summary: {summary}, figure: {figure}")


def evaluate_settings(run: str, overrides: list[str]) -> EvaluateConfig:
    """The run's evaluate section (RUN/config.yaml, or the defaults) with `evaluate.KEY=VALUE` overrides."""
    for item in overrides:
        if not item.startswith("evaluate."):
            raise ConfigError(
                f"{item}: `dynaforge evaluate` takes overrides of the evaluate section only "
                "(evaluate.KEY=VALUE, e.g. evaluate.checkpoint=last); the rest of the config is the trained run's"
            )
    saved = Path(run) / "config.yaml"
    return load_config(saved if saved.is_file() else None, overrides).evaluate


def run_run(args: argparse.Namespace) -> int:
    from dynaforge.pipeline import MEMBERS_SUMMARY, run_pipeline

    stage, overrides = stage_override(args.overrides)
    config = load_config(args.config, overrides)
    report = run_pipeline(config, args.out, progress=progress_of(args), stage=stage)
    if config.mixture:  # scored on every member: the members' figure, beside their summary
        print_members(report.with_name(MEMBERS_SUMMARY), report)
        return 0
    print_evaluation(json.loads((report.parent / "metrics.json").read_text()))
    print(f"report: {report}")
    return 0


def run_tune(args: argparse.Namespace) -> int:
    try:
        from dynaforge.tune import run_study
    except ImportError as error:
        raise ConfigError(f"dynaforge tune needs Optuna: pip install 'dynaforge[tune]' ({error})") from error
    import optuna

    # Optuna's lines go through the handler `main` set up, in its format, instead of Optuna's own.
    optuna.logging.disable_default_handler()
    optuna.logging.enable_propagation()
    optuna.logging.set_verbosity(optuna.logging.WARNING if args.quiet else optuna.logging.INFO)
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
    result = export_run(args.run, args.out, checkpoint=args.checkpoint, data=args.data, force=args.force)
    for check in result.checks:
        print(check.describe())
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
