"""Random CNN operators: sampling, exact reconstruction, grouped vs straightforward, features, store."""

from __future__ import annotations

import math

import h5py
import numpy as np
import pytest
import torch

from dynaforge import machine as machine_module
from dynaforge.config import ParameterSpec, load_config
from dynaforge.generate import generate
from dynaforge.seeds import Rows, sample_seed
from dynaforge.store import DatasetFolder, validate_dataset
from dynaforge.systems import build_system
from dynaforge.systems.random_cnn import grouped as grouped_module
from dynaforge.systems.random_cnn.features import feature_names, trajectory_features
from dynaforge.systems.random_cnn.grouped import (
    GroupedOperators,
    build_group,
    generate_operators,
    grouped_rollout,
)
from dynaforge.systems.random_cnn.operator import (
    OperatorParams,
    architecture_of,
    noise_generator,
    operator_weights,
    periodic_pad,
    update_coefficients,
)
from dynaforge.systems.random_cnn.reference import RandomCNN, reference_rollout
from dynaforge.systems.random_cnn.sampling import centred_discrepancy, map_coordinate, sobol_points
from dynaforge.systems.random_cnn.system import RandomCNNSystem
from dynaforge.threads import one_intraop_thread, run_pieces

SMALL = [
    "system.name=random_cnn",
    "system.resolution=16",
    "system.steps=5",
    "system.space.depth.high=2",
    "system.space.width_cap.choices={'32': 1.0}",
    "system.compile=false",  # eager fused engine: fast tests; the compiled path has its own tests below
]


def small_system(*overrides: str) -> RandomCNNSystem:
    system = build_system(load_config(None, [*SMALL, *overrides]).system)
    assert isinstance(system, RandomCNNSystem)
    return system


def test_parameter_kinds_map_the_unit_interval() -> None:
    integer = ParameterSpec(kind="int", low=2.0, high=4.0)
    assert [map_coordinate(integer, q) for q in (0.0, 0.33, 0.34, 0.99)] == [2, 2, 3, 4]
    log_real = ParameterSpec(kind="real", low=1e-3, high=1e-1, log=True)
    assert math.isclose(map_coordinate(log_real, 0.5), 1e-2)
    choice = ParameterSpec(kind="choice", choices={"a": 1.0, "b": 3.0})
    assert [map_coordinate(choice, q) for q in (0.0, 0.24, 0.26, 0.99)] == [0, 0, 1, 1]
    flag = ParameterSpec(kind="bool", probability=0.2)
    assert [map_coordinate(flag, q) for q in (0.1, 0.3)] == [1.0, 0.0]


def test_sobol_points_do_not_depend_on_how_the_range_is_cut() -> None:
    whole = sobol_points(5, 0, 16, seed=3)
    parts = np.concatenate([sobol_points(5, 0, 5, seed=3), sobol_points(5, 5, 16, seed=3)])
    np.testing.assert_array_equal(whole, parts)
    assert ((whole >= 0) & (whole < 1)).all()
    assert not np.array_equal(whole, sobol_points(5, 0, 16, seed=4))  # the seed scrambles


def test_scrambled_sobol_is_more_uniform_than_random_points() -> None:
    rng = np.random.default_rng(0)
    sobol = centred_discrepancy(sobol_points(6, 0, 128, seed=1))
    random = np.mean([centred_discrepancy(rng.uniform(size=(128, 6))) for _ in range(5)])
    assert sobol < 0.5 * random, (sobol, random)


@pytest.mark.parametrize("precision", ["bfloat16", "float32"])
def test_an_operator_is_rebuilt_exactly_from_its_stored_parameters_and_seeds(precision: str) -> None:
    """Generate 4 operators together, then rebuild operator 2 alone from its row: same trajectory, bit for bit."""
    system = small_system(f"system.precision={precision}")
    m = system.config.realizations
    rows = system.sample_rows(Rows("val", 3 * m, 7 * m, base_seed=11), device=torch.device("cpu"))
    row = 2 * m + 1  # operator 5 of the split, realization 1
    op = OperatorParams.from_values(system.config.space, rows.params[row, :-1])
    operator, realization = int(rows.extras["operator"][row]), int(rows.extras["realization"][row])
    assert (operator, realization) == (5, 1)
    seed = int(rows.extras["operator_seed"][row])
    arch = architecture_of(op, system.channels)
    field, _ = system.initial_field(np.random.default_rng(seed))
    generators = [noise_generator(sample_seed(11, "val", r)) for r in range(operator * m, (operator + 1) * m)]
    group = build_group(arch, [op], [operator_weights(arch, op.weight_gain, seed)], system.config)
    # Generation runs each operator on one intra-op thread (`operators_one_at_a_time`); so does the rebuild.
    # On more threads oneDNN splits the convolutions elsewhere: on an AMD EPYC (AVX2, 2 threads) 61% of the
    # float32 values then differed in the last bit, so this line is what makes the rebuild exact.
    with one_intraop_thread():
        frames = grouped_rollout(
            group, torch.from_numpy(field).float()[None], [generators], system.config.steps
        )
    np.testing.assert_array_equal(frames[0, realization].numpy(), rows.fields[row].numpy())  # (T, C, X, Y)


@pytest.mark.parametrize("engine", ["fused", "grouped"])
def test_grouped_float32_matches_the_straightforward_loop(engine: str) -> None:
    system = small_system("system.precision=float32", f"system.engine={engine}")
    batch, *_ = system.build_operators("train", 0, 6, base_seed=2)
    states = [[g.get_state() for g in gens] for gens in batch.generators]
    fast = generate_operators(batch, system.config, torch.device("cpu"))
    for k, op in enumerate(batch.ops):
        for g, state in zip(batch.generators[k], states[k]):
            g.set_state(state)
        module = RandomCNN(architecture_of(op, system.channels), batch.layers[k])
        slow = reference_rollout(module, op, batch.initial[k], batch.generators[k], system.config.steps)
        for g, state in zip(batch.generators[k], states[k]):
            g.set_state(state)
        exact = reference_rollout(
            module.double(),
            op,
            batch.initial[k],
            batch.generators[k],
            system.config.steps,
            dtype=torch.float64,
        )
        scale = float(exact.abs().max())
        fast_error = float((fast[k].double() - exact).abs().max()) / scale
        slow_error = float((slow.double() - exact).abs().max()) / scale
        # Both float32 paths round differently; which one lands closer to the float64 trajectory depends on
        # summation order (and so on the thread count). The engine must be as accurate as the definition run
        # in float32: within twice its error, plus 16 float32 units for trajectories the definition happens
        # to hit almost exactly.
        assert fast_error <= 2 * slow_error + 16 * 2.0**-24, (k, fast_error, slow_error)


def test_bfloat16_agrees_with_float32_over_one_step_to_bfloat16_precision() -> None:
    bf16 = small_system("system.steps=1", "system.precision=bfloat16")
    fp32 = small_system("system.steps=1", "system.precision=float32")
    fast = generate_operators(bf16.build_operators("train", 0, 8, 0)[0], bf16.config, torch.device("cpu"))
    exact = generate_operators(fp32.build_operators("train", 0, 8, 0)[0], fp32.config, torch.device("cpu"))
    relative = (fast[:, :, 1] - exact[:, :, 1]).abs().amax(dim=(2, 3, 4)) / exact[:, :, 1].abs().amax(
        dim=(2, 3, 4)
    )
    # bf16 keeps 8 bits of mantissa (unit round-off 2^-9 ~ 0.2%); a few layers accumulate a few of them.
    assert float(relative.max()) < 0.03, relative
    assert float(relative.max()) > 0  # it did run in bf16


def test_out_of_memory_backs_off_and_gives_the_same_trajectories(monkeypatch: pytest.MonkeyPatch) -> None:
    system = small_system(
        "system.space.stem_width.choices={'16': 1.0}", "system.space.kernel_size.choices={'3': 1.0}"
    )
    expected = generate_operators(
        system.build_operators("train", 0, 6, 0)[0], system.config, torch.device("cpu"), grouped=True
    )
    real = grouped_rollout
    calls = []

    def flaky(group: GroupedOperators, *args, **kwargs):
        calls.append(group.k)
        if group.k > 1:
            real(group, *args, **kwargs)  # consume noise before failing, as a real OOM midway would
            raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 1 GB")
        return real(group, *args, **kwargs)

    monkeypatch.setattr(grouped_module, "grouped_rollout", flaky)
    got = generate_operators(
        system.build_operators("train", 0, 6, 0)[0], system.config, torch.device("cpu"), grouped=True
    )
    assert any(k > 1 for k in calls) and 1 in calls
    torch.testing.assert_close(got, expected, atol=0, rtol=0)


def test_features_of_known_fields() -> None:
    n, t = 32, 9
    x = torch.arange(n, dtype=torch.float32)
    mode = torch.sin(2 * math.pi * 3 * x / n)[:, None].expand(n, n)  # |m| = 3, variance 1/2
    growth = torch.exp(0.1 * torch.arange(t, dtype=torch.float32))  # energy grows as e^{0.2 t}
    frames = (growth[:, None, None, None] * mode).expand(1, t, 2, n, n).contiguous()
    features = dict(zip(feature_names(4), trajectory_features(frames, 4)[0].tolist()))
    assert abs(features["mean"]) < 1e-5
    assert abs(features["skewness"]) < 1e-4 and abs(features["kurtosis"] - 1.5) < 1e-3  # a sine: 3/2
    assert abs(features["energy_growth_rate"] - 0.2) < 1e-4
    assert features["spectrum_0"] > 0.999  # |m| = 3 lies in the first of 4 bins of [0, 16]
    # central differences of sin(k j): mean (sin(k) cos(k j))^2 = sin^2(k) / 2 at unit amplitude, times growth^2
    expected_gradient = (math.sin(2 * math.pi * 3 / n) ** 2 / 2) * float((growth**2).mean())
    assert abs(features["gradient_energy"] / expected_gradient - 1) < 1e-4


def test_random_cnn_dataset_is_identical_whatever_the_sharding(tmp_path) -> None:
    overrides = [
        *SMALL,
        "system.features=true",
        "dataset.n_train=18",
        "dataset.n_val=6",
        "dataset.n_test=0",
        "dataset.batch_size=6",
    ]
    one = load_config(None, [*overrides, "dataset.shard_size=18"])
    three = load_config(None, [*overrides, "dataset.shard_size=6"])
    generate(one, tmp_path / "one", progress=False)
    generate(three, tmp_path / "three", progress=False)
    assert validate_dataset(tmp_path / "three").ok
    a, b = (
        DatasetFolder(tmp_path / "one").read_split("train"),
        DatasetFolder(tmp_path / "three").read_split("train"),
    )
    np.testing.assert_array_equal(a.fields, b.fields)
    np.testing.assert_array_equal(a.params, b.params)
    assert a.fields.shape == (18, 6, 16, 16, 3)
    with h5py.File(tmp_path / "three" / "train" / "shard-00001.h5") as h5:
        np.testing.assert_array_equal(h5["operator"][...], np.repeat([2, 3], 3))
        np.testing.assert_array_equal(h5["realization"][...], np.tile([0, 1, 2], 2))
        assert h5["sobol"].shape == (6, 12) and h5["features"].shape == (6, 16)
        assert list(h5.attrs["feature_names"]) == list(feature_names(8))
        assert 0 < float(h5.attrs["centred_discrepancy"]) < 10  # of the 6 train operators, 12 dimensions


def test_rows_must_hold_whole_operators(tmp_path) -> None:
    from dynaforge.config import ConfigError

    config = load_config(
        None, [*SMALL, "dataset.n_train=4", "dataset.n_val=0", "dataset.n_test=0", "dataset.shard_size=4"]
    )
    with pytest.raises(ConfigError, match=r"multiples of system\.realizations"):
        generate(config, tmp_path / "d", progress=False)


ONE_ARCHITECTURE = [
    "system.space.depth.low=2",
    "system.space.stem_width.choices={'16': 1.0}",
    "system.space.kernel_size.choices={'3': 1.0}",
    "system.space.block.choices={residual: 1.0}",
    "system.space.norm.choices={group: 1.0}",
    "system.space.activation.choices={gelu: 1.0}",
]
"""Operators of a single architecture (16-32-32, residual, group norm, GELU): one compiled graph per precision."""
COMPILE_WARNING = "ignore:`torch.jit.script_method` is deprecated:DeprecationWarning"
"""Emitted by torch's own modules while inductor compiles; not ours to fix."""


def test_wrap_by_index_is_periodic_padding() -> None:
    from dynaforge.systems.random_cnn.fused import wrap_by_index

    h = torch.randn(2, 3, 7, 5, dtype=torch.float32)
    for k in (1, 3, 5):
        torch.testing.assert_close(wrap_by_index(h, k), periodic_pad(h, k), atol=0, rtol=0)
    assert torch.equal(periodic_pad(h, 3)[:, :, 0, 1:-1], h[:, :, -1])  # the row above row 0 is the last


@pytest.mark.filterwarnings(COMPILE_WARNING)
def test_compiled_fused_engine_rebuilds_exactly_and_agrees_with_eager_execution() -> None:
    """One compiled graph (bf16): the production path. Eagerly, the same step is checked against the
    definition in float32 (test_grouped_float32_matches_the_straightforward_loop)."""
    compiled = small_system(*ONE_ARCHITECTURE, "system.compile=true")
    m = compiled.config.realizations
    rows = compiled.sample_rows(Rows("train", 0, 4 * m, base_seed=5), device=torch.device("cpu"))
    # Operator 2 alone through the same compiled graph (one intra-op thread, as generation runs it): bit for
    # bit what the batch of 4 produced.
    batch, *_ = compiled.build_operators("train", 2, 3, base_seed=5)
    arch = architecture_of(batch.ops[0], compiled.channels)

    def rollout_alone(_: None) -> torch.Tensor:
        group = build_group(arch, batch.ops, batch.layers, compiled.config)
        return grouped_rollout(group, batch.initial, batch.generators, compiled.config.steps)

    (alone,) = run_pieces(rollout_alone, [None])
    np.testing.assert_array_equal(alone[0].numpy(), rows.fields[2 * m : 3 * m].numpy())
    # One step against eager execution of the same bf16 step and against the float32 definition.
    fields = rows.fields[:, 1].reshape(4, m, 3, 16, 16)
    for precision in ("bfloat16", "float32"):
        eager = small_system(*ONE_ARCHITECTURE, "system.steps=1", f"system.precision={precision}")
        one = generate_operators(
            eager.build_operators("train", 0, 4, 5)[0], eager.config, torch.device("cpu")
        )
        relative = (fields - one[:, :, 1]).abs().amax() / one[:, :, 1].abs().amax()
        assert 0 < float(relative) < 0.03, (precision, float(relative))


def test_update_coefficients_follow_each_policy() -> None:
    base = OperatorParams(2, 16, 32, 3, "conv", "group", "relu", 1.0, 0.01, "autoregressive", 0.2, 0.7)
    ops = [base, base._replace(policy="residual"), base._replace(policy="convex")]
    expected = torch.tensor([[0.0, 1.0, 0.01], [1.0, 0.2, 0.002], [0.7, 0.3, 0.003]], dtype=torch.float32)
    torch.testing.assert_close(update_coefficients(ops), expected)


@pytest.mark.parametrize("engine", ["fused", "grouped"])
def test_rollout_into_caller_buffers_equals_rollout_into_its_own(engine: str) -> None:
    """The trajectories written frame by frame into `out` are bit for bit those of the returned buffer."""
    system = small_system(f"system.engine={engine}", "system.space.kernel_size.choices={'3': 1.0}")
    batch, *_ = system.build_operators("train", 0, 2, base_seed=4)
    arch = architecture_of(batch.ops[0], system.channels)
    keep = [i for i, op in enumerate(batch.ops) if architecture_of(op, system.channels) == arch]
    states = [[g.get_state() for g in batch.generators[i]] for i in keep]
    group = build_group(arch, [batch.ops[i] for i in keep], [batch.layers[i] for i in keep], system.config)
    own = grouped_rollout(group, batch.initial[keep], [batch.generators[i] for i in keep], 4, save_every=2)
    for i, row in zip(keep, states):
        for g, state in zip(batch.generators[i], row):
            g.set_state(state)
    out = torch.full((len(keep), system.config.realizations, 3, 3, 16, 16), float("nan"), dtype=torch.float32)
    written = grouped_rollout(
        group, batch.initial[keep], [batch.generators[i] for i in keep], 4, save_every=2, out=list(out)
    )
    assert torch.equal(torch.stack(list(written)), out)  # the views of `out`, filled
    torch.testing.assert_close(out, own, atol=0, rtol=0)
    with pytest.raises(ValueError, match="out must hold"):
        grouped_rollout(group, batch.initial[keep], [batch.generators[i] for i in keep], 4, out=list(out))


@pytest.mark.parametrize("matrix_units", [True, False])
def test_auto_precision_is_bfloat16_only_with_bf16_matrix_units(
    matrix_units: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`auto` picks bf16 convolutions on AMX (or GPU tensor cores), float32 elsewhere (faster there:
    docs/random_cnn.md); an explicit precision is kept; the choice is recorded in the shard attributes."""
    monkeypatch.setattr(grouped_module, "has_bf16_matrix_units", lambda device: matrix_units)
    system = small_system()
    assert system.config.precision == "auto"
    expected = "bfloat16" if matrix_units else "float32"
    assert grouped_module.conv_precision(system.config, "cpu") == expected
    assert grouped_module.conv_dtype(system.config, "cpu") == getattr(torch, expected)
    assert system.shard_attributes("train", 3, 0)["conv_precision"] == expected
    for explicit in ("bfloat16", "float32"):
        assert (
            grouped_module.conv_precision(small_system(f"system.precision={explicit}").config, "cpu")
            == explicit
        )


def test_bf16_matrix_units_are_read_from_the_cpu_flags(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(machine_module, "cpu_flags", lambda: {"avx512f", "avx512_bf16", "amx_bf16"})
    assert machine_module.has_bf16_matrix_units("cpu")
    monkeypatch.setattr(machine_module, "cpu_flags", lambda: {"avx512f", "avx512_bf16"})  # EPYC, older Xeons
    assert not machine_module.has_bf16_matrix_units("cpu")
