"""Lazy reading and streaming end to end: a run SIGKILLed mid-epoch and resumed ends with the weights of an
uninterrupted one, bit for bit; DDP ranks draw disjoint streamed samples; the log measures the data
source (issue 22). Runs on the tiny Burgers preset, one torch thread, like tests/integration/test_resume_ddp.py."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from dynaforge.cli import main
from dynaforge.runs import load_checkpoint
from dynaforge.train.log import read_metrics

REPO = Path(__file__).resolve().parents[2]
TINY = str(REPO / "configs" / "tiny.yaml")
pytestmark = pytest.mark.usefixtures("one_thread")

COMMON = ["train.preset=debug", "train.epochs=3", "train.checkpoint_every=3", "train.log_every=1"]
SOURCES = {
    # 72 windows, batches of 16: 5 steps per epoch; a buffer of 3 of the 8 trajectories.
    "lazy": ["data.reading=lazy", "data.buffer=3"],
    # 8 new samples per epoch, 2 per round: 4 rounds of 4 x 9 windows, 9 batches of 16 per epoch.
    "stream": ["data.source=stream", "data.stream.buffer=4", "data.stream.reuse=2", "dataset.batch_size=2"],
}
# The same stream made by a generator process (a killed trainer's worker leaves on its own).
SOURCES["workers"] = [*SOURCES["stream"], "data.stream.workers=1"]
KILL_AT_STEP = 8


def env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO / "src")}


def train_args(source: str, data: Path | None, out: Path) -> list[str]:
    where = ["--data", str(data)] if data is not None else []
    return ["-q", "train", TINY, *COMMON, *SOURCES[source], *where, "--out", str(out), "--no-progress"]


def killed_training(args: list[str]) -> None:
    """`dynaforge ARGS` in a fresh interpreter that SIGKILLs itself right after optimiser step KILL_AT_STEP."""
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
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120, env=env()
    )
    assert result.returncode == -signal.SIGKILL, result.stderr


@pytest.mark.reproducibility
@pytest.mark.parametrize(("source", "with_data"), [("lazy", True), ("stream", False), ("workers", False)])
def test_a_killed_lazy_or_streaming_run_resumes_to_bitwise_identical_weights(
    tiny_data: Path, tmp_path: Path, source: str, with_data: bool
) -> None:
    data = tiny_data if with_data else None
    reference, resumed = tmp_path / "reference", tmp_path / "resumed"
    assert main(train_args(source, data, reference)) == 0
    killed_training(train_args(source, data, resumed))
    interrupted = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert interrupted["step"] == 6 and not interrupted["complete"]
    assert main([*train_args(source, data, resumed), "--resume"]) == 0

    want = load_checkpoint(reference / "checkpoints" / "last.pt")
    got = load_checkpoint(resumed / "checkpoints" / "last.pt")
    assert got["complete"] and got["step"] == want["step"]
    for name, value in want["model"].items():
        assert torch.equal(got["model"][name], value), name
    for name, value in want["optimizer"]["state"].items():
        for slot, tensor in value.items():
            assert torch.equal(got["optimizer"]["state"][name][slot], tensor), f"optimizer {name}.{slot}"
    losses = [(r["step"], r["loss"]) for r in read_metrics(resumed / "metrics.jsonl") if r["kind"] == "train"]
    assert losses == [
        (r["step"], r["loss"]) for r in read_metrics(reference / "metrics.jsonl") if r["kind"] == "train"
    ]

    # The log measures the source: windows consumed per second, time waited, trajectories made or read.
    record = next(r for r in read_metrics(reference / "metrics.jsonl") if r["kind"] == "train")
    assert record["windows_per_s"] > 0 and 0 <= record["data_wait_share"] <= 1 and record["data_wait_s"] >= 0
    assert record["trajectories_read_per_s" if source == "lazy" else "trajectories_generated_per_s"] >= 0


def test_reading_auto_holds_splits_that_fit_the_budget_and_reads_the_others_lazily(
    tiny_data: Path, tmp_path: Path
) -> None:
    # The tiny train + val splits hold 12 x 11 x 64 float32 = 33 KiB: read whole 3x that, ~0.1 MiB.
    for budget, reading in (("1.0", "memory"), ("0.05", "lazy")):
        out = tmp_path / reading
        args = [
            "-q",
            "train",
            TINY,
            "train.preset=debug",
            "train.epochs=1",
            f"data.memory_budget_mib={budget}",
        ]
        assert main([*args, "--data", str(tiny_data), "--out", str(out), "--no-progress"]) == 0
        header = read_metrics(out / "metrics.jsonl")[0]
        assert header["reading"] == reading and header["train_windows"] == 72


def test_training_without_data_asks_for_it_or_for_the_stream(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["-q", "train", TINY, "--out", str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and "--data DIR" in err and "data.source=stream" in err


def train_on_two_gloo_ranks(tmp_path: Path, script: str, args: list[str]) -> list[list[int]]:
    """`dynaforge train` of the tiny config for one epoch on 2 gloo ranks through `script` (which wraps the
    CLI and dumps what it recorded to OUT_DIR/rankR.json); returns each rank's record."""
    script_path = tmp_path / "record.py"
    script_path.write_text(script)
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2", str(script_path),
        "-q", "train", TINY, "train.preset=debug", "train.epochs=1", "data.batch_size=8", *args, "--no-progress",
    ]  # fmt: skip
    result = subprocess.run(
        command, capture_output=True, text=True, timeout=180, env={**env(), "OUT_DIR": str(tmp_path)}
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]


def test_two_gloo_ranks_stream_disjoint_samples(tmp_path: Path) -> None:
    """Each rank records the train-split indices its generator made: disjoint, and together 0..n-1."""
    script = textwrap.dedent(
        """
        import json, os, sys
        from dynaforge.cli import main
        from dynaforge.data import mixture

        made = []
        generate = mixture.MixturePlan.rows

        def recording(plan, split, start, stop, device):
            if split == "train":
                made.extend(range(start, stop))
            return generate(plan, split, start, stop, device)

        mixture.MixturePlan.rows = recording
        code = main(sys.argv[1:])
        with open(os.environ["OUT_DIR"] + f"/rank{os.environ['RANK']}.json", "w") as f:
            json.dump(made, f)
        sys.exit(code)
        """
    )
    out = tmp_path / "ddp"
    ranks = train_on_two_gloo_ranks(tmp_path, script, [*SOURCES["stream"], "--out", str(out)])
    # Samples 0..3 feed the statistics first (made by both ranks before the stream starts): skip them.
    streamed = [made[4:] for made in ranks]
    for rank, made in enumerate(streamed):
        assert len(made) == len(set(made))  # nothing generated twice
        assert all((j // 2) % 2 == rank for j in made)  # blocks of dataset.batch_size=2, dealt by rank
    assert not set(streamed[0]) & set(streamed[1])
    # 2 rounds per epoch, each rank's buffer 4 + 2 new: its samples 0..5, samples 0..11 together, no gap.
    assert set(range(12)) <= set(streamed[0]) | set(streamed[1])
    assert load_checkpoint(out / "checkpoints" / "last.pt")["world_size"] == 2


def test_two_gloo_ranks_read_disjoint_windows_lazily(tmp_path: Path, tiny_data: Path) -> None:
    """Each rank records the train windows its lazy dataset read in one epoch: disjoint, all 72 together."""
    script = textwrap.dedent(
        """
        import json, os, sys
        from dynaforge.cli import main
        from dynaforge.data import windows

        read = []
        getitem = windows.WindowDataset.__getitem__

        def recording(self, index):
            if len(self) == 72:  # the train split (8 trajectories x 9 windows); val has 4 x 9
                read.append(index)
            return getitem(self, index)

        windows.WindowDataset.__getitem__ = recording
        code = main(sys.argv[1:])
        with open(os.environ["OUT_DIR"] + f"/rank{os.environ['RANK']}.json", "w") as f:
            json.dump(read, f)
        sys.exit(code)
        """
    )
    out = tmp_path / "ddp"
    args = [*SOURCES["lazy"], "--data", str(tiny_data), "--out", str(out)]
    ranks = train_on_two_gloo_ranks(tmp_path, script, args)
    assert len(ranks[0]) == len(ranks[1]) == 36
    assert not set(ranks[0]) & set(ranks[1])
    assert sorted(ranks[0] + ranks[1]) == list(range(72))
    assert load_checkpoint(out / "checkpoints" / "last.pt")["world_size"] == 2


def test_run_with_the_stream_stores_only_val_and_test_and_evaluates_on_them(tmp_path: Path) -> None:
    from dynaforge.config import load_config
    from dynaforge.pipeline import run_pipeline
    from dynaforge.store import DatasetFolder

    config = load_config(TINY, ["train.preset=debug", "train.epochs=1", *SOURCES["stream"]])
    report = run_pipeline(config, tmp_path, progress=False)
    assert report == tmp_path / "run" / "eval" / "report.html" and report.exists()  # the run's own data
    stored = DatasetFolder(tmp_path / "data")
    assert [stored.split_size(s) for s in ("train", "val", "test")] == [1, 4, 4]
    header = read_metrics(tmp_path / "run" / "metrics.jsonl")[0]
    assert header["source"] == "stream" and header["train_windows"] == 4 * 4 * 9
