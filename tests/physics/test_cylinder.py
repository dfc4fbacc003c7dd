"""Flow past a cylinder as a system (`dynaforge.systems.flow.cylinder`): it generates through the store, each
sample's cylinder is its own mask (where its params put it), the fluid inside is brought to rest, a sample is
the same bytes alone or in any batch and on any thread count, and a cylinder the channel cannot hold or a time
step above the stability bound is refused before anything is written. The DFG figures are
benchmarks/cylinder_dfg.py's."""

from __future__ import annotations

import contextlib
import io
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from physics_helpers import assert_same_bytes_in_any_batch, parameter_table

from dynaforge.config import load_config
from dynaforge.errors import ConfigError
from dynaforge.generate import generate
from dynaforge.store import DatasetFolder
from dynaforge.systems import build_system
from dynaforge.systems.flow.cylinder import CylinderFlow

PRESET = Path(__file__).resolve().parents[2] / "configs" / "cylinder.yaml"
TINY = ["system.resolution=16", "system.spin_up=4", "system.steps=4", "system.save_every=2"]
"""16 cells across (86 along), 8 steps: about 0.1 s a sample."""


def cylinder(*overrides: str) -> CylinderFlow:
    system = build_system(load_config(PRESET, [*TINY, *overrides]).system)
    assert isinstance(system, CylinderFlow)
    return system


def dfg_row(system: CylinderFlow, **changes: float) -> dict[str, float]:
    row = {"domain_length": 2.2, "reynolds": 100.0, "inflow_peak": 1.5, "centre_x": 0.2, "centre_y": 0.2}
    return row | {"radius": 0.05} | changes


def test_a_dataset_stores_each_samples_own_cylinder_as_the_obstacle_channel(
    tmp_path: Path, one_thread: None
) -> None:
    sizes = ["dataset.n_train=4", "dataset.n_val=1", "dataset.n_test=1", "dataset.shard_size=2"]
    config = load_config(PRESET, [*TINY, *sizes, "dataset.batch_size=2"])
    generate(config, tmp_path / "data", progress=False)
    folder = DatasetFolder(tmp_path / "data")
    stored = folder.read_split("train")
    fields = folder.split_frames("train").numpy()  # (4, 3, 3, 86, 16)
    params = stored.params
    system = cylinder()
    assert fields.shape == (4, 3, 3, *system.shape)
    assert folder.channel_names == ("u", "v", "obstacle")
    assert stored.param_names == system.parameter_names
    obstacle = fields[:, :, 2]
    assert np.array_equal(obstacle, np.broadcast_to(obstacle[:, :1], obstacle.shape))  # fixed in time
    assert all(not np.array_equal(obstacle[0, 0], obstacle[i, 0]) for i in (1, 2, 3))  # its own per sample
    h = config.system.spacing
    x = (np.arange(system.shape[0]) + 0.5) * h
    y = (np.arange(system.shape[1]) + 0.5) * h
    names = list(system.parameter_names)
    for chi, row in zip(obstacle[:, 0], params, strict=True):
        cx, cy, r = (row[names.index(k)] for k in ("centre_x", "centre_y", "radius"))
        area = chi.sum() * h * h
        # The mask's area and centroid are the disc's up to the grid: the default ramp is a quarter cell wide,
        # nearly a staircase (measured over 200 discs of the preset's ranges on this grid, r / h = 1.6 to 2.3:
        # area -12% to +28%, centroid within 0.24 h; with a one-cell ramp +0.6% to +5.5% and 0.048 h).
        assert area == pytest.approx(math.pi * r * r, rel=0.35)
        assert (chi * x[:, None]).sum() * h * h / area == pytest.approx(cx, abs=0.3 * h)
        assert (chi * y[None, :]).sum() * h * h / area == pytest.approx(cy, abs=0.3 * h)
    assert np.abs(fields[:, :, :2]).max() < 4.0 and np.abs(fields[:, -1, 1]).max() > 0  # it moved, finitely


def test_the_fluid_inside_the_cylinder_is_brought_to_rest(one_thread: None) -> None:
    system = cylinder("system.resolution=41", "system.dt=0.003", "system.spin_up=100", "system.steps=2")
    fields = system.rollout(parameter_table(system, [dfg_row(system)])).fields[0, -1]
    inside = fields[2] == 1
    # DFG geometry, 41 cells across, t = 0.3. Measured where chi = 1 at the cell centres (76 cells): mean |u|
    # 0.014, max 0.085, against the mean inflow 1 (mean |u| 1.02 in the fluid).
    assert float(fields[0][inside].abs().mean()) < 0.03
    assert float(fields[0][fields[2] == 0].abs().mean()) > 0.5


@pytest.mark.reproducibility
def test_a_sample_is_the_same_bytes_alone_in_any_batch_and_on_any_thread_count() -> None:
    # 16 x 86 runs in blocks of 4: samples land at other places of a block, in other blocks, and alone.
    system = cylinder("system.radius={low: 0.03, high: 0.06}")
    assert system.block_samples(torch.device("cpu")) == 4
    rows = [dfg_row(system, centre_x=0.2 + 0.01 * i, radius=0.03 + 0.003 * i) for i in range(7)]
    params = parameter_table(system, rows)
    assert_same_bytes_in_any_batch(system, params, alone=(0, 4, 6))


REFUSALS = {
    "closes the channel": (["system.radius=0.19"], r"system\.radius up to 0\.19 closes the channel"),
    "touches a wall": (["system.centre_y={low: 0.06, high: 0.2}"], r"system\.centre_y .* touch a wall"),
    "covers the inflow": (["system.centre_x={low: 0.05, high: 0.2}"], r"system\.centre_x\.low >= "),
    "reaches the outflow": (["system.centre_x={low: 0.2, high: 2.15}"], r"system\.centre_x\.high <= "),
    "time step": (["system.dt=0.02"], r"system\.dt=0\.02 is above .* set system\.dt <= 0\.01"),
    "several lengths": (["system.domain_length={low: 2, high: 3}"], r"give one value"),
}


@pytest.mark.parametrize("case", sorted(REFUSALS))
def test_bad_input_is_refused_naming_the_key_and_the_fix_before_anything_is_written(
    case: str, tmp_path: Path
) -> None:
    from dynaforge.cli import main

    overrides, message = REFUSALS[case]
    with pytest.raises(ConfigError, match=message):
        load_config(PRESET, [*TINY, *overrides])
    out = io.StringIO()
    args = ["generate", str(PRESET), *TINY, *overrides, "--out", str(tmp_path / "data"), "--no-progress"]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = main(args)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("error:")]
    assert code == 2 and len(lines) == 1, out.getvalue()
    assert not (tmp_path / "data").exists()


def test_the_largest_safe_time_step_is_accepted_and_a_little_more_is_not() -> None:
    largest = cylinder().config.largest_stable_dt()
    cylinder(f"system.dt={largest}")
    with pytest.raises(ConfigError, match=rf"system\.dt <= {largest:.4g}"):
        cylinder(f"system.dt={largest * 1.01}")


def test_the_covered_fraction_mask_has_the_discs_area() -> None:
    from dynaforge.systems.flow.channel import Discs, disc_fractions

    one = lambda value: torch.full((1, 1, 1), value, dtype=torch.float64)  # noqa: E731
    h = 0.41 / 41
    mask_u, mask_v, cells = disc_fractions(220, 41, h, Discs(one(0.2), one(0.2), one(0.05)))
    # Measured: the three masks' areas 0.99949 of pi r^2 (8 x 8 points per control volume), values in [0, 1].
    for mask in (mask_u, mask_v, cells):
        assert float(mask.sum()) * h * h == pytest.approx(math.pi * 0.05**2, rel=2e-3)
        assert float(mask.min()) == 0.0 and float(mask.max()) == 1.0


def test_metrics_ignore_the_cells_inside_an_obstacle() -> None:
    from dynaforge.evaluate.rollout import Predictions
    from dynaforge.evaluate.suite import MetricSettings, score_predictions

    generator = torch.Generator().manual_seed(0)
    truth = torch.rand((2, 3, 3, 12, 8), generator=generator)
    chi = torch.zeros((12, 8))
    chi[3:6, 2:5] = 1.0
    truth[:, :, 2] = chi
    inside = chi.bool().expand_as(truth[:, :, 0])
    wrong_inside = truth.clone()
    wrong_inside[:, :, 0][inside] += 5.0
    wrong_outside = truth.clone()
    wrong_outside[:, :, 0][~inside] += 5.0
    settings = MetricSettings(lengths=(1.0, 1.0), obstacle_channel=2)
    for name in ("rmse", "nrmse", "max_error"):
        assert score_predictions(Predictions(wrong_inside, truth), settings)[name] == 0.0
        assert score_predictions(Predictions(wrong_outside, truth), settings)[name] > 0.1
        assert (
            score_predictions(Predictions(wrong_inside, truth), settings._replace(obstacle_channel=None))[
                name
            ]
            > 0.1
        )


def test_averaged_metrics_average_over_the_fluid_cells_and_leave_the_mask_channel_out() -> None:
    """An error of exactly 1 at every fluid cell of u and v scores RMSE 1 and, against a truth of 1 in the
    fluid, nRMSE 1: counting the 15 obstacle cells (of 96) would give sqrt(81/96) = 0.92 for the RMSE, the
    obstacle's truth of 3 would lower the nRMSE to 0.60, and scoring the held mask channel (error 0) would
    average in a third channel at 0."""
    from dynaforge.evaluate.rollout import Predictions, Rollouts
    from dynaforge.evaluate.suite import MetricSettings, score_predictions, score_rollouts

    chi = torch.zeros((12, 8))
    chi[3:6, 2:7] = 1.0
    inside = chi.bool()
    truth = torch.ones((2, 4, 3, 12, 8))
    truth[:, :, :2, inside] = 3.0  # what the flow holds inside the obstacle does not count
    truth[:, :, 2] = chi
    generator = torch.Generator().manual_seed(0)
    signs = torch.randint(0, 2, (2, 4, 2, 12, 8), generator=generator).float() * 2 - 1
    predicted = truth.clone()
    predicted[:, :, :2] = truth[:, :, :2] + signs  # +-1 everywhere, obstacle cells included
    settings = MetricSettings(lengths=(1.0, 1.0), obstacle_channel=2)
    scores = score_predictions(Predictions(predicted, truth), settings)
    assert scores["rmse"] == pytest.approx(1.0, rel=1e-6)
    assert scores["nrmse"] == pytest.approx(1.0, rel=1e-6)
    assert scores["max_error"] == pytest.approx(1.0, rel=1e-6)
    rolled = score_rollouts(Rollouts(truth[:, :1], predicted, truth), settings)
    assert rolled["curves"]["nrmse"] == pytest.approx([1.0] * 4, rel=1e-6)
    assert rolled["sample_nrmse"] == pytest.approx([1.0, 1.0], rel=1e-6)
    # A correlation over the fluid: a prediction a * truth + b there (anything inside) correlates fully.
    varied = truth.clone()
    varied[:, :, :2] = torch.rand((2, 4, 2, 12, 8), generator=generator)
    varied[:, :, :2, inside] = 0.0
    affine = 2.0 * varied + 1.0
    affine[:, :, :2, inside] = -50.0
    correlated = score_predictions(Predictions(affine, varied), settings)
    assert correlated["correlation"] == pytest.approx(1.0, abs=1e-6)
    unmasked = score_predictions(Predictions(affine, varied), settings._replace(obstacle_channel=None))
    assert unmasked["correlation"] < 0.9  # the obstacle cells would break it
