"""The CLI uses only the cores other processes leave free, unless the user set OMP_NUM_THREADS."""

from __future__ import annotations

import os
import sys

import pytest

from dynaforge import cli


@pytest.fixture
def no_torch_yet(monkeypatch: pytest.MonkeyPatch) -> None:
    # The choice is made before torch loads; in this test process torch is already imported.
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3}, raising=False)
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)


@pytest.mark.usefixtures("no_torch_yet")
@pytest.mark.parametrize(("load", "expected"), [(0.2, None), (1.1, "3"), (2.6, "1"), (9.0, "1")])
def test_threads_leave_the_busy_cores_alone(
    monkeypatch: pytest.MonkeyPatch, load: float, expected: str | None
) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (load, load, load))
    cli.share_busy_cores()
    assert os.environ.get("OMP_NUM_THREADS") == expected


@pytest.mark.usefixtures("no_torch_yet")
def test_users_thread_count_is_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getloadavg", lambda: (3.0, 3.0, 3.0))
    monkeypatch.setenv("OMP_NUM_THREADS", "4")
    cli.share_busy_cores()
    assert os.environ["OMP_NUM_THREADS"] == "4"
