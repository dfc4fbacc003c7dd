"""The CLI's torch thread count: OMP_NUM_THREADS if set, the count a resumed run started with, else the
cores other processes leave free. It never writes the environment."""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from dynaforge import cli


@pytest.fixture
def no_torch_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    # The choice is made for a fresh `dynaforge` process; in this test process torch is already imported.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.usefixtures("no_torch_yet")
@pytest.mark.parametrize(("load", "expected"), [(0.2, 4), (1.1, 3), (2.6, 1), (9.0, 1)])
def test_threads_leave_the_busy_cores_alone(
    monkeypatch: pytest.MonkeyPatch, load: float, expected: int
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    threads, _ = cli.choose_threads()
    assert threads == expected
    assert "OMP_NUM_THREADS" not in os.environ


@pytest.mark.usefixtures("no_torch_yet")
def test_users_thread_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    assert cli.choose_threads() == (None, "OMP_NUM_THREADS=4")


@pytest.mark.usefixtures("no_torch_yet")
def test_a_resumed_run_keeps_the_count_it_started_with(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))  # load would say 1 thread
    run = tmp_path / "run"
    run.mkdir()
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "header", "torch_threads": 2}) + "\n")
    threads, reason = cli.choose_threads(run)
    assert threads == 2 and "started with" in reason
    assert cli.choose_threads(tmp_path / "no-run")[0] == 1
    args = cli.build_parser().parse_args(["train", "c.yaml", "--data", "d", "--out", str(run), "--resume"])
    assert cli.resumed_run(args) == run
    args = cli.build_parser().parse_args(["run", "c.yaml", "--out", str(tmp_path)])
    assert cli.resumed_run(args) == tmp_path / "run"


def test_a_python_program_keeps_its_own_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert cli.choose_threads()[0] is None  # torch is loaded in this process
