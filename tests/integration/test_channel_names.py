"""Channels are named by what they hold (issue 39): a Navier-Stokes dataset stores vorticity as `vorticity`,
its report's colour bars and captions say so, and a dataset written when the channel was called `u` still
opens, trains and evaluates, its report naming the vorticity too.

Each test runs the tiny Navier-Stokes preset (32 x 32, seconds), recording the label of every colour
bar the evaluation draws.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h5py
import pytest
import torch
from matplotlib.figure import Figure

from dynaforge.cli import main
from dynaforge.systems.pde.navier_stokes import NavierStokes2D

PRESET = Path(__file__).resolve().parents[2] / "configs" / "ns2d-tiny.yaml"


@pytest.fixture
def colorbar_labels(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """The label of every colour bar drawn while the test runs."""
    labels: list[str] = []
    draw = Figure.colorbar

    def recording(self: Figure, mappable: Any, *args: Any, **kwargs: Any) -> Any:
        labels.append(str(kwargs.get("label", "")))
        return draw(self, mappable, *args, **kwargs)

    monkeypatch.setattr(Figure, "colorbar", recording)
    yield labels


def run_tiny(out: Path) -> None:
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert main(["-q", "run", str(PRESET), "--out", str(out), "--no-progress"]) == 0
    finally:
        torch.set_num_threads(previous)


def stored_names(data: Path) -> set[tuple[str, ...]]:
    """The channel names every shard records (its attribute and its `channel` dimension scale)."""
    names = set()
    for path in sorted(data.glob("*/*.h5")):
        with h5py.File(path, "r") as h5:
            names.add(tuple(str(n) for n in h5.attrs["channel_names"]))
            names.add(tuple(n.decode() if isinstance(n, bytes) else str(n) for n in h5["channel"][...]))
    return names


def check_report_names_vorticity(run: Path, labels: list[str]) -> None:
    field_labels = [label for label in labels if label]
    assert field_labels, "the evaluation drew no labelled colour bar"
    assert all("vorticity (nondimensional)" in label for label in field_labels), field_labels
    report = (run / "eval" / "report.html").read_text()
    assert "channel vorticity" in report and "channel u" not in report


def test_a_new_navier_stokes_dataset_names_its_channel_vorticity(
    tmp_path: Path, colorbar_labels: list[str]
) -> None:
    run_tiny(tmp_path)
    assert stored_names(tmp_path / "data") == {("vorticity",)}
    check_report_names_vorticity(tmp_path / "run", colorbar_labels)


def test_a_dataset_whose_vorticity_is_called_u_still_trains_and_evaluates(
    tmp_path: Path, colorbar_labels: list[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Write the dataset as former versions did (the default name `u`), then train and evaluate as today.
    with monkeypatch.context() as former:
        former.setattr(NavierStokes2D, "channel_names", property(lambda self: ("u",)))
        assert main(["-q", "generate", str(PRESET), "--out", str(tmp_path / "data"), "--no-progress"]) == 0
    assert stored_names(tmp_path / "data") == {("u",)}
    run_tiny(tmp_path)  # finds the complete dataset: trains on it and evaluates
    assert stored_names(tmp_path / "data") == {("u",)}  # not regenerated
    assert (tmp_path / "run" / "checkpoints" / "best.pt").exists()
    check_report_names_vorticity(tmp_path / "run", colorbar_labels)
