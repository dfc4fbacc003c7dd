"""The bounded systems keep the guarantees of every other family: the same config and seed give the same bytes
whatever the batch size, the shard split and the thread count (the variants of test_reproducibility.py), and
`dynaforge verify` regenerates their samples identically; bad boundary input is one `ConfigError` naming the fix."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from dynaforge.config import Config, load_config
from dynaforge.errors import ConfigError
from dynaforge.generate import generate
from dynaforge.systems.bounded.core import Grid, integrate
from dynaforge.systems.registry import build_system

from ..conftest import CONFIGS
from .test_reproducibility import SPLIT_SIZES, VARIANTS, dataset_arrays, threads, verify  # noqa: F401

BOUNDED = {
    # 1D, time-dependent Dirichlet on the left and a Neumann flux on the right, float32
    "heat_bounded_1d": (CONFIGS / "heat_bounded_1d.yaml", ["system.resolution=33", "system.steps=40"]),
    # 2D, parabolic inflow, outflow, walls; float64
    "advection_diffusion_bounded_2d": (
        CONFIGS / "advection_diffusion_bounded_2d.yaml",
        ["system.resolution=17", "system.steps=20", "system.dtype=float64"],
    ),
    # 2D Burgers (the 2D preset's sides, its advection keys swapped for a viscosity) and 1D Fisher-KPP
    "burgers_bounded_2d": (
        CONFIGS / "advection_diffusion_bounded_2d.yaml",
        ["system.resolution=17", "system.steps=20"],
    ),
    # heat stepped exactly in time (sine/cosine eigenbasis, FFTs): 1D with the preset's sides, 2D with
    # insulated bottom and top
    "heat_bounded_exact_1d": (
        CONFIGS / "heat_bounded_1d.yaml",
        ["system.resolution=33", "system.steps=40", "system.time_stepping=exact"],
    ),
    "heat_bounded_exact_2d": (
        CONFIGS / "heat_bounded_1d.yaml",
        [
            "system.ndim=2",
            "system.resolution=17",
            "system.steps=40",
            "system.time_stepping=exact",
            "system.boundary.bottom.kind=neumann",
            "system.dtype=float64",
        ],
    ),
    # the same, Chebyshev collocation: 1D float32 with the preset's sides; 2D with a Neumann bottom (a
    # Neumann-Neumann corner with the flux on the right)
    "heat_bounded_chebyshev_1d": (
        CONFIGS / "heat_bounded_1d.yaml",
        [
            "system.resolution=17",
            "system.steps=40",
            "system.time_stepping=exact",
            "system.discretisation=chebyshev",
        ],
    ),
    "heat_bounded_chebyshev_2d": (
        CONFIGS / "heat_bounded_1d.yaml",
        [
            "system.ndim=2",
            "system.resolution=12",
            "system.steps=40",
            "system.time_stepping=exact",
            "system.discretisation=chebyshev",
            "system.boundary.bottom.kind=neumann",
        ],
    ),
    "fisher_kpp_bounded_1d": (
        CONFIGS / "heat_bounded_1d.yaml",
        [
            "system.name=fisher_kpp_bounded",
            "system.resolution=33",
            "system.steps=40",
            "system.reaction_rate=2.0",
        ],
    ),
}


def as_burgers(path: Path, folder: Path) -> Path:
    """The 2D preset as a Burgers preset, written to `folder`."""
    preset = yaml.safe_load(path.read_text())
    for key in ("diffusivity", "velocity_x", "velocity_y"):
        del preset["system"][key]
    preset["system"] |= {"name": "burgers_bounded", "viscosity": 0.05}
    out = folder / "burgers_bounded_2d.yaml"
    out.write_text(yaml.safe_dump(preset))
    return out


def bounded_config(family: str, batch: int, shard: int, folder: Path) -> Config:
    path, overrides = BOUNDED[family]
    if family == "burgers_bounded_2d":
        path = as_burgers(path, folder)
    sizes = [f"dataset.n_{split}={n}" for split, n in SPLIT_SIZES.items()]
    return load_config(
        path, [*overrides, *sizes, f"dataset.batch_size={batch}", f"dataset.shard_size={shard}"]
    )


@pytest.mark.reproducibility
@pytest.mark.parametrize("family", sorted(BOUNDED))
def test_bounded_generation_is_the_same_bytes_for_any_batch_size_shard_split_and_thread_count(
    family: str,
    tmp_path: Path,
    threads: None,  # noqa: F811
) -> None:
    made = {}
    for name, (batch, shard, n_threads) in VARIANTS.items():
        torch.set_num_threads(n_threads)
        root = tmp_path / name.replace(" ", "_").replace(",", "")
        generate(bounded_config(family, batch, shard, tmp_path), root, progress=False)
        made[name] = dataset_arrays(root)
    first_name, first = next(iter(made.items()))
    assert np.isfinite(first["train/fields"]).all() and first["train/fields"].std() > 0
    for name, arrays in made.items():
        for key, values in arrays.items():
            assert np.array_equal(values, first[key]), (
                f"{family}: {key} differs between '{first_name}' and '{name}'"
            )


@pytest.mark.reproducibility
@pytest.mark.parametrize("family", ["heat_bounded_1d", "heat_bounded_chebyshev_2d"])
def test_verify_regenerates_a_bounded_dataset_identically(family: str, tmp_path: Path) -> None:
    generate(bounded_config(family, 5, 3, tmp_path), tmp_path / "data", progress=False)
    code, out = verify(str(tmp_path / "data"), "--samples", "all")
    assert code == 0, out
    assert "OK: 15 sample(s) regenerated, all identical" in out


def test_float32_rollout_follows_float64_to_rounding() -> None:
    made = {}
    for dtype in ("float32", "float64"):
        config = load_config(CONFIGS / "heat_bounded_1d.yaml", [f"system.dtype={dtype}", "system.steps=100"])
        system = build_system(config.system)
        drawn = system.draw_samples([np.random.default_rng(seed) for seed in range(3)])
        made[dtype] = system.rollout(drawn.initial, drawn.params).fields.double()
    # measured: 1.6e-6 (|u| <= 1.2): float32 rounding over 100 steps
    assert (made["float32"] - made["float64"]).abs().max() < 1e-5


@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("system.dt=0.01", "the largest safe value is about 0.001583: set system.dt <= 0.00158"),
        (
            "system.boundary.right.kind=robin",
            "system.boundary.right.kind='robin' is not valid; choose one of",
        ),
        ("system.ndim=3", "heat_bounded supports ndim in (1, 2)"),
    ],
)
def test_bad_bounded_config_is_one_error_naming_the_fix(override: str, message: str) -> None:
    with pytest.raises(ConfigError) as error:
        load_config(CONFIGS / "heat_bounded_1d.yaml", [override])
    assert message in str(error.value)


def test_boundary_values_of_the_wrong_shape_are_refused_with_the_expected_shape() -> None:
    grid = Grid.build((9,), {"left": "dirichlet", "right": "neumann"}, torch.ones(2), torch.float64)
    u0 = torch.zeros((2, 1, 9), dtype=torch.float64)
    bad = {"left": torch.zeros((2, 1)), "right": torch.zeros((2, 9))}
    with pytest.raises(ConfigError, match=r"side 'right' must have shape \(2, 1\)"):
        integrate(u0, lambda s, t: s.laplacian(), grid, lambda t: bad, 1e-3, 1, 1, 3, lambda f, u: None)


def impose_plain(v: torch.Tensor, g: dict[str, torch.Tensor]) -> torch.Tensor:
    """`v` with left, bottom and top set to g, bottom and top first (the left side wins the corners)."""
    v = v.clone()
    v[..., :, 0], v[..., :, -1] = g["bottom"], g["top"]
    v[..., 0, :] = g["left"]
    return v


def plain_heat_step(v: torch.Tensor, dt: float, h: float, g: dict[str, torch.Tensor]) -> torch.Tensor:
    """One SSP-RK3 step of u_t = laplacian(u) on a square, written out of place with concatenated ghost
    layers (the form the in-place stepper replaced): left, bottom, top Dirichlet g, right Neumann g."""

    def rate(w: torch.Tensor) -> torch.Tensor:
        mirror = w[..., -2:-1, :] + (2 * h) * g["right"].unsqueeze(-2)
        ex = torch.cat([torch.zeros_like(w[..., :1, :]), w, mirror], dim=-2)
        ey = torch.cat([torch.zeros_like(w[..., :1]), w, torch.zeros_like(w[..., :1])], dim=-1)
        d2x = ex[..., 2:, :] - 2 * ex[..., 1:-1, :] + ex[..., :-2, :]
        d2y = ey[..., 2:] - 2 * ey[..., 1:-1] + ey[..., :-2]
        return (d2x + d2y) * (1 / h**2)

    v1 = impose_plain(v + dt * rate(v), g)
    v2 = impose_plain(0.75 * v + 0.25 * (v1 + dt * rate(v1)), g)
    return impose_plain(v / 3 + (2 / 3) * (v2 + dt * rate(v2)), g)


def test_the_in_place_stepper_gives_the_bytes_of_the_plain_out_of_place_step_and_leaves_its_input() -> None:
    n, batch, dt, steps = 9, 16, 1e-3, 5
    kinds = {"left": "dirichlet", "right": "neumann", "bottom": "dirichlet", "top": "dirichlet"}
    grid = Grid.build((n, n), kinds, torch.ones(batch), torch.float64)
    rng = np.random.default_rng(0)
    g = {side: torch.from_numpy(rng.standard_normal((batch, 1, n))) for side in kinds}
    u0 = torch.from_numpy(rng.standard_normal((batch, 1, n, n)))
    before = u0.clone()
    frames: list[torch.Tensor] = []
    write = lambda frame, u: frames.append(u.clone())  # noqa: E731
    integrate(u0, lambda s, t: s.laplacian(), grid, lambda t: g, dt, steps, 1, 3, write)
    assert torch.equal(u0, before)
    expected = impose_plain(u0, g)
    assert torch.equal(frames[0], expected)
    for frame in frames[1:]:
        expected = plain_heat_step(expected, dt, 1.0 / (n - 1), g)
        assert torch.equal(frame, expected)
