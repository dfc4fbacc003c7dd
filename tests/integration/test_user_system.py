"""A user's own system, named in YAML by import path (docs/user-systems.md): the example of
examples/swift_hohenberg.py generated, trained and evaluated through the CLI and through `dynaforge.api`,
`inspect`/`verify` saying which code a dataset names before importing it, and the import paths that are
refused (a function, a class that is no system, a missing module) with one `error:` line naming the package.
The physics of the example is checked in tests/physics/test_swift_hohenberg.py."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

import dynaforge
from dynaforge.config import ConfigError, load_config
from dynaforge.seeds import Rows
from dynaforge.systems import build_system
from tests.conftest import run_cli

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CONFIG = EXAMPLES / "swift_hohenberg.yaml"
NAME = "swift_hohenberg:SwiftHohenberg"
CODE_LINE = f"system code: {NAME} (imported from {EXAMPLES / 'swift_hohenberg.py'})"


def with_examples(extra: str | None = None) -> dict[str, str]:
    """The environment of a user who put the folder of their system on the Python path."""
    paths = [str(EXAMPLES), *(p for p in (extra, os.environ.get("PYTHONPATH")) if p)]
    return {"PYTHONPATH": os.pathsep.join(paths)}


def test_generate_train_evaluate_through_the_cli(tmp_path: Path) -> None:
    data, run = tmp_path / "data", tmp_path / "run"
    env = with_examples()
    run_cli("generate", str(CONFIG), "--out", str(data), "--no-progress", env=env)
    run_cli("train", str(CONFIG), "--data", str(data), "--out", str(run), "--no-progress", env=env)
    evaluated = run_cli("evaluate", str(run), env=env)
    metrics = json.loads((run / "eval" / "metrics.json").read_text())
    assert "one-step nRMSE" in evaluated.stdout and 0 < metrics["one_step_nrmse"] < 10
    assert len(metrics["rollout_nrmse"]) == 5

    inspected = run_cli("inspect", str(data), env=env)
    assert inspected.stdout.splitlines()[0] == CODE_LINE, inspected.stdout
    verified = run_cli("verify", str(data), "--samples", "1", env=env)
    assert verified.stdout.splitlines()[0] == CODE_LINE, verified.stdout
    assert "OK:" in verified.stdout
    # Without the user's package: inspect (which runs no system code) still validates the folder and says
    # which code it names; verify, which would run it, stops with one line saying where it would come from.
    alone = run_cli("inspect", str(data))
    assert alone.stdout.splitlines()[0].startswith(f"system code: {NAME} (not found here; it would come")
    assert alone.stdout.strip().endswith("valid")
    missing = run_cli("verify", str(data), "--samples", "1", check=False)
    assert missing.stdout.splitlines()[0] == alone.stdout.splitlines()[0]
    assert missing.returncode == 2 and missing.stderr.count("error:") == 1
    assert "pip install swift_hohenberg" in missing.stderr, missing.stderr


def test_generate_train_evaluate_through_the_api(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, one_thread: None
) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    sim = dynaforge.simulate(CONFIG, n=2, split="test")
    data = dynaforge.api.generate(CONFIG, tmp_path / "data", progress=False)
    dynaforge.api.train(CONFIG, data, tmp_path / "run", progress=False)
    run = dynaforge.load_run(tmp_path / "run")
    result = run.evaluate()
    assert run.config.system.name == NAME and type(run.config.system).__name__ == "SwiftHohenbergConfig"
    assert sim.fields.shape == data.split("test").fields[:2].shape
    assert len(result.metrics["rollout_nrmse"]) == 5 and result.report.exists()


def refused(name: str, tmp_path: Path) -> str:
    """The one `error:` line of `dynaforge generate` for `system.name=NAME` (with tmp_path on the path)."""
    result = run_cli(
        "generate",
        str(CONFIG),
        f"system.name={name}",
        "--out",
        str(tmp_path / "out"),
        check=False,
        env=with_examples(str(tmp_path)),
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert not (tmp_path / "out").exists()
    return lines[0]


@pytest.mark.parametrize(
    ("name", "says"),
    [
        ("os:system", ["a function", "package 'os'", "SystemBase"]),
        ("collections:OrderedDict", ["a class (collections.OrderedDict)", "package 'collections'"]),
        ("nosuchpkg.pdes:SwiftHohenberg", ["cannot import 'nosuchpkg.pdes'", "pip install nosuchpkg"]),
        ("swift_hohenberg:NoSuchSystem", ["has no 'NoSuchSystem'", "package 'swift_hohenberg'"]),
        ("swift_hohenberg:SwiftHohenbergConfig", ["a class", "not a dynaforge system"]),
        ("not a path", ["unknown system", "package.module:Class"]),
    ],
)
def test_an_import_path_that_is_no_system_is_refused_with_one_line(
    name: str, says: list[str], tmp_path: Path
) -> None:
    line = refused(name, tmp_path)
    assert all(part in line for part in says), line


def test_nothing_of_a_refused_object_is_called(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    marker = tmp_path / "ran"
    (tmp_path / "sneaky.py").write_text(
        "from pathlib import Path\n\n"
        f"def system(*args, **kwargs):\n    Path({str(marker)!r}).write_text('ran')\n\n"
        "class Meta(type):\n"
        f"    def __call__(cls, *args, **kwargs):\n        Path({str(marker)!r}).write_text('ran')\n\n"
        "class NotASystem(metaclass=Meta):\n    config_class = None\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the config's own system, named before the override
    for name in ("sneaky:system", "sneaky:NotASystem"):
        with pytest.raises(ConfigError, match="not a dynaforge system"):
            load_config(CONFIG, [f"system.name={name}"])
        assert not marker.exists()
    assert "package 'sneaky'" in refused("sneaky:system", tmp_path) and not marker.exists()


@pytest.mark.parametrize(
    ("source", "says"),
    [
        ("def broken(:\n", ["SyntaxError", "broken_pdes.py:1"]),
        ("import math\n\nvalue = 1 / 0\n", ["ZeroDivisionError", "broken_pdes.py:3"]),
    ],
)
def test_a_user_module_that_fails_to_import_is_its_packages_fault_in_one_line(
    source: str, says: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "broken_pdes.py").write_text(source)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.syspath_prepend(str(EXAMPLES))  # the config's own system, named before the override
    with pytest.raises(ConfigError) as raised:
        load_config(CONFIG, ["system.name=broken_pdes:System"])
    message = str(raised.value)
    assert all(part in message for part in [*says, "package 'broken_pdes'", "not in dynaforge"]), message


def test_a_user_system_builds_like_a_builtin(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(EXAMPLES))
    system = build_system(load_config(CONFIG).system)
    assert system.name == "swift_hohenberg" and system.parameter_names == ("domain_length", "r", "g2")


def test_a_system_with_no_way_to_make_rows_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A `SystemBase` subclass with neither `sample_rows` nor `draw_samples` + `rollout` is a config error
    naming the class and what it lacks, not an AttributeError from inside dynaforge."""
    (tmp_path / "half_pdes.py").write_text(
        "from dynaforge.systems.base import SystemBase\n"
        "from swift_hohenberg import SwiftHohenberg\n"
        "class Half(SwiftHohenberg):  # the base's row making, with no way to draw samples\n"
        "    draw_samples = None\n"
        "    sample_rows = SystemBase.sample_rows\n"
    )
    monkeypatch.syspath_prepend(str(EXAMPLES))
    monkeypatch.syspath_prepend(str(tmp_path))
    config = load_config(CONFIG, ["system.name=half_pdes:Half"])
    system = build_system(config.system)
    with pytest.raises(ConfigError, match="half_pdes:Half defines neither sample_rows nor draw_samples:"):
        system.sample_rows(Rows("train", 0, 2, 0), torch.device("cpu"))
