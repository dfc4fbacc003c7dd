"""Output folders: every verb that writes a folder follows one rule (`dynaforge.atomic.check_output_folder`):
a folder that holds something the verb does not write is refused with one `error:` line, and nothing in it
changes, not even a file added; and one message, two faces: the command line names its flags."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, run_cli
from tests.faults.conftest import fails_cleanly, file_hashes

TINY = str(CONFIGS / "tiny.yaml")
NBODY = str(CONFIGS / "nbody_tiny.yaml")


def foreign_folder(root: Path) -> Path:
    """A folder of the user's: a file and a subfolder with a file."""
    (root / "mine").mkdir(parents=True)
    (root / "notes.txt").write_text("the user's notes")
    (root / "mine" / "table.csv").write_text("a,b\n1,2\n")
    return root


def listing(root: Path) -> list[str]:
    """Every entry below `root`, hidden ones included."""
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def writes_nothing(root: Path, *args: str, named: str) -> str:
    """`dynaforge ARGS` fails cleanly naming `named`, and `root` holds exactly what it held, byte for byte;
    returns the error line."""
    before, hashes = listing(root), file_hashes(root)
    line = fails_cleanly(run_cli(*args, check=False), named)
    assert listing(root) == before
    assert file_hashes(root) == hashes
    return line


@pytest.mark.parametrize("verb", ["generate", "run", "train", "nbody simulate"])
def test_every_verb_refuses_a_foreign_folder_and_writes_nothing(
    verb: str, tiny_data: Path, tmp_path: Path
) -> None:
    out = foreign_folder(tmp_path / "out")
    args = {
        "generate": ["generate", TINY, "--out", str(out)],
        "run": ["run", TINY, "--out", str(out)],
        "train": ["train", TINY, "--data", str(tiny_data), "--out", str(out)],
        "nbody simulate": ["nbody", "simulate", NBODY, "--out", str(out), "--animation", "none"],
    }[verb]
    line = writes_nothing(out, *args, named="notes.txt")
    assert "--out" in line and "`out`" not in line  # the command line's face names its flag


def test_a_run_folder_is_not_a_dataset_folder(tiny_run: Path, tiny_data: Path, tmp_path: Path) -> None:
    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    writes_nothing(run, "generate", TINY, "--out", str(run), named="checkpoints")
    data = Path(shutil.copytree(tiny_data, tmp_path / "data"))
    writes_nothing(
        data, "train", TINY, "--data", str(tiny_data), "--out", str(data), "--resume", named="manifest.json"
    )
    writes_nothing(data, "run", TINY, "--out", str(data), named="manifest.json")


def test_one_message_two_faces(tiny_run: Path, tiny_data: Path, tmp_path: Path) -> None:
    """The refusal to clobber a run, as the CLI prints it (flags) and as the API raises it (arguments)."""
    import dynaforge
    from dynaforge.errors import RunError

    run = Path(shutil.copytree(tiny_run, tmp_path / "run"))
    line = fails_cleanly(
        run_cli("train", TINY, "train.epochs=2", "--data", str(tiny_data), "--out", str(run), check=False),
        "--resume",
        "--out",
    )
    assert "resume=True" not in line
    with pytest.raises(RunError) as error:
        dynaforge.api.train(TINY, tiny_data, run, overrides=["train.epochs=2"], progress=False)
    assert "resume=True" in str(error.value) and "overwrite=True" in str(error.value)
    assert "--" not in str(error.value).replace(str(run), "RUN")
