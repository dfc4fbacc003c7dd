"""Exact resume after SIGKILL, and DDP with 2 gloo ranks against one process (the trainer engine's
'Done when' tests), on the tiny Burgers dataset.

Both compare against an uninterrupted single-process run of the same config at the same torch thread
count (OMP_NUM_THREADS in the subprocesses, torch.set_num_threads here): training's float results depend on
the number of threads a reduction is split over, and the comparison must see only what resume or DDP
changes. Exact resume is checked with 1 and with 2 threads.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.pipeline import run_pipeline
from dynaforge.runs import load_checkpoint
from dynaforge.train import Engine
from dynaforge.train.log import read_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")

pytestmark = pytest.mark.usefixtures("one_thread")

# 72 train windows in micro-batches of 16: 5 optimiser steps per epoch (the last batch holds 8).
RESUME_OVERRIDES = [
    "train.preset=debug",
    "train.epochs=3",
    "train.checkpoint_every=3",
    "train.ema.decay=0.9",
    "train.log_every=1",
]
KILL_AT_STEP = 8  # epoch 2, its third step; the last checkpoint (step 6) lies inside epoch 2


def subprocess_env(threads: int = 1) -> dict[str, str]:
    # torch takes its thread count from MKL_NUM_THREADS too when that is set (OMP_NUM_THREADS=2 with
    # MKL_NUM_THREADS=1 exported gives 1 thread): both are set, so the child runs at `threads` whatever the
    # caller's environment.
    count = str(threads)
    return {**os.environ, "OMP_NUM_THREADS": count, "MKL_NUM_THREADS": count, "PYTHONPATH": str(REPO)}


def killed_training(data: Path, out: Path, threads: int = 1) -> None:
    """`dynaforge train` in a fresh interpreter that SIGKILLs itself right after optimiser step KILL_AT_STEP."""
    script = textwrap.dedent(
        f"""
        import os, signal, sys
        from dynaforge.cli import main
        from dynaforge.train.engine import Engine

        count_step = Engine.count_step

        def count_then_die(self):
            count_step(self)
            if self.step == {KILL_AT_STEP}:
                os.kill(os.getpid(), signal.SIGKILL)

        Engine.count_step = count_then_die
        sys.exit(main(sys.argv[1:]))
        """
    )
    args = ["-q", "train", TINY, *RESUME_OVERRIDES, "--data", str(data), "--out", str(out), "--no-progress"]
    result = subprocess.run(
        [sys.executable, "-c", script, *args],
        capture_output=True,
        text=True,
        timeout=120,
        env=subprocess_env(threads),
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


@pytest.mark.reproducibility
@pytest.mark.parametrize("threads", [1, 2])
def test_a_run_killed_mid_epoch_resumes_to_bitwise_identical_weights(
    tiny_data: Path, tmp_path: Path, threads: int
) -> None:
    torch.set_num_threads(threads)  # the `one_thread` fixture restores the count afterwards
    reference = tmp_path / "reference"
    assert (
        main(
            [
                "-q",
                "train",
                TINY,
                *RESUME_OVERRIDES,
                "--data",
                str(tiny_data),
                "--out",
                str(reference),
                "--no-progress",
            ]
        )
        == 0
    )

    resumed = tmp_path / "resumed"
    killed_training(tiny_data, resumed, threads)
    interrupted = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert interrupted["torch_threads"] == threads
    assert interrupted["step"] == 6 and interrupted["position"] == {"epoch": 1, "batches": 1}
    assert not interrupted["complete"]
    assert (
        main(
            [
                "-q",
                "train",
                TINY,
                *RESUME_OVERRIDES,
                "--data",
                str(tiny_data),
                "--out",
                str(resumed),
                "--resume",
                "--no-progress",
            ]
        )
        == 0
    )

    want = load_checkpoint(reference / "checkpoints" / "last.pt")
    got = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert got["complete"] and got["step"] == want["step"] == 15
    for key in ("model", "train_model"):  # EMA weights and trained weights
        for name, value in want[key].items():
            assert torch.equal(got[key][name], value), f"{key}.{name}"
    for name, value in want["optimizer"]["state"].items():
        for slot, tensor in value.items():
            assert torch.equal(got["optimizer"]["state"][name][slot], tensor), f"optimizer {name}.{slot}"
    assert got["scheduler"]["last_epoch"] == want["scheduler"]["last_epoch"]
    best_want = load_checkpoint(reference / "checkpoints" / "best.pt")["model"]
    best_got = load_checkpoint(resumed / "checkpoints" / "best.pt")["model"]
    assert all(torch.equal(best_got[k], v) for k, v in best_want.items())

    # The log reads like the uninterrupted one, plus a `resume` line where the run picked up.
    records = read_metrics(resumed / "metrics.jsonl")
    reference_records = read_metrics(reference / "metrics.jsonl")
    assert [r for r in records if r["kind"] == "resume"] == [
        {"kind": "resume", "step": 6, "epoch": 2, "batch": 1, "world_size": 1}
    ]
    epochs = [(r["epoch"], r["val_loss"], r["train_loss"]) for r in records if r["kind"] == "epoch"]
    assert epochs == [
        (r["epoch"], r["val_loss"], r["train_loss"]) for r in reference_records if r["kind"] == "epoch"
    ]
    windows = [(r["step"], r["loss"]) for r in records if r["kind"] == "train"]
    assert windows == [(r["step"], r["loss"]) for r in reference_records if r["kind"] == "train"]
    assert [step for step, _ in windows] == list(range(1, 16))  # steps 7 and 8 of the killed run: dropped


def test_resume_refuses_another_config_and_fresh_training_refuses_an_existing_run(
    tiny_data: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    run = tmp_path / "run"
    assert (
        main(
            [
                "-q",
                "train",
                TINY,
                "train.epochs=1",
                "--data",
                str(tiny_data),
                "--out",
                str(run),
                "--no-progress",
            ]
        )
        == 0
    )
    assert (
        main(["-q", "train", TINY, "train.epochs=2", "--data", str(tiny_data), "--out", str(run), "--resume"])
        == 2
    )
    error = capsys.readouterr().err
    assert "train.epochs: 1 != 2" in error and "cannot be continued" in error
    assert main(["-q", "train", TINY, "train.epochs=1", "--data", str(tiny_data), "--out", str(run)]) == 2
    assert "continue it (--resume)" in capsys.readouterr().err
    # Resuming a finished run does nothing more.
    before = (run / "checkpoints" / "last.pt").stat().st_mtime_ns
    assert (
        main(["-q", "train", TINY, "train.epochs=1", "--data", str(tiny_data), "--out", str(run), "--resume"])
        == 0
    )
    assert (run / "checkpoints" / "last.pt").stat().st_mtime_ns == before


def test_run_resumes_an_unfinished_train_stage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_config(TINY, ["train.epochs=2"])
    count_step = Engine.count_step

    def interrupt_in_epoch_two(self: Engine) -> None:
        count_step(self)
        if self.step == 7:
            raise KeyboardInterrupt

    monkeypatch.setattr(Engine, "count_step", interrupt_in_epoch_two)
    with pytest.raises(KeyboardInterrupt):
        run_pipeline(config, tmp_path, progress=False)
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["step"] == 5
    monkeypatch.setattr(Engine, "count_step", count_step)
    report = run_pipeline(config, tmp_path, progress=False)
    assert report.exists()
    records = read_metrics(tmp_path / "run" / "metrics.jsonl")
    assert [r["step"] for r in records if r["kind"] == "resume"] == [5]
    assert [r["epoch"] for r in records if r["kind"] == "epoch"] == [1, 2]
    assert load_checkpoint(tmp_path / "run" / "checkpoints" / "last.pt")["complete"]


# DDP: each of 2 ranks takes half of each global batch (8 of 16 windows). Plain SGD without clipping is
# the check that could fail: its update is proportional to the gradient, so a rank that summed instead
# of averaged, skipped the all-reduce or saw the wrong windows would move the weights by a different
# amount (Adam, sign-like early on, would hide a wrong scale). The two runs differ only in the order of
# float32 sums (two half-batch means averaged against one mean): a few ulp per gradient, ~1e-7 relative,
# accumulated over 10 steps of lr <= 0.01 on weights of size ~0.5: below 1e-8 in absolute terms. We
# allow atol 1e-6, still 3 orders of magnitude below the 1e-3 change a single wrong step would make.
DDP_OVERRIDES = ["train.optimizer.name=sgd", "train.grad_clip=null", "train.epochs=2", "train.log_every=1"]


@pytest.mark.parametrize(
    "reading",
    [[], ["data.reading=lazy", "data.buffer=3"]],
    ids=["in memory", "lazy: rank r reads positions r, r + 2, ... of the buffered order"],
)
def test_ddp_on_two_gloo_ranks_matches_one_process_with_the_same_global_batch(
    tiny_data: Path, tmp_path: Path, reading: list[str]
) -> None:
    single = tmp_path / "single"
    assert (
        main(
            [
                "-q",
                "train",
                TINY,
                *DDP_OVERRIDES,
                *reading,
                "data.batch_size=16",
                "--data",
                str(tiny_data),
                "--out",
                str(single),
                "--no-progress",
            ]
        )
        == 0
    )

    ddp = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
        "-m", "dynaforge.cli", "train", TINY, *DDP_OVERRIDES, *reading, "data.batch_size=8",
        "--data", str(tiny_data), "--out", str(ddp), "--no-progress",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=180, env=subprocess_env())
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("best validation loss") == 1  # rank 0 alone reports

    want = load_checkpoint(single / "checkpoints" / "last.pt")
    got = load_checkpoint(ddp / "checkpoints" / "last.pt")
    assert got["world_size"] == 2 and len(got["rng"]) == 2 and got["step"] == want["step"] == 10
    for name, value in want["model"].items():
        torch.testing.assert_close(got["model"][name], value, rtol=0, atol=1e-6)
    # Losses and metrics are reduced across ranks: the logs agree with the single process.
    single_records = [r for r in read_metrics(single / "metrics.jsonl") if r["kind"] in ("train", "epoch")]
    ddp_records = [r for r in read_metrics(ddp / "metrics.jsonl") if r["kind"] in ("train", "epoch")]
    assert len(ddp_records) == len(single_records) == 12
    for mine, theirs in zip(ddp_records, single_records):
        for key in ("loss", "grad_norm", "train_loss", "val_loss"):
            if key in theirs:
                assert mine[key] == pytest.approx(theirs[key], rel=1e-5), (key, mine["step"])
    assert sorted(p.name for p in ddp.iterdir()) == ["checkpoints", "config.yaml", "metrics.jsonl"]


def test_a_time_budget_on_two_gloo_ranks_decides_alike_on_both(tiny_data: Path, tmp_path: Path) -> None:
    # Rank 1's clock runs 1.5 s ahead of rank 0's. The counts after the first epoch and a quarter of the way
    # in, and the overrun net, are decided on times averaged over the ranks: decided on its own clock, rank 1
    # would count or stop at another epoch than rank 0 and the two would wait on each other (the timeout).
    script = tmp_path / "train_skewed.py"
    script.write_text(
        textwrap.dedent(
            """
            import os, sys
            from dynaforge.cli import main
            from dynaforge.train.budget import TimeBudget

            if os.environ["RANK"] == "1":
                elapsed = TimeBudget.elapsed
                TimeBudget.elapsed = lambda self: elapsed(self) + 1.5
            sys.exit(main(sys.argv[1:]))
            """
        )
    )
    out = tmp_path / "ddp"
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script),
        "-q", "train", TINY, "train.time_budget=3", "train.log_every=1", "data.batch_size=8",
        "--data", str(tiny_data), "--out", str(out), "--no-progress",
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=240, env=subprocess_env())
    assert result.returncode == 0, result.stderr[-3000:]
    records = read_metrics(out / "metrics.jsonl")
    _, first, *second = [r for r in records if r["kind"] == "budget"]
    assert first["after_epoch"] == 1 and [r["after_epoch"] > 1 for r in second] == [True] * len(second)
    epochs = [r for r in records if r["kind"] == "epoch"]
    state = load_checkpoint(out / "checkpoints" / "last.pt")
    assert state["world_size"] == 2 and state["complete"] and state["budget_epochs"] == len(epochs)
