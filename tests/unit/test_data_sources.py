"""Windows read lazily from the shards and streamed from the simulator: the same windows as the in-memory
path, orders that are pure functions of (seed, epoch), disjoint ranks, bounded memory (issue 22)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch

from dynaforge.config import ConfigError, load_config
from dynaforge.data import Normalizer, WindowDataset
from dynaforge.data.lazy import BufferShuffleSampler, LazyWindowDataset, buffered_order
from dynaforge.data.stream import StreamPlan, TrajectoryStream, generate_samples, statistics_of, stream_plan
from dynaforge.store import DatasetFolder
from dynaforge.systems import build_system

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"


def both_paths(data: Path, buffer: int = 3) -> tuple[WindowDataset, LazyWindowDataset]:
    folder = DatasetFolder(data)
    normalizer = Normalizer.from_stats(folder.stats)
    memory = WindowDataset(folder.read_split("train").fields, normalizer, history=2, targets=1)
    lazy = LazyWindowDataset(
        folder.trajectory_reader("train"), normalizer, history=2, targets=1, buffer=buffer
    )
    return memory, lazy


def test_lazy_windows_equal_the_in_memory_windows_bit_for_bit(tiny_data: Path) -> None:
    memory, lazy = both_paths(tiny_data)
    assert len(lazy) == len(memory) == 8 * 9
    for index in range(len(memory)):
        assert torch.equal(lazy[index].inputs, memory[index].inputs), index
        assert torch.equal(lazy[index].targets, memory[index].targets), index


def test_an_epoch_of_lazy_reading_draws_every_window_once_with_at_most_buffer_trajectories_held(
    tiny_data: Path,
) -> None:
    memory, lazy = both_paths(tiny_data, buffer=3)
    sampler = BufferShuffleSampler(lazy, rank=0, world_size=1, seed=5)
    sampler.start(epoch=2)
    order = list(sampler)
    assert sorted(order) == list(range(len(memory)))  # the in-memory epoch's multiset of windows
    held = 0
    for index in order:
        lazy[index]
        held = max(held, len(lazy.cache))
    assert held == 3
    assert lazy.reads == 8  # each trajectory read once: the shuffle walks the buffer's blocks
    # Consecutive runs of buffer x windows_per_sample positions touch `buffer` trajectories at most.
    for lo in range(0, len(order), 3 * 9):
        assert len({i // 9 for i in order[lo : lo + 27]}) <= 3


def test_the_buffered_order_is_a_pure_function_of_seed_and_epoch() -> None:
    first = buffered_order(10, 4, 3, seed=1, epoch=0)
    assert np.array_equal(first, buffered_order(10, 4, 3, seed=1, epoch=0))
    assert not np.array_equal(first, buffered_order(10, 4, 3, seed=1, epoch=1))
    assert not np.array_equal(first, buffered_order(10, 4, 3, seed=2, epoch=0))
    assert sorted(first.tolist()) == list(range(40))


def test_ranks_take_disjoint_windows_that_cover_the_epoch_and_skip_resumes(tiny_data: Path) -> None:
    _, lazy = both_paths(tiny_data)
    ranks = [BufferShuffleSampler(lazy, rank=r, world_size=2, seed=0) for r in range(2)]
    for sampler in ranks:
        sampler.start(epoch=1)
    shares = [list(s) for s in ranks]
    assert len(shares[0]) == len(shares[1]) == 36
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(72))
    ranks[0].start(epoch=1, skip=10)
    assert list(ranks[0]) == shares[0][10:] and len(ranks[0]) == 26


class SizedLike(LazyWindowDataset):
    """What BufferShuffleSampler reads of a dataset, without one on disk."""

    def __init__(self, samples: int, windows_per_sample: int, buffer: int) -> None:  # no super(): no reader
        self.sizes, self.windows, self.buffer = samples, windows_per_sample, buffer

    @property
    def samples(self) -> int:
        return self.sizes

    @property
    def windows_per_sample(self) -> int:
        return self.windows


@pytest.mark.parametrize(
    ("samples", "windows", "buffer", "world"), [(10, 4, 3, 3), (7, 5, 2, 4), (9, 1, 4, 2)]
)
def test_the_sampler_produces_the_padded_order_block_by_block(
    samples: int, windows: int, buffer: int, world: int
) -> None:
    # The definition, materialised: the whole order, padded with its start like DistributedSampler, strided.
    order = buffered_order(samples, windows, buffer, seed=5, epoch=2)
    padded_size = -(-len(order) // world) * world
    padded = np.concatenate([order, order[: padded_size - len(order)]])
    for rank in range(world):
        sampler = BufferShuffleSampler(SizedLike(samples, windows, buffer), rank, world, seed=5)
        sampler.start(epoch=2)
        assert list(sampler) == padded[rank::world].tolist()
        sampler.start(epoch=2, skip=3)
        assert list(sampler) == padded[rank::world][3:].tolist()


def test_the_reader_keeps_at_most_open_shards_files_open_and_reads_every_sample(
    tiny_data: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from dynaforge.store import reader as reader_module

    monkeypatch.setattr(reader_module, "OPEN_SHARDS", 1)
    folder = DatasetFolder(tiny_data)
    whole = folder.read_split("train").fields
    reader = folder.trajectory_reader("train")
    assert len(reader.pieces) > 1, "the fixture needs more shards than handles for this test"
    for i in [*range(len(reader)), *reversed(range(len(reader)))]:  # every shard, then back again
        assert np.array_equal(reader.read(i), whole[i])
        assert len(reader.handles) == 1
    reader.close()


def test_the_foreign_reader_reads_one_sample_at_a_time(tmp_path: Path) -> None:
    from dynaforge.store.pdebench import write_tensor_file

    fields = np.random.default_rng(0).normal(size=(10, 6, 16)).astype(np.float32)
    path = tmp_path / "1D_Burgers_Sols_Nu0.1.hdf5"
    write_tensor_file(path, fields, x=np.linspace(0, 1, 16), t=np.linspace(0, 1, 6))
    folder = DatasetFolder(path)
    reader = folder.trajectory_reader("train")
    whole = folder.read_split("train").fields
    assert len(reader) == len(whole)
    for i in range(len(reader)):
        assert np.array_equal(reader.read(i), whole[i])


def test_streamed_sample_i_is_byte_identical_to_stored_sample_i(tiny_data: Path) -> None:
    config = load_config(TINY)
    system = build_system(config.system)
    stored = DatasetFolder(tiny_data).read_split("train").fields
    # Generated three at a time from sample 2 on: batch size and offset must not matter.
    streamed = np.concatenate(
        [
            generate_samples(system, config.dataset.seed, "train", lo, lo + 3, torch.device("cpu"))
            for lo in (2, 5)
        ]
    )
    assert streamed.tobytes() == stored[2:8].tobytes()
    val = generate_samples(system, config.dataset.seed, "val", 0, 4, torch.device("cpu"))
    assert val.tobytes() == DatasetFolder(tiny_data).read_split("val").fields.tobytes()
    # The stream's statistics of the whole train split are the store's (exactly rounded sums: same bits).
    mine, stores = statistics_of(stored), DatasetFolder(tiny_data).stats
    assert (mine["mean"], mine["std"]) == (stores["mean"], stores["std"])


def plan(rank: int = 0, world_size: int = 1, **changes: int) -> StreamPlan:
    fields = {
        "buffer": 8,
        "reuse": 2,
        "rank": rank,
        "world_size": world_size,
        "block": 3,
        "windows_per_sample": 5,
        "rounds_per_epoch": 3,
        "batch_size": 7,
        "seed": 0,
    } | changes
    return StreamPlan(**fields)


def test_stream_ranks_generate_disjoint_samples_that_leave_no_gap() -> None:
    samples = [plan(rank=r, world_size=3).global_sample(m) for r in range(3) for m in range(12)]
    assert sorted(samples) == list(range(36))


def test_each_streamed_sample_is_drawn_in_reuse_rounds_with_all_its_windows() -> None:
    p = plan()
    draws: Counter[tuple[int, int]] = Counter()
    for epoch in range(3):
        for _, rows in p.epoch_batches(epoch):
            draws.update(map(tuple, rows.tolist()))
    rounds = 3 * p.rounds_per_epoch
    # Samples that enter after the first round stay `reuse` rounds, each round drawing all their windows.
    for sample in range(p.buffer, (rounds - 1) * p.replaced):
        assert [draws[(sample, o)] for o in range(5)] == [p.reuse] * 5, sample
    assert sum(draws.values()) == rounds * p.buffer * 5


def test_a_stream_epoch_resumed_after_k_batches_draws_the_rest_in_the_same_order() -> None:
    p = plan()
    whole = [rows for _, rows in p.epoch_batches(1)]
    rest = [rows for _, rows in p.epoch_batches(1, skip=4)]
    assert len(whole) == p.batches_per_epoch == -(-3 * 8 * 5 // 7)
    assert all(np.array_equal(a, b) for a, b in zip(whole[4:], rest, strict=True))


def test_the_stream_yields_the_stored_windows_and_holds_a_bounded_buffer(tiny_data: Path) -> None:
    config = load_config(TINY, ["data.stream.buffer=4", "data.stream.reuse=2", "dataset.batch_size=2"])
    folder = DatasetFolder(tiny_data)
    normalizer = Normalizer.from_stats(folder.stats)
    memory = WindowDataset(folder.read_split("train").fields, normalizer, history=2, targets=1)
    p = stream_plan(config, rank=0, world_size=1, windows_per_sample=9, drop_last=False)
    assert p.rounds_per_epoch == 4  # 8 new samples per epoch, 2 per round
    stream = TrajectoryStream(
        p, build_system(config.system), normalizer, config.dataset.seed, torch.device("cpu"), 2, 1, 1
    )
    try:
        held = 0
        batches = list(stream.batches(0))
        for (_, rows), batch in zip(p.epoch_batches(0), batches, strict=True):
            held = max(held, len(stream.samples))
            for (sample, offset), inputs in zip(rows.tolist(), batch.inputs, strict=True):
                if sample < 8:  # the stored split's samples
                    assert torch.equal(inputs, memory[sample * 9 + offset].inputs)
        assert held <= p.buffer + 2 * p.replaced + p.block
    finally:
        stream.close()


def test_a_buffer_that_reuse_does_not_divide_is_refused() -> None:
    with pytest.raises(
        ConfigError, match=r"data\.stream\.buffer=6 is not a multiple of data\.stream\.reuse=4"
    ):
        load_config(TINY, ["data.stream.buffer=6", "data.stream.reuse=4"])


def test_training_that_waits_for_data_is_told_so_once_with_what_to_change(
    tiny_data: Path, caplog: pytest.LogCaptureFixture
) -> None:
    import time

    from dynaforge.train.window import WindowTask

    task = WindowTask(load_config(TINY, ["data.reading=lazy"]), tiny_data)
    task.train_set = both_paths(tiny_data)[1]
    task.clock, task.waited, task.windows_read = time.perf_counter() - 4.0, 3.0, 640
    with caplog.at_level("WARNING"):
        measures = task.data_measures()
        assert 0.7 < measures["data_wait_share"] <= 1 and measures["data_wait_s"] == 3.0
        assert 150 < measures["windows_per_s"] <= 160
        task.clock, task.waited = time.perf_counter() - 4.0, 3.0
        task.data_measures()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "waited for data" in warnings[0] and "data.num_workers" in warnings[0]
