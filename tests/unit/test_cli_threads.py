"""The CLI makes idle OpenMP threads sleep (OMP_WAIT_POLICY=passive) unless the user chose a policy."""

from __future__ import annotations

import os

import pytest

from dynaforge.cli import main


def test_cli_defaults_the_openmp_wait_policy_to_passive(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ["OMP_WAIT_POLICY"] == "passive"


def test_cli_keeps_the_users_openmp_wait_policy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OMP_WAIT_POLICY", "active")
    with pytest.raises(SystemExit):
        main(["--help"])
    assert os.environ["OMP_WAIT_POLICY"] == "active"
