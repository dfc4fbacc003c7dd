"""Advice that costs nothing (issue 39): following any message `rollout` prints about a model file leaves
that file as it was; `export` replaces only its own earlier exports unless told to (--force); `rollout`
tells a folder, a missing path, a file that is not ONNX and a damaged ONNX file apart; `nbody simulate`
refuses --frames below 2; the checking verbs `inspect` and `verify` end every expected failure as all
verbs do (status 2, one `error:` line; docs/exit-codes.md)."""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path

import h5py
import pytest

from tests.conftest import CONFIGS, ROOT, run_cli
from tests.faults.conftest import fails_cleanly, file_hashes, unchanged

ONE_THREAD = {"OMP_NUM_THREADS": "1"}
ADVISED = re.compile(r"`(dynaforge [\w-]+ [^`]+)`")
"""A command an error message advises, in backquotes (a verb alone, `dynaforge export`, only names it)."""
PLACEHOLDERS = ("NEW.onnx", "FILE.onnx")
"""Names of a new file in advice; the test fills in a path that does not exist."""

needs_export = pytest.mark.skipif(
    any(importlib.util.find_spec(name) is None for name in ("onnx", "onnxruntime", "onnxscript")),
    reason="export needs dynaforge[export]",
)


def dynaforge(*args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("-q", *args, check=False, env=ONE_THREAD)


def advised(line: str, run: Path, new: Path) -> list[list[str]]:
    """The commands `line` advises, as argument lists without `dynaforge`, placeholders filled in."""
    fill = {"RUN": str(run), **dict.fromkeys(PLACEHOLDERS, str(new))}
    return [[fill.get(arg, arg) for arg in shlex.split(command)[1:]] for command in ADVISED.findall(line)]


def out_of(args: list[str]) -> Path | None:
    return Path(args[args.index("--out") + 1]) if "--out" in args else None


@pytest.fixture(scope="module")
def exported(tiny_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("advice-export") / "model.onnx"
    run_cli("-q", "export", str(tiny_run), "--out", str(out), env=ONE_THREAD)
    return out


def bad_model(kind: str, run: Path, exported: Path, tmp_path: Path) -> Path:
    """A path that is not a usable model, of each kind a user passes by mistake."""
    if kind == "checkpoint":
        return run / "checkpoints" / "best.pt"
    if kind == "text":
        return Path(shutil.copy(ROOT / "README.md", tmp_path / "README.md"))
    if kind == "run folder":
        return run
    if kind == "truncated":
        content = exported.read_bytes()
        (tmp_path / "model.onnx").write_bytes(content[: len(content) // 2])
        return tmp_path / "model.onnx"
    return tmp_path / "missing.onnx"


@needs_export
@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("checkpoint", "is not an ONNX file"),
        ("text", "is not an ONNX file"),
        ("run folder", "is a run folder"),
        ("missing", "is missing"),
        ("truncated", "is damaged"),
    ],
)
def test_following_rollouts_advice_leaves_the_file_it_names_unchanged(
    kind: str, says: str, run_copy: Path, exported: Path, tiny_data: Path, tmp_path: Path
) -> None:
    model = bad_model(kind, run_copy, exported, tmp_path)
    before = file_hashes(model) if model.exists() else {}
    line = fails_cleanly(
        dynaforge("rollout", "--onnx", str(model), "--data", str(tiny_data)), str(model), says
    )
    commands = advised(line, run_copy, tmp_path / "new.onnx")
    assert commands, f"no command advised: {line}"
    for args in commands:
        target = out_of(args)
        if model.exists() and target is not None:
            assert target.resolve() != model.resolve(), f"the advice writes over {model}: {line}"
        followed = dynaforge(*args)
        assert followed.returncode == 0, f"advised `{shlex.join(args)}` failed:\n{followed.stderr}"
    unchanged(before, model)
    if kind in ("checkpoint", "run folder"):  # the advice names the model to pass next: it runs
        passed = re.search(r"pass --onnx (\S+)$", line)
        assert passed, line
        assert dynaforge("rollout", "--onnx", passed[1], "--data", str(tiny_data)).returncode == 0


@needs_export
@pytest.mark.parametrize("kind", ["checkpoint", "text", "truncated"])
def test_export_refuses_to_replace_a_file_that_is_not_a_dynaforge_export(
    kind: str, run_copy: Path, exported: Path, tmp_path: Path
) -> None:
    target = bad_model(kind, run_copy, exported, tmp_path)
    before = file_hashes(target)
    line = fails_cleanly(dynaforge("export", str(run_copy), "--out", str(target)), str(target), "--force")
    assert "not a dynaforge export" in line
    unchanged(before, target)


@needs_export
def test_export_refuses_a_folder_as_out(tiny_run: Path, tmp_path: Path) -> None:
    fails_cleanly(dynaforge("export", str(tiny_run), "--out", str(tmp_path)), str(tmp_path), "is a folder")


@needs_export
def test_export_force_replaces_a_file_and_an_earlier_export_is_replaced_without_it(
    tiny_run: Path, tmp_path: Path
) -> None:
    from dynaforge.export.onnx_file import Holds, read_onnx_file

    target = tmp_path / "model.onnx"
    target.write_text("notes kept under a model's name\n")
    assert dynaforge("export", str(tiny_run), "--out", str(target), "--force").returncode == 0
    assert read_onnx_file(target).holds is Holds.EXPORT
    # An earlier export (recognised by its `dynaforge` metadata) is replaced without --force.
    first = target.stat().st_ino
    assert dynaforge("export", str(tiny_run), "--out", str(target)).returncode == 0
    # A new file renamed over the old one (the export is written atomically).
    assert target.stat().st_ino != first and read_onnx_file(target).holds is Holds.EXPORT


@pytest.mark.parametrize("frames", ["0", "-5"])
def test_nbody_simulate_refuses_fewer_than_two_frames(frames: str, tmp_path: Path) -> None:
    out = tmp_path / "sim"
    result = dynaforge(
        "nbody", "simulate", str(CONFIGS / "nbody_tiny.yaml"), "--out", str(out), "--frames", frames
    )
    fails_cleanly(result, "--frames must be 2 or more", f"got {frames}")
    assert not out.exists()


# ---- the checking verbs ---------------------------------------------------------------------------


def interrupted(data: Path) -> Path:
    """A generation stopped before its first shard finished: the config saved, no manifest, no shard."""
    (data / "manifest.json").unlink()
    for shard in data.glob("*/shard-*"):
        shard.unlink()
    return data


def altered(data: Path) -> Path:
    """One stored value changed after generation (the shard's SHA-256 and the sample's hash differ)."""
    with h5py.File(data / "train" / "shard-00001.h5", "r+") as h5:
        h5["fields"][1, 3, 10, 0] += 1e-3
    return data


def check_expected_failures(verb: str, cases: dict[str, tuple[Path, str]]) -> None:
    """`verb` on each folder, text and JSON: status 2, one `error:` line naming what it must; JSON still
    printed on stdout."""
    for name, (folder, names) in cases.items():
        before = file_hashes(folder)
        for json_flag in ((), ("--json",)):
            extra = ("--samples", "all") if verb == "verify" else ()
            result = run_cli(verb, str(folder), *extra, *json_flag, check=False, env=ONE_THREAD)
            try:
                fails_cleanly(result, names)
            except AssertionError as error:
                raise AssertionError(f"{verb} {' '.join(json_flag)} on the {name} folder: {error}") from None
            if json_flag and name == "corrupt":
                assert json.loads(result.stdout)["ok"] is False
        unchanged(before, folder)


@pytest.mark.parametrize(
    ("verb", "corrupt_names"), [("inspect", "train/shard-00001.h5"), ("verify", "do not match")]
)
def test_checking_verbs_end_every_expected_failure_with_status_2(
    verb: str, corrupt_names: str, data_copy: Path, tmp_path: Path
) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    other = Path(shutil.copytree(data_copy, tmp_path / "other"))
    check_expected_failures(
        verb,
        {
            "interrupted": (interrupted(data_copy), "manifest.json is missing"),
            "empty": (empty, "manifest.json is missing"),
            "corrupt": (altered(other), corrupt_names),
        },
    )
