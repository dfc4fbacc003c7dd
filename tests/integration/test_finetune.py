"""Fine-tuning through the CLI (issue 36): `dynaforge train CONFIG --from RUN` starts from RUN's weights,
and a `--from` that holds no surrogate, or one whose model cannot read CONFIG's data, is refused with one
`error:` line before anything is written."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.models.loading import load_surrogate
from dynaforge.runs import load_checkpoint
from dynaforge.train.window import window_engine

REPO = Path(__file__).resolve().parents[2]
MIXTURE = str(REPO / "tests" / "unit" / "mixture_tiny.yaml")
TINY = str(REPO / "configs" / "tiny.yaml")
STREAM = [
    "data.source=stream",
    "data.stream.buffer=4",
    "data.stream.reuse=2",
    "train.epochs=1",
    "dataset.n_train=4",
]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch on the tiny Burgers + heat mixture (32 points)."""
    out = tmp_path_factory.mktemp("pretrain") / "run"
    assert main(["train", MIXTURE, "train.epochs=1", "--out", str(out), "--no-progress"]) == 0
    return out


def test_fine_tuning_starts_from_the_pretrained_weights(pretrained: Path, tmp_path: Path) -> None:
    # Burgers on 64 points, held out of nothing here but another grid: the FNO reads any resolution.
    config = load_config(TINY, STREAM)
    engine = window_engine(config, None, tmp_path / "unstarted", progress=False, init_from=pretrained)
    try:
        start = engine.model.state_dict()
        weights = load_surrogate(pretrained).model.state_dict()
        assert start.keys() == weights.keys()
        assert all(torch.equal(start[name], weights[name]) for name in weights)
    finally:
        engine.task.close()
    out = tmp_path / "finetuned"
    assert main(["train", TINY, *STREAM, "--from", str(pretrained), "--out", str(out), "--no-progress"]) == 0
    tuned = load_checkpoint(out / "checkpoints" / "last.pt")["model"]
    assert any(not torch.equal(tuned[name], weights[name]) for name in weights)  # it trained from there


@pytest.mark.parametrize(
    ("overrides", "expected"),
    [
        (["model.width=12"], "model.width: 8 != 12"),
        (["data.history=3"], "history: 2 (pretrained) != 3"),
    ],
)
def test_a_pretrained_model_that_cannot_read_the_data_is_refused(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], overrides: list[str], expected: str
) -> None:
    out = tmp_path / "run"
    code = main(
        ["train", TINY, *STREAM, *overrides, "--from", str(pretrained), "--out", str(out), "--no-progress"]
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and err[0].startswith("error: --from") and expected in err[0]
    assert not out.exists()


def test_a_from_folder_without_a_surrogate_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty, out = tmp_path / "empty", tmp_path / "run"
    empty.mkdir()
    code = main(["train", TINY, *STREAM, "--from", str(empty), "--out", str(out), "--no-progress"])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(err) == 1 and "holds no checkpoints/best.pt or checkpoints/last.pt" in err[0]
    assert not out.exists()


@pytest.mark.parametrize("keep", [True, False])
def test_fine_tuning_keeps_the_pretrained_normaliser_unless_told(
    pretrained: Path, tmp_path: Path, keep: bool
) -> None:
    # The mixture's statistics (Burgers + heat, std ~0.4) are not tiny.yaml's Burgers alone: the two differ,
    # so the test tells which one the fine-tuned run used.
    theirs = load_surrogate(pretrained).normalizer.to_dict()
    choice = [] if keep else ["data.finetune_normalize=data"]
    config = load_config(TINY, [*STREAM, *choice])
    engine = window_engine(config, None, tmp_path / "unstarted", progress=False, init_from=pretrained)
    try:
        own = window_engine(load_config(TINY, STREAM), None, tmp_path / "own", progress=False)
        try:
            ours = own.task.normalizer.to_dict()
        finally:
            own.task.close()
        assert theirs != ours
        assert engine.task.normalizer.to_dict() == (theirs if keep else ours)
    finally:
        engine.task.close()
    out = tmp_path / "finetuned"
    argv = ["train", TINY, *STREAM, *choice, "--from", str(pretrained), "--out", str(out), "--no-progress"]
    assert main(argv) == 0
    # The checkpoint round-trips the normaliser the run trained with, and the loaded surrogate uses it.
    assert load_checkpoint(out / "checkpoints" / "last.pt")["normalization"] == (theirs if keep else ours)
    assert load_surrogate(out).normalizer.to_dict() == (theirs if keep else ours)


def test_a_fine_tuning_run_resumed_without_its_from_is_refused(
    pretrained: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # Without --from it would normalise with the data's own statistics, not the pretrained ones it trained on.
    out = tmp_path / "finetuned"
    assert main(["train", TINY, *STREAM, "--from", str(pretrained), "--out", str(out), "--no-progress"]) == 0
    capsys.readouterr()
    again = ["train", TINY, *STREAM, "--out", str(out), "--resume", "--no-progress"]
    assert main(again) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "resume a fine-tuning run with the same --from RUN" in err[0]
    assert (
        main([*again[:-2], "--from", str(pretrained), "--resume", "--no-progress"]) == 0
    )  # with it, it goes on
