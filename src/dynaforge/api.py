"""The notebook API: simulate, generate, open a dataset, train, load a run, predict, roll out, evaluate.

Every function here is a thin layer over the stages the command line runs, so that a researcher needs no
submodule import: `simulate`, `open_dataset` and `load_run` (and the types they return) are re-exported by
`import dynaforge`; `generate` and `train` are reached as `dynaforge.api.generate` and
`dynaforge.api.train`, because `dynaforge.generate` and `dynaforge.train` are the stages' packages.

Conventions: fields are torch tensors in the layout models take, channels first,
(samples, time, channels, *space) float32 (the store keeps them channels last; the values are the same
bytes); parameters are float64, one column per name of `param_names`; time and grid coordinates are
float64 in the system's own units. Everything a trained model is given or returns here is in physical
units: normalisation is applied inside; `Run.predict` and `Run.rollout` also take numpy arrays (and then
return numpy arrays).

Errors are `dynaforge.errors.DynaforgeError`s (a `ConfigError` is also a `ValueError`), and name the
arguments of these functions (`resume=True`, `overwrite=True`), not the command line's flags. The printed
form of what they return is a summary (shapes, names, key figures) that fits a notebook cell.

The examples run as tests (tests/integration/test_api.py, from the repository root) with `tmp` a scratch
folder, `tiny_data` a dataset folder of configs/tiny.yaml and `tiny_run` a run trained on it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from jaxtyping import Float
from torch import Tensor, nn

from dynaforge.config import (
    Config,
    ConfigError,
    load_config,
    resolve_device,
)
from dynaforge.data import Normalizer
from dynaforge.evaluate import EvaluationResult
from dynaforge.evaluate import evaluate as evaluate_run
from dynaforge.evaluate.rollout import predict_physical
from dynaforge.floating import flush_denormals
from dynaforge.generate import generate as generate_folder
from dynaforge.generate import system_for
from dynaforge.models import ModelShape, load_surrogate
from dynaforge.runs import run_folder
from dynaforge.seeds import SPLITS, Rows
from dynaforge.store import DatasetFolder, SplitArrays
from dynaforge.store.layout import fields_from_disk
from dynaforge.store.to_xarray import split_to_xarray
from dynaforge.store.writer import batches
from dynaforge.train import TrainSummary
from dynaforge.train import train as train_folder

ConfigLike = str | Path | Config
"""A YAML preset's path or a `Config`."""
Frames = Float[Tensor, "batch history channels *space"] | Float[np.ndarray, "batch history channels *space"]
"""Physical frames a run starts from: a tensor, or a numpy array (the run then returns numpy arrays)."""


class Sample(NamedTuple):
    """One trajectory: fields (time, channels, *space) float32, its parameters and coordinates."""

    fields: Float[Tensor, "time channels *space"]
    params: Float[Tensor, " n_params"]
    """float64, one value per name of `param_names`."""
    param_names: tuple[str, ...]
    time: Float[Tensor, " time"]
    """float64, the time of each frame."""
    grid: dict[str, Tensor]
    """Axis name -> (points,) float64 coordinates of this sample (left end included, right excluded)."""
    seed: int
    """The sample's seed (`dynaforge.seeds.sample_seed` of the base seed, split and index)."""

    def __repr__(self) -> str:
        return (
            f"Sample(fields={tensor_summary(self.fields)}, "
            f"params={params_summary(self.params, self.param_names)}, time={time_summary(self.time)}, "
            f"grid={grid_summary(self.grid)}, seed={self.seed})"
        )


class Samples(NamedTuple):
    """Trajectories of one split: fields (samples, time, channels, *space) float32 and what goes with them."""

    fields: Float[Tensor, "samples time channels *space"]
    params: Float[Tensor, "samples n_params"]
    """float64, one column per name of `param_names`."""
    param_names: tuple[str, ...]
    time: Float[Tensor, " time"]
    """float64, the time of each frame (the same for every sample)."""
    grid: dict[str, Tensor]
    """Axis name -> (samples, points) float64 coordinates per sample."""
    seeds: tuple[int, ...]
    """Each sample's seed."""

    def __repr__(self) -> str:
        return (
            f"Samples(fields={tensor_summary(self.fields)}, "
            f"params={params_summary(self.params, self.param_names)}, time={time_summary(self.time)}, "
            f"grid={grid_summary(self.grid)}, seeds=<{len(self.seeds)}>)"
        )

    def sample(self, index: int) -> Sample:
        """The `index`-th trajectory alone."""
        return Sample(
            fields=self.fields[index],
            params=self.params[index],
            param_names=self.param_names,
            time=self.time,
            grid={axis: values[index] for axis, values in self.grid.items()},
            seed=self.seeds[index],
        )


def simulate(
    config: ConfigLike,
    *,
    overrides: Sequence[str] = (),
    n: int | None = None,
    seed: int | None = None,
    split: str = "train",
    start: int = 0,
    device: str | None = None,
) -> Samples:
    """Run the ground-truth system of `config` on samples [start, start + n) of `split`, in memory.

    Each sample is drawn from the seed the store gives it (`dynaforge.seeds.sample_seed` of `seed`, the
    split and the sample's index), and rolled out as generation does, so sample i here is sample
    start + i of the dataset that `dynaforge generate` writes from the same config and seed, bit for bit
    (on the same device). `n` defaults to the split's size in `config.dataset`, `seed` to
    `config.dataset.seed`, `device` to `config.dataset.device`. Returns `Samples`, fields
    (n, time, channels, *space) float32 on the device that generated them.

    >>> import dynaforge
    >>> sim = dynaforge.simulate("configs/tiny.yaml", n=2, split="test")
    >>> tuple(sim.fields.shape), sim.fields.dtype, sim.param_names
    ((2, 11, 1, 64), torch.float32, ('domain_length', 'viscosity'))
    >>> tuple(sim.time.shape), tuple(sim.grid["x"].shape)
    ((11,), (2, 64))
    """
    config = load_config(config, overrides)
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; valid: {', '.join(SPLITS)}")
    n = config.dataset.split_sizes()[split] if n is None else n
    if n < 1 or start < 0:
        raise ConfigError(f"simulate needs n >= 1 samples from a start >= 0, got n={n}, start={start}")
    base_seed = config.dataset.seed if seed is None else seed
    where = torch.device(resolve_device(device or config.dataset.device))
    system = system_for(config, where)
    parts = []
    for lo, hi in batches(n, config.dataset.batch_size):  # the writer's batches: the same memory bound
        with flush_denormals():  # as the writer does: subnormals are flushed in stored samples too
            parts.append(system.sample_rows(Rows(split, start + lo, start + hi, base_seed), where))
    params = np.concatenate([part.params for part in parts])
    return Samples(
        fields=torch.cat([part.fields for part in parts]),  # (n, T, C, *space) on the generating device
        params=torch.from_numpy(np.ascontiguousarray(params, dtype=np.float64)),
        param_names=tuple(system.parameter_names),
        time=torch.from_numpy(np.asarray(parts[-1].time, dtype=np.float64)),
        grid={
            axis: torch.from_numpy(np.asarray(values, dtype=np.float64))
            for axis, values in system.coordinates(params).items()
        },
        seeds=tuple(int(seed) for seed in Rows(split, start, start + n, base_seed).seeds()),
    )


def generate(
    config: ConfigLike, out: str | Path, *, overrides: Sequence[str] = (), progress: bool | None = None
) -> Dataset:
    """Generate (or finish generating) the dataset of `config` in folder `out` and open it
    (`dynaforge.generate.generate`: sharded, resumable; a folder of another config is refused).
    `progress=None` shows a progress bar only on a terminal.

    >>> import dynaforge
    >>> data = dynaforge.api.generate("configs/tiny.yaml", tmp / "data")
    >>> data.splits
    {'train': 8, 'val': 4, 'test': 4}
    """
    generate_folder(load_config(config, overrides), out, progress=progress)
    return open_dataset(out)


def train(
    config: ConfigLike,
    data: str | Path | Dataset,
    out: str | Path,
    *,
    overrides: Sequence[str] = (),
    **options: Any,
) -> TrainSummary:
    """Train `config`'s model on dataset `data` (a folder or an opened `Dataset`) into run folder `out`
    (`dynaforge.train.train`); `options` are its own: progress, overwrite, resume, profile_steps, init_from
    (a run folder whose surrogate training starts from: fine-tuning).
    Open the trained run with `load_run(out)`.

    >>> import dynaforge
    >>> summary = dynaforge.api.train(
    ...     "configs/tiny.yaml", tiny_data, tmp / "run", overrides=["train.epochs=1"], progress=False
    ... )
    >>> summary.epochs
    1
    """
    folder = data.root if isinstance(data, Dataset) else data
    return train_folder(load_config(config, overrides), folder, out, **options)


class Dataset:
    """A dataset folder opened for reading (`dynaforge.store.DatasetFolder`: verified before use), its
    arrays as torch tensors, fields channels first."""

    def __init__(self, root: str | Path) -> None:
        self.folder = DatasetFolder(root)
        self.root = self.folder.root

    def __repr__(self) -> str:
        shape = self.folder.manifest.get("shape", {})
        frames = (
            f", frames={shape['frames']}, space={shape['space']}"
            if {"frames", "space"} <= shape.keys()
            else ""
        )
        channels = f", channels={shape['channels']}" if "channels" in shape else ""
        return f"Dataset({str(self.root)!r}, system={self.system!r}, splits={self.splits}{frames}{channels})"

    @property
    def splits(self) -> dict[str, int]:
        """Split name -> number of samples."""
        return {split: self.folder.split_size(split) for split in self.folder.manifest["splits"]}

    @property
    def stats(self) -> dict[str, Any]:
        """The train split's per-channel statistics that models are normalised with: `mean`, `std`
        (lists, one entry per channel, physical units) and more (docs/format.md)."""
        return self.folder.stats

    @property
    def system(self) -> str:
        """The name of the system that made the data (`burgers`, `nbody`, ...)."""
        return self.folder.system

    @property
    def config(self) -> Config:
        """The config that generated the dataset (a ConfigError for converted and foreign datasets)."""
        return self.folder.config

    def split(self, name: str) -> Samples:
        """Every sample of split `name`, fields (samples, time, channels, *space) float32.

        >>> import dynaforge
        >>> test = dynaforge.open_dataset(tiny_data).split("test")
        >>> tuple(test.fields.shape), len(test.seeds)
        ((4, 11, 1, 64), 4)
        """
        return split_to_samples(self.folder.read_split(name))

    def sample(self, split: str, index: int) -> Sample:
        """Sample `index` of `split` alone (only its shard is read), fields (time, channels, *space) float32.

        >>> import dynaforge
        >>> one = dynaforge.open_dataset(tiny_data).sample("train", 5)
        >>> tuple(one.fields.shape), tuple(one.params.shape), tuple(one.grid["x"].shape)
        ((11, 1, 64), (2,), (64,))
        """
        size = self.splits.get(split, 0)
        if not 0 <= index < size:
            raise IndexError(f"sample {index} is not in split {split!r} of {self.root}: it holds [0, {size})")
        if self.folder.foreign is not None:
            return self.split(split).sample(index)
        return read_sample(self.folder, split, index)

    def to_xarray(self, split: str) -> Any:
        """Split `split` as an `xarray.Dataset` with named, labelled coordinates (needs xarray: `pip install
        'dynaforge[xarray]'`): `fields` on (sample, time, x_index, ..., channel) as the shards store it, the
        grid `x` per sample, the channel names, one variable per parameter and `seeds`
        (`dynaforge.store.to_xarray.split_to_xarray`; docs/format.md)."""
        return split_to_xarray(self.folder, split)


def open_dataset(path: str | Path) -> Dataset:
    """Open dataset folder `path` (or a PDEBench or The Well HDF5 file) for reading; see `Dataset`.

    >>> import dynaforge
    >>> data = dynaforge.open_dataset(tiny_data)
    >>> data.system, data.splits, len(data.stats["mean"])
    ('burgers', {'train': 8, 'val': 4, 'test': 4}, 1)
    """
    return Dataset(path)


@dataclasses.dataclass(frozen=True, repr=False)
class Run:
    """A trained surrogate from a run folder: the model (eval mode), its config, shape and normaliser.

    `predict` and `rollout` take and return physical units, frames channels first; the model's time step
    is `config.data.stride` stored frames. A run trained with `data.boundary_channels` takes and returns
    each sample's boundary values as its last channels (`shape.boundary` names them), and one trained with
    `data.parameter_channels` its coefficients after them (`shape.parameters`); append both with
    `dynaforge.data.boundary.with_boundary_channels`.
    """

    root: Path
    checkpoint: str
    """`best` or `last`."""
    model: nn.Module
    config: Config
    """The full config the run was trained with (from the checkpoint)."""
    shape: ModelShape
    """channels, history (input frames per call), horizon (output frames per call), spatial_dims."""
    normalizer: Normalizer
    """The train split's statistics the model was trained with."""
    device: torch.device

    def __repr__(self) -> str:
        weights = sum(p.numel() for p in self.model.parameters())
        return (
            f"Run({str(self.root)!r}, checkpoint={self.checkpoint!r}, model={self.config.model.name!r} "
            f"({weights:,} weights), system={self.config.system.name!r}, channels={self.shape.channels}, "
            f"history={self.shape.history}, horizon={self.shape.horizon}, "
            f"spatial_dims={self.shape.spatial_dims}, stride={self.config.data.stride}, "
            f"device={str(self.device)!r})"
        )

    def predict(self, frames: Frames) -> Float[Tensor, "batch horizon channels *space"] | np.ndarray:
        """One model call: the next `shape.horizon` frames after `shape.history` physical frames
        (B, history, C, *space), physical units, on the device `frames` came from (a numpy array in,
        a numpy array out).

        >>> import dynaforge
        >>> run = dynaforge.load_run(tiny_run)
        >>> frames = dynaforge.open_dataset(tiny_data).split("test").fields[:, :2]
        >>> tuple(run.predict(frames).shape)
        (4, 1, 1, 64)
        """
        return self.rollout(frames, steps=1)

    def rollout(
        self, initial_frames: Frames, *, steps: int
    ) -> Float[Tensor, "batch predicted channels *space"] | np.ndarray:
        """`steps` model calls, each on the last `shape.history` frames known or predicted; returns the
        steps x horizon predicted frames (without the initial ones), physical units, on the device
        `initial_frames` came from (float32 numpy when they are a numpy array). Frame k of the result is
        (k + 1) x `config.data.stride` stored frames after the last initial frame.

        >>> import dynaforge
        >>> run = dynaforge.load_run(tiny_run)
        >>> truth = dynaforge.simulate("configs/tiny.yaml", n=3, split="test").fields
        >>> predicted = run.rollout(truth[:, :2], steps=5)
        >>> tuple(predicted.shape)
        (3, 5, 1, 64)
        >>> bool(((predicted - truth[:, 2:7]).norm() / truth[:, 2:7].norm()) < 1)
        True
        """
        if isinstance(initial_frames, np.ndarray):
            return self.rollout(torch.from_numpy(np.ascontiguousarray(initial_frames)), steps=steps).numpy()
        if not isinstance(initial_frames, Tensor):
            raise TypeError(
                f"frames must be a torch.Tensor or a numpy array of shape {expected_frames(self.shape)}, "
                f"got a {type(initial_frames).__name__}"
            )
        if steps < 1:
            raise ConfigError(f"steps is the number of model calls, at least 1; got {steps}")
        check_frames(initial_frames, self.shape)
        frames = initial_frames.to(device=self.device, dtype=torch.float32)
        self.model.eval()
        with torch.inference_mode():
            predicted = predict_physical(self.model, self.normalizer, frames, steps, self.shape.spatial_dims)
        return predicted.to(initial_frames.device)

    def evaluate(self, *, data: str | Path | Dataset | None = None) -> EvaluationResult:
        """Score this checkpoint on the test split of `data` (default: the dataset the run was trained on)
        with `dynaforge.evaluate.evaluate`, the run's `evaluate` config section, and write RUN/eval
        (RUN/eval-NAME for other data). Returns the metrics and the report's path.

        >>> import dynaforge
        >>> result = dynaforge.load_run(tiny_run).evaluate()
        >>> len(result.metrics["rollout_nrmse"]), result.report.name
        (5, 'report.html')
        """
        folder = data.root if isinstance(data, Dataset) else data
        return evaluate_run(self.root, folder, checkpoint=self.checkpoint)


def load_run(path: str | Path, *, checkpoint: Literal["best", "last"] = "best", device: str = "cpu") -> Run:
    """The surrogate trained in run folder `path`, from its `best` or `last` checkpoint, on `device`, in
    eval mode (`dynaforge.models.load_surrogate`).

    >>> import dynaforge
    >>> run = dynaforge.load_run(tiny_run)
    >>> run.shape, run.config.model.name, run.model.training
    (ModelShape(channels=1, history=2, horizon=1, spatial_dims=1, held=(), boundary=(), parameters=()), 'fno', False)
    """
    if checkpoint not in ("best", "last"):
        raise ConfigError(f"checkpoint must be 'best' or 'last', got {checkpoint!r}")
    folder = run_folder(path)
    where = torch.device(resolve_device(device))
    loaded = load_surrogate(folder.checkpoint(checkpoint), where)
    return Run(
        root=folder.root,
        checkpoint=checkpoint,
        model=loaded.model,
        config=loaded.config,
        shape=loaded.shape,
        normalizer=loaded.normalizer,
        device=where,
    )


# ---- helpers (candidates for the rooms below: see the module's report) ------------------------------------


def split_to_samples(arrays: SplitArrays) -> Samples:
    """The store's arrays (fields channels last, numpy) as `Samples` (fields channels first, torch)."""
    return Samples(
        fields=fields_from_disk(arrays.fields),
        params=torch.from_numpy(np.ascontiguousarray(arrays.params, dtype=np.float64)),
        param_names=tuple(arrays.param_names),
        time=torch.from_numpy(np.asarray(arrays.time, dtype=np.float64)),
        grid={axis: torch.from_numpy(np.asarray(v, dtype=np.float64)) for axis, v in arrays.coords.items()},
        seeds=tuple(int(seed) for seed in arrays.seeds),
    )


def read_sample(folder: DatasetFolder, split: str, index: int) -> Sample:
    """Sample `index` of `split` from its shard alone, checked as `DatasetFolder.read_split` checks."""
    return split_to_samples(folder.read_samples(split, index, index + 1)).sample(0)


def expected_frames(shape: ModelShape) -> str:
    given = [
        *([f"boundary values {list(shape.boundary)}"] if shape.boundary else []),
        *([f"coefficients {list(shape.parameters)} (0 where it has none)"] if shape.parameters else []),
    ]
    held = (
        f"; the last {len(shape.boundary) + len(shape.parameters)} channels are each sample's "
        + " and ".join(given)
        + " as constant fields (dynaforge.data.boundary.with_boundary_channels)"
        if given
        else ""
    )
    return (
        f"(batch, history={shape.history}, channels={shape.channels}, *space with {shape.spatial_dims} axes)"
        + held
    )


def check_frames(frames: Tensor, shape: ModelShape) -> None:
    """Raise an error that names the fix when `frames` do not fit a model of `shape`."""
    expected = expected_frames(shape)
    if frames.ndim != 3 + shape.spatial_dims or frames.shape[2] != shape.channels:
        raise ConfigError(
            f"frames of shape {tuple(frames.shape)} do not fit this model: it takes {expected}; "
            "fields here are channels first, and a single trajectory needs a batch axis (frames[None])"
        )
    if frames.shape[1] != shape.history:
        raise ConfigError(
            f"this model takes {shape.history} input frames, got {frames.shape[1]}; pass the last ones, "
            f"frames[:, -{shape.history}:], {shape.history} stored frame(s) x data.stride apart"
        )


def tensor_summary(values: Tensor) -> str:
    """`(4, 11, 1, 64) float32` (and its device when not the CPU): what a tensor is, without its values."""
    where = "" if values.device.type == "cpu" else f" {values.device}"
    return f"{tuple(values.shape)} {str(values.dtype).removeprefix('torch.')}{where}"


def params_summary(params: Tensor, names: Sequence[str]) -> str:
    shown = ", ".join(names[:6]) + (f", +{len(names) - 6} more" if len(names) > 6 else "")
    return f"{tensor_summary(params)} [{shown}]"


def time_summary(time: Tensor) -> str:
    if time.numel() == 0:
        return "<0 frames>"
    return f"<{time.numel()} frames, {float(time[0]):.6g} to {float(time[-1]):.6g}>"


def grid_summary(grid: dict[str, Tensor]) -> str:
    return "{" + ", ".join(f"{axis!r}: {tuple(values.shape)}" for axis, values in grid.items()) + "}"
