"""Training windows and normalisation: content, counts, strides, round trips."""

import numpy as np
import pytest
import torch

from dynaforge.config import DataConfig
from dynaforge.data import (
    MemoryTrajectories,
    Normalizer,
    WindowDataset,
    make_loader,
    safe_start_method,
    window_starts,
)
from dynaforge.errors import ConfigError, DatasetError
from dynaforge.store.layout import channels_first_to_last, fields_from_disk


def stored_fields(samples: int = 3, frames: int = 10, size: int = 7, channels: int = 2) -> np.ndarray:
    """(N, T, X, C) with every value encoding its (sample, frame, point, channel) position."""
    n, t, x, c = np.meshgrid(
        np.arange(samples), np.arange(frames), np.arange(size), np.arange(channels), indexing="ij"
    )
    return (1000 * n + 100 * t + x + 0.5 * c).astype(np.float32)


def stored_windows(
    fields: np.ndarray, normalizer: Normalizer, history: int, targets: int, stride: int = 1
) -> WindowDataset:
    """The windows of stored (N, T, X, C) fields, held in memory and normalised."""
    trajectories = MemoryTrajectories.normalized(fields_from_disk(fields), normalizer)
    return WindowDataset(trajectories, history=history, targets=targets, stride=stride)


def test_window_starts_cover_every_full_window() -> None:
    assert list(window_starts(10, 3, 1)) == list(range(8))
    assert list(window_starts(10, 3, 2)) == list(range(6))  # start 5 uses frames 5, 7, 9
    assert len(window_starts(4, 3, 2)) == 0


def test_windows_hold_the_stored_frames_channels_first() -> None:
    fields = stored_fields()
    dataset = stored_windows(fields, Normalizer.identity(2), history=2, targets=3, stride=2)
    per_sample = 10 - (5 - 1) * 2
    assert len(dataset) == 3 * per_sample
    window = dataset[per_sample + 1]  # sample 1, start 1: frames 1, 3 | 5, 7, 9
    assert window.inputs.shape == (2, 2, 7) and window.targets.shape == (3, 2, 7)
    assert window.inputs.dtype == torch.float32
    expected = np.moveaxis(fields[1, [1, 3, 5, 7, 9]], -1, 1)  # (frames, C, X)
    np.testing.assert_array_equal(torch.cat([window.inputs, window.targets]).numpy(), expected)


def test_windows_of_odd_sizes_and_last_window() -> None:
    fields = stored_fields(samples=1, frames=5, size=5, channels=1)
    dataset = stored_windows(fields, Normalizer.identity(1), history=1, targets=1, stride=3)
    assert len(dataset) == 2
    last = dataset[1]
    assert last.inputs[0, 0, 0] == 100 and last.targets[0, 0, 0] == 400
    with pytest.raises(IndexError):
        dataset[2]


def test_too_short_trajectories_name_the_fix() -> None:
    with pytest.raises(ConfigError, match=r"too short.*data\.history"):
        stored_windows(stored_fields(frames=4), Normalizer.identity(2), history=2, targets=2, stride=2)


def test_windows_are_normalised_per_channel() -> None:
    rng = np.random.default_rng(0)
    fields = (rng.normal(size=(4, 6, 9, 2)) * [2.0, 0.5] + [1.0, -3.0]).astype(np.float32)
    normalizer = Normalizer(fields.reshape(-1, 2).mean(0).tolist(), fields.reshape(-1, 2).std(0).tolist())
    dataset = stored_windows(fields, normalizer, history=1, targets=1)
    frames = dataset.source.all  # (N, T, C, X)
    torch.testing.assert_close(frames.mean(dim=(0, 1, 3)), torch.zeros(2), atol=1e-5, rtol=0)
    torch.testing.assert_close(frames.std(dim=(0, 1, 3), correction=0), torch.ones(2), atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_normalisation_round_trip(dtype: torch.dtype) -> None:
    normalizer = Normalizer([0.3, -2.0, 5.0], [0.1, 4.0, 1e-12])  # last channel constant: not divided
    fields = torch.randn(2, 4, 3, 11, dtype=torch.float64).to(dtype)
    normalized = normalizer.physical_to_normalized(fields, spatial_dims=1)
    assert normalized.dtype == dtype and normalized.shape == fields.shape
    assert torch.isfinite(normalized).all()
    back = normalizer.normalized_to_physical(normalized, 1)
    assert back.dtype == dtype
    if dtype == torch.bfloat16:
        # Two roundings (of (x - m) / s and of the result) of unit roundoff 2^-9 each, on values of size at
        # most |x| + |m|: the round trip is exact to (|x| + |m|) 2^-8 and no better.
        scale = float(fields.float().abs().max()) + 5.0
        torch.testing.assert_close(back.float(), fields.float(), rtol=0, atol=scale * 2**-8)
    else:
        torch.testing.assert_close(back, fields)


def test_normalisation_of_2d_fields_and_wrong_channels() -> None:
    normalizer = Normalizer([1.0, 2.0], [2.0, 4.0])
    fields = torch.ones(3, 2, 5, 6, dtype=torch.float32)
    out = normalizer.physical_to_normalized(fields, spatial_dims=2)
    torch.testing.assert_close(out[:, 0], torch.zeros(3, 5, 6))
    torch.testing.assert_close(out[:, 1], torch.full((3, 5, 6), -0.25))
    with pytest.raises(ValueError, match="2 channel"):
        normalizer.physical_to_normalized(torch.ones(3, 4, 5), spatial_dims=1)


def test_normalizer_from_stats_and_missing_stats() -> None:
    normalizer = Normalizer.from_stats({"mean": [1.0], "std": [2.0], "count": 5})
    assert normalizer.to_dict() == {"mean": [1.0], "std": [2.0]}
    with pytest.raises(DatasetError, match="n_train"):
        Normalizer.from_stats(None)


def test_layout_conversions_are_inverse() -> None:
    fields = stored_fields()
    first = fields_from_disk(fields)
    assert first.shape == (3, 10, 2, 7)
    np.testing.assert_array_equal(channels_first_to_last(first).numpy(), fields)


def test_loader_batches_are_seeded_and_channels_first() -> None:
    dataset = stored_windows(stored_fields(), Normalizer.identity(2), history=2, targets=1)
    config = DataConfig(batch_size=5)

    def first_inputs(seed: int) -> torch.Tensor:
        return next(iter(make_loader(dataset, config, torch.device("cpu"), shuffle=True, seed=seed))).inputs

    batch = first_inputs(0)
    assert batch.shape == (5, 2, 2, 7)
    torch.testing.assert_close(batch, first_inputs(0))
    assert not torch.equal(batch, first_inputs(1))
    loader = make_loader(dataset, config, torch.device("cpu"), shuffle=False)
    assert loader.pin_memory is False  # pinning only pays for copies to a GPU
    assert safe_start_method("no-such-method") == "spawn"


def test_loader_workers_start_safely_and_give_the_same_batches() -> None:
    dataset = stored_windows(stored_fields(), Normalizer.identity(2), history=2, targets=1)
    in_process = make_loader(dataset, DataConfig(batch_size=4), torch.device("cpu"), shuffle=True, seed=3)
    config = DataConfig(batch_size=4, num_workers=1, start_method="forkserver")
    with_worker = make_loader(dataset, config, torch.device("cpu"), shuffle=True, seed=3)
    assert with_worker.multiprocessing_context.get_start_method() == safe_start_method("forkserver")
    for a, b in zip(in_process, with_worker, strict=True):
        torch.testing.assert_close(a.inputs, b.inputs)
        torch.testing.assert_close(a.targets, b.targets)
