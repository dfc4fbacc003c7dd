"""The `dynaforge` command: one verb per pipeline stage. Argument parsing only; the work is elsewhere."""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence

from dynaforge import __version__
from dynaforge.cli.commands import (
    run_convert,
    run_evaluate,
    run_export,
    run_generate,
    run_inspect,
    run_nbody_simulate,
    run_nbody_train,
    run_rollout,
    run_run,
    run_train,
    run_tune,
    run_twophase_train,
    run_verify,
)
from dynaforge.cli.threads import choose_threads, command_threads, resumed_run
from dynaforge.errors import DynaforgeError, message_for

__all__ = ["build_parser", "choose_threads", "main", "resumed_run"]


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    # Under torchrun only rank 0 reports progress; the other ranks speak up for warnings and errors.
    worker = int(os.environ.get("RANK", "0")) > 0
    logging.basicConfig(
        level=logging.WARNING if args.quiet or worker else logging.INFO, format="%(levelname)s %(message)s"
    )
    # matplotlib's INFO lines ("Animation.save using PillowWriter") say nothing a user acts on.
    logging.getLogger("matplotlib").setLevel(logging.WARNING)
    try:
        with command_threads(args):
            return int(args.handler(args) or 0)
    except (DynaforgeError, FileNotFoundError) as error:
        # Expected failures (a bad config, a bad dataset) get one clear line, not a traceback; the options
        # it names are this face's flags.
        print(f"error: {message_for(error, 'cli')}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        # The reader of stdout stopped early (`dynaforge inspect DIR --json | head`): nothing is wrong and
        # nothing is left to say. stdout goes to /dev/null so that the interpreter's last flush stays quiet.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        print(
            f"error: interrupted (Ctrl-C) during `dynaforge {args.verb}`; what it had written whole is kept: "
            "rerun the same command (with --resume for training) to continue",
            file=sys.stderr,
        )
        return 2
    except Exception:
        # Anything else is a bug: the traceback, and a line that says so.
        traceback.print_exc()
        print(
            f"error: an unexpected failure inside dynaforge {__version__} (a bug): please report it with the "
            "command and the traceback above",
            file=sys.stderr,
        )
        return 1


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="dynaforge", description=__doc__.split(":")[0])
    parser.add_argument("-q", "--quiet", action="store_true", help="only warnings and errors")
    parser.add_argument("--version", action="version", version=f"dynaforge {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True)

    generate = verbs.add_parser("generate", help="generate a dataset folder from a config")
    add_config_arguments(generate)
    generate.add_argument("--out", required=True, help="dataset folder (created, or resumed if it exists)")
    generate.add_argument(
        "--shard-index", type=int, default=None, help="this worker's index (default: RANK or SLURM)"
    )
    generate.add_argument("--num-shards", type=int, default=None, help="number of workers sharing the job")
    generate.add_argument(
        "--processes",
        default="auto",
        help="worker processes on this machine, sharing its threads (same bytes as one); default auto: "
        "one thread per process for a 1D PDE on the CPU, else one process (docs/generation_speed.md)",
    )
    add_progress_argument(generate)
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
        "convert",
        help="convert a PDEBench or The Well HDF5 file into a dataset folder, or (--to) a dataset into theirs",
    )
    convert.add_argument(
        "input", help="PDEBench or The Well .hdf5/.h5 file; with --to, a dataset folder (or such a file)"
    )
    convert.add_argument(
        "--out", required=True, help="folder to create (a dataset folder, or with --to, theirs)"
    )
    convert.add_argument(
        "--to",
        default=None,
        metavar="the_well|pdebench",
        help="write INPUT in this format instead: The Well's dataset folder (data/{train,valid,test}/, "
        "stats.yaml) or one PDEBench file",
    )
    convert.add_argument(
        "--format", choices=["pdebench", "the_well"], default=None, help="source format (default: detected)"
    )
    convert.add_argument(
        "--splits",
        default="0.8,0.1,0.1",
        metavar="TRAIN,VAL,TEST",
        help="fractions (0.8,0.1,0.1, the default) or counts (1000,100,200) of the file's samples per "
        "split, contiguous in file order",
    )
    convert.add_argument("--shard-size", type=int, default=256, help="samples per shard (default 256)")
    add_progress_argument(convert)
    convert.set_defaults(handler=run_convert)

    train = verbs.add_parser("train", help="train a surrogate on a dataset folder into a run folder")
    add_config_arguments(train, stages=True)
    train.add_argument(
        "--data",
        default=None,
        help="dataset folder (from `dynaforge generate` or `convert`), or a PDEBench / The Well file; "
        "optional with data.source=stream (then the val split is generated in memory)",
    )
    train.add_argument("--out", required=True, help="run folder to create (or to continue, with --resume)")
    add_resume_argument(train, "its last checkpoint")
    train.add_argument(
        "--from",
        dest="init_from",
        default=None,
        metavar="RUN",
        help="fine-tune: start from the weights of RUN's surrogate (a run folder of `dynaforge train`)",
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
    add_progress_argument(train)
    train.set_defaults(handler=run_train)

    evaluate = verbs.add_parser("evaluate", help="score a run on the test split; writes RUN/eval/")
    evaluate.add_argument("run", help="run folder (from `dynaforge train`)")
    evaluate.add_argument(
        "overrides",
        nargs="*",
        metavar="evaluate.key=value",
        help="overrides of the run's evaluate section, e.g. evaluate.checkpoint=last evaluate.rollout_frames=50",
    )
    evaluate.add_argument(
        "--data",
        default=None,
        help="dataset folder or PDEBench / The Well file (default: the one trained on)",
    )
    evaluate.add_argument(
        "--checkpoint", choices=("best", "last"), default=None, help="default: evaluate.checkpoint (best)"
    )
    evaluate.add_argument(
        "--members",
        action="store_true",
        help="a run trained on a mixture: score it on each member's test trajectories (generated once into "
        "RUN/members/NAME; evaluations in RUN/eval-NAME, a summary in RUN/eval-members.json)",
    )
    evaluate.set_defaults(handler=run_evaluate)

    run = verbs.add_parser(
        "run",
        help="generate, train and evaluate from one config (skips finished stages); a mixture: train from the "
        "stream, then evaluate on every member",
    )
    add_config_arguments(run, stages=True)
    run.add_argument("--out", required=True, help="root folder: ROOT/data, ROOT/run (a mixture: ROOT/run)")
    add_progress_argument(run)
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
    simulate.add_argument("--frames", type=int, default=120, help="animation frames (2 or more)")
    add_threads_argument(simulate, "1 suits small systems")
    add_progress_argument(simulate)
    simulate.set_defaults(handler=run_nbody_simulate)
    train = actions.add_parser("train", help="train the learned step controller into a run folder")
    add_config_arguments(train)
    train.add_argument("--out", required=True, help="run folder (config.yaml, metrics.jsonl, checkpoints/)")
    add_resume_argument(train, "checkpoints/last.pt")
    add_threads_argument(train, "1 suits small systems")
    add_progress_argument(train)
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
        "--storage",
        default=None,
        help="Optuna storage URL (default: tune.storage, else STUDY/study.db); postgresql://USER@HOST:PORT/DB "
        "shares a study across machines, its password in PGPASSWORD or ~/.pgpass, never in the URL",
    )
    tune.add_argument("--out", default=None, help="study folder (default: studies/NAME)")
    tune.add_argument(
        "--data", default=None, help="dataset folder for PDE trials (default: generated into STUDY/data)"
    )
    add_threads_argument(tune, "per trial")
    tune.set_defaults(handler=run_tune)

    export = verbs.add_parser("export", help="export a run's model to ONNX and verify it in onnxruntime")
    export.add_argument("run", help="run folder (from `dynaforge train`, `nbody train` or STUDY/best)")
    export.add_argument(
        "--out",
        required=True,
        help="the .onnx file to write; an existing file is replaced only when it is a dynaforge export",
    )
    export.add_argument(
        "--force", action="store_true", help="replace --out even when it is not a dynaforge export"
    )
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
    add_resume_argument(train, "checkpoints/last.pt")
    add_threads_argument(train, "1 suits small networks")
    train.set_defaults(handler=run_twophase_train)


def add_config_arguments(parser: argparse.ArgumentParser, stages: bool = False) -> None:
    """The config and its overrides; `stages`: the verb also takes `stage=all|NAME` (the latent stack)."""
    parser.add_argument("config", help="YAML preset (see configs/)")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="dotted overrides, e.g. system.dt=0.005"
        + ("; stage=all (or a stage's name) trains the staged latent stack" if stages else ""),
    )


def add_progress_argument(parser: argparse.ArgumentParser) -> None:
    """--no-progress, read by `commands.progress_of`."""
    parser.add_argument("--no-progress", action="store_true", help="no progress bars")


def add_threads_argument(parser: argparse.ArgumentParser, advice: str) -> None:
    """--threads: the torch thread count the command's work runs with (default: torch's own)."""
    parser.add_argument("--threads", type=int, default=None, help=f"torch threads ({advice})")


def add_resume_argument(parser: argparse.ArgumentParser, checkpoint: str) -> None:
    """--resume of a training verb: continue the run folder --out, or start it when it has no checkpoint."""
    parser.add_argument(
        "--resume",
        action="store_true",
        help=f"continue the run in --out from {checkpoint} (start it if it has none)",
    )
