"""Random CNN operators as a dataset system (`RandomCNNSystem`): rows are (operator, realization)."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np
import torch

from dynaforge.config import ConfigError, InitialConfig, RandomCNNConfig, config_to_dict, resolve_device
from dynaforge.seeds import SPLIT_IDS, Rows, sample_seed
from dynaforge.systems.base import SampleRows, SystemBase, grid_coordinates
from dynaforge.systems.pde.spectral import draw_initial_field
from dynaforge.systems.random_cnn.features import feature_names, trajectory_features
from dynaforge.systems.random_cnn.grouped import OperatorBatch, conv_precision, generate_operators
from dynaforge.systems.random_cnn.operator import (
    OPERATOR_STREAM,
    OperatorParams,
    architecture_of,
    noise_generator,
    operator_weights,
)
from dynaforge.systems.random_cnn.sampling import (
    centred_discrepancy,
    choice_names,
    map_points,
    sobol_points,
    sobol_seed,
    space_dimensions,
)
from dynaforge.threads import run_pieces


class RandomCNNSystem(SystemBase):
    """Random CNN operators as a dataset system; rows are (operator, realization), operator-major.

    Row r of a split belongs to operator r // M, realization r % M. The operator's Sobol point is row
    r // M of the split's scrambled sequence; its weights and initial field come from the operator seed;
    the row's noise from the row seed. All seeds derive from (base seed, split, index) alone.
    """

    name: ClassVar[str] = "random_cnn"
    config_class: ClassVar[type[RandomCNNConfig]] = RandomCNNConfig
    ndim: ClassVar[int] = 2
    axis_names: ClassVar[tuple[str, ...]] = ("x", "y")

    def __init__(self, config: RandomCNNConfig) -> None:
        if not isinstance(config, RandomCNNConfig):
            raise TypeError(f"RandomCNNSystem needs a RandomCNNConfig, got {type(config).__name__}")
        self.config = config
        self.shape = (config.resolution, config.resolution)
        self.channels = config.channels
        self.dimensions = space_dimensions(config.space)
        self.rows_per_unit = config.realizations  # an operator's realizations are generated together

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return (*(name for name, _ in self.dimensions), "domain_length")

    @property
    def feature_names(self) -> tuple[str, ...]:
        return feature_names(self.config.spectrum_bins)

    def coordinates(self, params: np.ndarray) -> dict[str, np.ndarray]:
        """The grid of the unit square, per sample."""
        return grid_coordinates(self.shape, np.ones(params.shape[0]))

    def operator_seed(self, base_seed: int, split: str, operator: int) -> int:
        key = (SPLIT_IDS[split], operator, OPERATOR_STREAM)
        return int(np.random.SeedSequence(entropy=base_seed, spawn_key=key).generate_state(1, np.uint64)[0])

    def operator_points(self, base_seed: int, split: str, start: int, stop: int) -> np.ndarray:
        """Unit-cube coordinates of operators [start, stop) of a split."""
        seed = sobol_seed(base_seed, SPLIT_IDS[split])
        return sobol_points(len(self.dimensions), start, stop, seed)

    def initial_field(self, rng: np.random.Generator) -> tuple[np.ndarray, int]:
        """One family (by weight) for all channels of an operator's initial field; returns (field, family index)."""
        names = list(self.config.initial.families)
        weights = np.asarray([self.config.initial.families[n] for n in names], dtype=np.float64)
        family = int(rng.choice(len(names), p=weights / weights.sum()))
        single = InitialConfig(**{**self.config.initial.__dict__, "families": {names[family]: 1.0}})
        channels = [draw_initial_field(single, self.shape, rng) for _ in range(self.channels)]
        return np.stack(channels), family

    def build_operators(
        self, split: str, start: int, stop: int, base_seed: int
    ) -> tuple[OperatorBatch, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Operators [start, stop): the batch to run, Sobol points, mapped values, operator seeds, IC families."""
        m = self.config.realizations
        points = self.operator_points(base_seed, split, start, stop)
        values = map_points(self.dimensions, points)
        ops, layers, initial, generators, seeds, families = [], [], [], [], [], []
        for j, operator in enumerate(range(start, stop)):
            op = OperatorParams.from_values(self.config.space, values[j])
            seed = self.operator_seed(base_seed, split, operator)
            ops.append(op)
            layers.append(operator_weights(architecture_of(op, self.channels), op.weight_gain, seed))
            field, family = self.initial_field(np.random.default_rng(seed))
            initial.append(field)
            families.append(family)
            seeds.append(seed)
            rows = range(operator * m, (operator + 1) * m)
            generators.append([noise_generator(sample_seed(base_seed, split, r)) for r in rows])
        batch = OperatorBatch(ops, layers, torch.from_numpy(np.stack(initial)).to(torch.float32), generators)
        return batch, points, values, np.asarray(seeds, dtype=np.uint64), np.asarray(families, dtype=np.int64)

    def sample_rows(
        self, rows: Rows, device: torch.device, on_steps: Callable[[int], Any] | None = None
    ) -> SampleRows:
        """`rows` of a split (whole operators: both ends multiples of `realizations`)."""
        split, start, stop, base_seed = rows
        m = self.config.realizations
        if start % m or stop % m:
            raise ConfigError(
                f"random_cnn stores {m} realizations per operator: split sizes, dataset.shard_size and "
                f"dataset.batch_size must be multiples of system.realizations={m} (rows {start}..{stop})"
            )
        batch, points, values, seeds, families = self.build_operators(split, start // m, stop // m, base_seed)
        frames = generate_operators(batch, self.config, device, on_steps)  # (K, M, T, C, X, Y)
        stacked = frames.flatten(0, 1)  # operator-major rows
        extras = {
            "operator": np.repeat(np.arange(start // m, stop // m, dtype=np.int64), m),
            "realization": np.tile(np.arange(m, dtype=np.int64), stop // m - start // m),
            "operator_seed": np.repeat(seeds, m),
            "sobol": np.repeat(points, m, axis=0),
            "initial_family": np.repeat(families, m),
        }
        if self.config.features:
            # One operator's rows at a time, on one intra-op thread: the same bytes in any batch.
            # Features are computed on the host whatever the device (the bytes of the datasets made so far).
            per_operator = run_pieces(
                lambda trajectories: trajectory_features(trajectories, self.config.spectrum_bins),
                list(frames.cpu().unbind(0)),
            )
            extras["features"] = torch.cat(per_operator).numpy().astype(np.float32)
        params = np.concatenate([values, np.ones((len(values), 1))], axis=1)  # domain_length = 1
        time = np.arange(self.config.n_frames, dtype=np.float64) * self.config.dt * self.config.save_every
        return SampleRows(stacked, np.repeat(params, m, axis=0), time, extras)  # (rows, T, C, X, Y) on device

    def config_identity(self, device: str) -> dict[str, Any]:
        """The config with `precision: auto` written as the precision it resolves to on `device`."""
        identity = config_to_dict(self.config)
        if identity.get("precision") == "auto":
            identity["precision"] = conv_precision(self.config, resolve_device(device))
        return identity

    def divergence_cause(self) -> str:
        return "the sampled operator diverged; lower system.space.weight_gain.high or system.space.residual_dt.high"

    def shard_attributes(self, split: str, split_size: int, base_seed: int) -> dict[str, Any]:
        """Attributes every shard carries: the space, option names, feature names, the split's discrepancy."""
        n_operators = split_size // self.config.realizations
        points = self.operator_points(base_seed, split, 0, n_operators)
        choices = {name: choice_names(spec) for name, spec in self.dimensions if spec.kind == "choice"}
        attributes: dict[str, Any] = {
            "realizations": self.config.realizations,
            "sobol_dimensions": [name for name, _ in self.dimensions],
            "choices": json.dumps(choices),
            "initial_families": list(self.config.initial.families),
            "centred_discrepancy": centred_discrepancy(points),
            # `auto` resolved for the generate stage's default device (CUDA when available, else the CPU).
            "conv_precision": conv_precision(self.config, "cuda" if torch.cuda.is_available() else "cpu"),
        }
        if self.config.features:
            attributes["feature_names"] = list(self.feature_names)
        return attributes
