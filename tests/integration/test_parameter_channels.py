"""Coefficients as input channels (`data.parameter_channels`, issue 36): a mixture stream appends each
trajectory's named parameters as constant channels (0 for a member without one), the model holds them and
records their names, a run fine-tuned from it on a stored dataset gets the same channels, evaluation cuts
them off, and a misspelt name is refused with one `error:` line before anything is written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.data.boundary import stored_fields_with_boundary
from dynaforge.data.mixture import mixture_plan
from dynaforge.models.loading import load_surrogate
from dynaforge.seeds import Rows

REPO = Path(__file__).resolve().parents[2]
MIXTURE = str(REPO / "tests" / "unit" / "mixture_tiny.yaml")
TINY = str(REPO / "configs" / "tiny.yaml")
CHANNELS = "data.parameter_channels=[viscosity,diffusivity]"
CPU = torch.device("cpu")


def test_the_stream_appends_each_members_coefficients_and_zero_where_it_has_none() -> None:
    plain = mixture_plan(load_config(MIXTURE))
    plan = mixture_plan(load_config(MIXTURE, [CHANNELS]))
    rows = plan.rows("train", 0, 12, CPU)
    assert rows.shape[2] == 1 + 2
    assert torch.equal(rows[:, :, :1], plain.rows("train", 0, 12, CPU))  # the physical fields unchanged
    which = plan.members_of("train", 0, 12)
    assert set(which.tolist()) == {0, 1}
    for j, s in enumerate(which.tolist()):
        member = plan.members[s]
        k = int(plan.counts_before("train", j)[s])
        params = member.system.sample_rows(Rows("train", k, k + 1, member.base_seed), CPU).params[0]
        values = dict(zip(member.system.parameter_names, params.tolist(), strict=True))
        expected = [values.get("viscosity", 0.0), values.get("diffusivity", 0.0)]
        # constant in space and time, the sample's own value (float32), 0 for the parameter it lacks
        for c, value in enumerate(expected):
            assert torch.equal(rows[j, :, 1 + c], torch.full_like(rows[j, :, 1 + c], np.float32(value)))
    assert (rows[which == 0, :, 2] == 0).all() and (rows[which == 0, :, 1] > 0).all()  # Burgers: viscosity
    assert (rows[which == 1, :, 1] == 0).all() and (rows[which == 1, :, 2] > 0).all()  # heat: diffusivity


def test_stored_fields_get_the_same_channels_zero_for_a_missing_coefficient() -> None:
    fields = np.zeros((2, 3, 4, 1), dtype=np.float32)  # (N, T, X, C)
    params = np.array([[1.0, 0.02], [1.0, 0.05]])
    out = stored_fields_with_boundary(
        fields, params, ["domain_length", "viscosity"], (), ["viscosity", "diffusivity"]
    )
    assert out.shape == (2, 3, 4, 3)
    assert np.array_equal(
        out[:, :, :, 1], np.broadcast_to(np.float32([0.02, 0.05])[:, None, None], (2, 3, 4))
    )
    assert not out[..., 2].any()


@pytest.fixture(scope="module")
def conditioned(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One epoch on the tiny Burgers + heat mixture, told each trajectory's viscosity and diffusivity."""
    out = tmp_path_factory.mktemp("conditioned") / "run"
    assert main(["train", MIXTURE, CHANNELS, "train.epochs=1", "--out", str(out), "--no-progress"]) == 0
    return out


def test_the_model_holds_and_names_its_coefficient_channels(conditioned: Path) -> None:
    loaded = load_surrogate(conditioned)
    assert loaded.shape.parameters == ("viscosity", "diffusivity")
    assert loaded.shape.channels == 3 and loaded.shape.held == (1, 2)
    assert loaded.normalizer.channels == 3
    assert loaded.shape.predicted_channels == (0,)


@pytest.fixture(scope="module")
def tuned(conditioned: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The conditioned run fine-tuned on stored Burgers trajectories (which have no `diffusivity`), with
    the same channels, and evaluated: (run, data)."""
    root = tmp_path_factory.mktemp("tuned")
    data, out = root / "burgers", root / "run"
    grid = ["system.resolution=32", "dataset.n_train=4", "dataset.n_val=2", "dataset.n_test=2"]
    assert main(["generate", TINY, *grid, "--out", str(data), "--no-progress"]) == 0
    args = ["train", TINY, *grid, CHANNELS, "train.epochs=1", "--data", str(data)]
    assert main([*args, "--from", str(conditioned), "--out", str(out), "--no-progress"]) == 0
    assert main(["evaluate", str(out), "--data", str(data)]) == 0
    return out, data


def test_fine_tuning_on_a_stored_system_with_the_same_channels_then_evaluating(
    tuned: tuple[Path, Path],
) -> None:
    out, _ = tuned
    assert load_surrogate(out).shape.parameters == ("viscosity", "diffusivity")
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    assert all(np.isfinite(metrics["rollout_nrmse"])) and np.isfinite(metrics["one_step_nrmse"])


def test_the_conditioned_run_exports_and_rolls_out_under_onnxruntime_as_evaluated(
    tuned: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from dynaforge.export.onnx_rollout import rollout_onnx  # with the optional export extra only

    out, data = tuned
    onnx_path = tmp_path / "model.onnx"
    assert main(["-q", "export", str(out), "--out", str(onnx_path)]) == 0
    metrics = json.loads((out / "eval" / "metrics.json").read_text())
    result = rollout_onnx(onnx_path, data, frames=len(metrics["rollout_nrmse"]))
    assert result.predicted.shape[2] == 1  # the coefficient channels are not scored
    np.testing.assert_allclose(result.nrmse, metrics["rollout_nrmse"], rtol=1e-4)


def test_fine_tuning_without_the_pretrained_channels_is_refused(
    conditioned: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = tmp_path / "burgers"
    grid = ["system.resolution=32", "dataset.n_train=2", "dataset.n_val=1", "dataset.n_test=1"]
    assert main(["generate", TINY, *grid, "--out", str(data), "--no-progress"]) == 0
    out = tmp_path / "tuned"
    args = ["train", TINY, *grid, "train.epochs=1", "--data", str(data), "--from", str(conditioned)]
    assert main([*args, "--out", str(out), "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "data.parameter_channels" in err
    assert not out.exists()


def test_a_misspelt_coefficient_is_refused_with_one_line_and_nothing_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    code = main(["train", MIXTURE, "data.parameter_channels=[viscosty]", "--out", str(out), "--no-progress"])
    assert code == 2
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and "viscosty" in err and "viscosity" in err
    assert not out.exists()
