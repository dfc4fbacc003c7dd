"""The one window dataset over its three sources (in memory, read lazily from the shards, streamed from the
simulator) and the one epoch order: the same windows from every source, orders that are pure functions of
(seed, epoch, rank, world size, block) and equal to the orders earlier versions drew, disjoint ranks,
bounded memory (issues 22 and 34)."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
from torch.utils.data import DistributedSampler

from dynaforge.config import ConfigError, load_config
from dynaforge.data import MemoryTrajectories, Normalizer, WindowDataset
from dynaforge.data.lazy import LazyTrajectories
from dynaforge.data.mixture import mixture_plan
from dynaforge.data.order import EpochOrder, Rounds
from dynaforge.data.sources import window_sources
from dynaforge.data.stream import StreamedTrajectories, generate_frames, statistics_of
from dynaforge.seeds import Rows
from dynaforge.store import DatasetFolder
from dynaforge.systems import build_system

REPO = Path(__file__).resolve().parents[2]
TINY = REPO / "configs" / "tiny.yaml"


def both_paths(data: Path, buffer: int = 3) -> tuple[WindowDataset, WindowDataset]:
    folder = DatasetFolder(data)
    normalizer = Normalizer.from_stats(folder.stats)
    memory = WindowDataset(MemoryTrajectories.normalized(folder.split_frames("train"), normalizer), 2, 1)
    lazy = WindowDataset(LazyTrajectories(folder.trajectory_reader("train"), normalizer, buffer), 2, 1)
    return memory, lazy


def streamed(
    config_overrides: list[str], normalizer: Normalizer, buffer: int = 4, reuse: int = 2
) -> StreamedTrajectories:
    config = load_config(TINY, config_overrides)
    return StreamedTrajectories(
        mixture_plan(config),
        normalizer,
        torch.device("cpu"),
        buffer=buffer,
        reuse=reuse,
        rank=0,
        world_size=1,
        block=config.dataset.batch_size,
        frames=config.system.n_frames,
        trajectories=64,
    )


def test_the_three_sources_give_the_same_windows_for_the_same_trajectories(tiny_data: Path) -> None:
    memory, lazy = both_paths(tiny_data)
    stream = streamed(["dataset.batch_size=3"], Normalizer.from_stats(DatasetFolder(tiny_data).stats))
    try:
        from_stream = WindowDataset(stream, 2, 1)
        assert len(lazy) == len(memory) == 8 * 9 and from_stream.windows_per_sample == 9
        for index in range(len(memory)):  # streamed trajectory j is stored trajectory j
            want = memory[index]
            for got in (lazy[index], from_stream[index]):
                assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets), index
    finally:
        stream.close()


def test_an_epoch_of_lazy_reading_draws_every_window_once_with_at_most_buffer_trajectories_held(
    tiny_data: Path,
) -> None:
    memory, lazy = both_paths(tiny_data, buffer=3)
    source = lazy.source
    assert isinstance(source, LazyTrajectories)
    sampler = EpochOrder(lazy.samples, lazy.windows_per_sample, block=3, seed=5)
    sampler.start(epoch=2)
    order = list(sampler)
    assert sorted(order) == list(range(len(memory)))  # the in-memory epoch's multiset of windows
    held = 0
    for index in order:
        lazy[index]
        held = max(held, len(source.cache))
    assert held == 3
    assert source.loaded == 8  # each trajectory read once: the shuffle walks the buffer's blocks
    # Consecutive runs of buffer x windows_per_sample positions touch `buffer` trajectories at most.
    for lo in range(0, len(order), 3 * 9):
        assert len({i // 9 for i in order[lo : lo + 27]}) <= 3


def test_the_epoch_order_is_a_pure_function_of_seed_and_epoch() -> None:
    def order(seed: int, epoch: int, block: int = 3) -> list[int]:
        sampler = EpochOrder(10, 4, block, seed)
        sampler.start(epoch)
        return list(sampler)

    for block in (3, 10):
        first = order(1, 0, block)
        assert first == order(1, 0, block) and sorted(first) == list(range(40))
        assert first != order(1, 1, block) and first != order(2, 0, block)


def test_ranks_take_disjoint_windows_that_cover_the_epoch_and_skip_resumes() -> None:
    ranks = [EpochOrder(8, 9, block=3, seed=0, rank=r, world_size=2) for r in range(2)]
    for sampler in ranks:
        sampler.start(epoch=1)
    shares = [list(s) for s in ranks]
    assert len(shares[0]) == len(shares[1]) == 36
    assert not set(shares[0]) & set(shares[1])
    assert sorted(shares[0] + shares[1]) == list(range(72))
    ranks[0].start(epoch=1, skip=10)
    assert list(ranks[0]) == shares[0][10:] and len(ranks[0]) == 26


@pytest.mark.parametrize(
    ("samples", "windows", "block", "world"), [(10, 4, 3, 3), (7, 5, 2, 4), (9, 1, 4, 2), (2, 1, 1, 5)]
)
def test_the_order_is_produced_block_by_block_padded_and_strided(
    samples: int, windows: int, block: int, world: int
) -> None:
    # The definition, materialised: the whole order, padded with its start like DistributedSampler, strided.
    whole = EpochOrder(samples, windows, block, seed=5)
    whole.start(epoch=2)
    order = np.concatenate(list(whole.blocks()))
    padded_size = -(-len(order) // world) * world
    padded = np.resize(order, padded_size)  # repeats the order from its start
    for rank in range(world):
        sampler = EpochOrder(samples, windows, block, seed=5, rank=rank, world_size=world)
        sampler.start(epoch=2)
        assert list(sampler) == padded[rank::world].tolist() and len(sampler) == padded_size // world
        sampler.start(epoch=2, skip=3)
        assert list(sampler) == padded[rank::world][3:].tolist()


# The orders earlier versions drew (dynaforge at acda663: train.distributed.EpochSampler,
# data.lazy.BufferShuffleSampler, data.stream.StreamPlan), which runs saved mid-epoch resume into.
EARLIER_LAZY = {  # 7 trajectories x 3 windows, buffer 3, seed 5, epoch 2, 2 ranks
    0: [14, 5, 13, 18, 12, 7, 1, 2, 8, 11, 10],
    1: [3, 19, 4, 20, 0, 17, 16, 6, 15, 9, 14],
}
EARLIER_MEMORY = {0: [1, 6, 0, 7], 1: [4, 3, 2, 1], 2: [9, 5, 8, 4]}  # 10 windows, seed 4, epoch 1, 3 ranks
EARLIER_STREAM = [  # buffer 4, reuse 2, 3 windows per trajectory, 2 rounds per epoch, seed 3, rank 1 of 2, epoch 1
    12, 13, 14, 23, 19, 15, 17, 18, 21, 16, 22, 20, 25, 21, 28, 18, 20, 19, 27, 23, 24, 29, 22, 26,
]  # fmt: skip


def test_the_one_order_draws_what_the_three_samplers_before_it_drew() -> None:
    for rank, want in EARLIER_LAZY.items():
        lazy = EpochOrder(7, 3, block=3, seed=5, rank=rank, world_size=2)
        lazy.start(epoch=2)
        assert list(lazy) == want
    for rank, want in EARLIER_MEMORY.items():
        memory = EpochOrder(10, 1, block=10, seed=4, rank=rank, world_size=3)
        memory.start(epoch=1)
        reference = DistributedSampler(range(10), num_replicas=3, rank=rank, shuffle=True, seed=4)
        reference.set_epoch(1)
        assert list(memory) == list(reference) == want
    stream = EpochOrder(0, 3, block=4, seed=3, rank=1, world_size=2, rounds=Rounds(reuse=2, per_epoch=2))
    stream.start(epoch=1)
    assert list(stream) == EARLIER_STREAM


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
    folder = DatasetFolder(tiny_data)
    stored = folder.split_frames("train")
    seed, cpu = config.dataset.seed, torch.device("cpu")
    # Generated three at a time from sample 2 on: batch size and offset must not matter.
    made = torch.cat([generate_frames(system, Rows("train", lo, lo + 3, seed), cpu) for lo in (2, 5)])
    assert made.numpy().tobytes() == stored[2:8].numpy().tobytes()
    val = generate_frames(system, Rows("val", 0, 4, seed), cpu)
    assert val.numpy().tobytes() == folder.split_frames("val").numpy().tobytes()
    # The stream's statistics of the whole train split are the store's (exactly rounded sums: same bits).
    mine, stores = statistics_of(stored), folder.stats
    assert (mine["mean"], mine["std"]) == (stores["mean"], stores["std"])


def test_stream_ranks_generate_disjoint_samples_that_leave_no_gap() -> None:
    normalizer = Normalizer.identity(1)
    ranks = []
    for r in range(3):
        stream = streamed(["dataset.batch_size=3"], normalizer)
        stream.rank, stream.world_size = r, 3
        ranks.append(stream)
    samples = [stream.global_sample(m) for stream in ranks for m in range(12)]
    assert sorted(samples) == list(range(36))


def stream_order(rank: int = 0, world_size: int = 1) -> EpochOrder:
    return EpochOrder(0, 5, block=8, seed=0, rank=rank, world_size=world_size, rounds=Rounds(2, 3))


def test_each_streamed_sample_is_drawn_in_reuse_rounds_with_all_its_windows() -> None:
    order = stream_order()
    draws: Counter[tuple[int, int]] = Counter()
    for epoch in range(3):
        order.start(epoch)
        draws.update(divmod(i, 5) for i in order)
    rounds = 3 * 3
    # Samples that enter after the first round stay `reuse` rounds, each round drawing all their windows.
    for sample in range(8, (rounds - 1) * order.replaced):
        assert [draws[(sample, o)] for o in range(5)] == [2] * 5, sample
    assert sum(draws.values()) == rounds * 8 * 5


def test_a_stream_epoch_resumed_after_k_windows_draws_the_rest_in_the_same_order() -> None:
    order = stream_order()
    order.start(1)
    whole = list(order)
    assert len(whole) == len(order) == 3 * 8 * 5
    order.start(1, skip=28)
    assert list(order) == whole[28:] and len(order) == len(whole) - 28


def test_the_stream_yields_the_stored_windows_and_holds_a_bounded_buffer(tiny_data: Path) -> None:
    overrides = ["data.source=stream", "data.stream.buffer=4", "data.stream.reuse=2", "dataset.batch_size=2"]
    config = load_config(TINY, overrides)
    sources = window_sources(config, tiny_data, torch.device("cpu"), seed=0, epochs=2)
    stored = MemoryTrajectories.normalized(DatasetFolder(tiny_data).split_frames("train"), sources.normalizer)
    memory = WindowDataset(stored, 2, 1)  # with the stream's statistics (of its first `buffer` samples)
    try:
        assert sources.order.rounds == Rounds(2, 4)  # 8 new samples per epoch, 2 per round
        assert sources.reading == "memory" and sources.loaded_measure == "trajectories_generated_per_s"
        stream = sources.trajectories
        assert isinstance(stream, StreamedTrajectories)
        sources.order.start(0)
        indices = list(sources.order)
        held, position = 0, 0
        for batch in sources.train_loader:
            rows = indices[position : position + len(batch.inputs)]
            position += len(rows)
            held = max(held, len(stream.samples))
            for index, inputs in zip(rows, batch.inputs, strict=True):
                if index < len(memory):  # the stored split's samples
                    assert torch.equal(inputs, memory[index].inputs)
        assert position == len(indices) == 4 * 4 * 9
        assert held <= 4 + 2 + 2  # buffer + r + a generation block
        assert sources.loaded() >= 2 + 4 * 2
    finally:
        sources.close()


def test_a_time_budget_stream_draws_past_train_epochs_within_its_length(tiny_data: Path) -> None:
    # A time-budget run plans its own epoch count, beyond train.epochs: its stream must not end there
    # (the mixture pretraining of benchmarks/universal.py failed in epoch 11 of a 10-epoch config).
    overrides = ["data.source=stream", "data.stream.buffer=4", "data.stream.reuse=2", "dataset.batch_size=2"]
    for budget, last_epoch, fits in ((None, 1, True), (None, 2, False), (60.0, 1000, True)):
        config = load_config(TINY, [*overrides, "train.epochs=2", f"train.time_budget={budget or 'null'}"])
        sources = window_sources(config, tiny_data, torch.device("cpu"), seed=0, epochs=2)
        try:
            sources.order.start(last_epoch)
            assert (max(sources.order) < len(sources.train)) == fits, (budget, last_epoch)
        finally:
            sources.close()


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

    config = load_config(TINY, ["data.reading=lazy"])
    task = WindowTask(config, tiny_data)
    task.sources = window_sources(config, tiny_data, torch.device("cpu"), seed=0, epochs=1)
    task.clock, task.waited, task.windows_read = time.perf_counter() - 4.0, 3.0, 640
    with caplog.at_level("WARNING"):
        measures = task.data_measures()
        assert 0.7 < measures["data_wait_share"] <= 1 and measures["data_wait_s"] == 3.0
        assert 150 < measures["windows_per_s"] <= 160
        assert measures["trajectories_read_per_s"] >= 0
        task.clock, task.waited = time.perf_counter() - 4.0, 3.0
        task.data_measures()
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and "waited for data" in warnings[0] and "data.num_workers" in warnings[0]


def test_a_given_normaliser_replaces_the_datas_own_and_must_have_its_channels(tiny_data: Path) -> None:
    # Fine-tuning keeps the pretrained run's statistics (data.finetune_normalize: pretrained).
    config = load_config(TINY)
    kept = Normalizer([0.25], [3.0])
    sources = window_sources(config, tiny_data, torch.device("cpu"), seed=0, epochs=1, normalizer=kept)
    frames = DatasetFolder(tiny_data).split_frames("train")
    assert sources.normalizer is kept
    assert torch.allclose(sources.train[0][0], (frames[0][:2] - 0.25) / 3.0)
    with pytest.raises(ConfigError, match="normalises 2 channel"):
        window_sources(
            config,
            tiny_data,
            torch.device("cpu"),
            seed=0,
            epochs=1,
            normalizer=Normalizer([0.0, 0.0], [1.0, 1.0]),
        )
