"""The N-body verbs end to end on the tiny preset: generate + inspect, train, simulate."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from dynaforge.cli import main
from dynaforge.config import load_config
from dynaforge.seeds import sample_rng, sample_seed
from dynaforge.store.reader import DatasetFolder
from dynaforge.systems import build_system
from dynaforge.systems.nbody.initial import orbital_elements
from dynaforge.systems.nbody.system import channels_to_state

TINY = str(Path(__file__).resolve().parents[2] / "configs" / "nbody_tiny.yaml")


def test_generate_stores_bodies_and_channels(tmp_path: Path) -> None:
    out = tmp_path / "data"
    assert main(["-q", "generate", TINY, "--out", str(out), "--no-progress"]) == 0
    assert main(["-q", "inspect", str(out)]) == 0
    split = DatasetFolder(out).read_split("train")
    assert split.fields.shape == (4, 11, 2, 6)  # (N, T, bodies, x y z vx vy vz)
    assert split.coords["body"].shape == (4, 2)
    names = list(split.param_names)
    m = split.params[:, [names.index("mass_0"), names.index("mass_1")]]
    # The stored trajectories keep each orbit's eccentricity (float32 storage).
    rel_x = split.fields[..., 1, :3] - split.fields[..., 0, :3]
    rel_v = split.fields[..., 1, 3:] - split.fields[..., 0, 3:]
    _, e = orbital_elements(rel_x.astype(np.float64), rel_v.astype(np.float64), m.sum(1)[:, None])
    expected = np.broadcast_to(split.params[:, [names.index("eccentricity")]], e.shape)
    np.testing.assert_allclose(e, expected, rtol=0, atol=1e-4)  # adaptive steps, eta = 0.01: ~3e-5 measured
    # Initial conditions read back from the store are the drawn ones (to float32 storage).
    stored = DatasetFolder(out).initial_states("val")  # (N, 6, bodies): x, y, z, vx, vy, vz per body
    state = channels_to_state(stored.initial)
    x, v = state.positions.numpy(), state.velocities.numpy()
    params, param_names = stored.params.numpy(), DatasetFolder(out).read_split("val").param_names
    config = load_config(TINY)
    drawn_params, drawn = build_system(config.system).draw_samples(
        [sample_rng(sample_seed(config.dataset.seed, "val", i)) for i in range(2)]
    )
    np.testing.assert_array_equal(params, drawn_params.numpy())
    np.testing.assert_allclose(x, drawn[:, :3].transpose(1, 2).numpy(), rtol=1e-7, atol=1e-7)
    np.testing.assert_allclose(v, drawn[:, 3:].transpose(1, 2).numpy(), rtol=1e-7, atol=1e-7)
    assert param_names == tuple(names)


def test_train_then_simulate_with_every_controller(tmp_path: Path) -> None:
    run = tmp_path / "ctrl"
    assert main(["-q", "nbody", "train", TINY, "--out", str(run), "--threads", "1"]) == 0
    assert (run / "checkpoints" / "last.pt").exists() and (run / "metrics.jsonl").read_text()
    for controller in ("fixed", "adaptive", "learned"):
        out = tmp_path / controller
        args = ["-q", "nbody", "simulate", TINY, "--out", str(out), "--controller", controller]
        args += ["--model", str(run)] if controller == "learned" else []
        assert main([*args, "--systems", "2", "--animation", "gif", "--frames", "5", "--threads", "1"]) == 0
        summary = json.loads((out / "invariants.json").read_text())
        assert summary["controller"]["kind"] == controller
        for system in summary["systems"]:
            assert system["reached_end"] and system["steps"] > 0
            assert system["max_relative_drift"]["momentum"] < 1e-12
        for name in ("energy_error", "momentum", "angular_momentum", "dt", "orbit"):
            assert (out / f"{name}.png").stat().st_size > 1000
        assert (out / "animation.gif").stat().st_size > 1000


def test_learned_controller_without_a_model_is_a_clear_error(tmp_path: Path, capsys) -> None:
    code = main(["nbody", "simulate", TINY, "--out", str(tmp_path), "--controller", "learned"])
    assert code == 2
    assert "system.control.model=RUN" in capsys.readouterr().err
