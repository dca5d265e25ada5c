"""The windowed order: machine shares of the shards, windows of K shards, exact resume and elastic resume."""

from __future__ import annotations

from typing import Any

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._sampling.epoch_order import BatchPlan
from guideloom._sampling.windowed_order import WindowedOrder, taken_from_stream

shard_counts = st.lists(st.integers(0, 40), min_size=1, max_size=30).filter(lambda counts: sum(counts) > 0)


@st.composite
def orders(draw: st.DrawFn) -> WindowedOrder:
    """A windowed order of a small storage: shards of 0-40 samples, 1-4 machines of 1-3 ranks."""
    machines = draw(st.integers(1, 4))
    local_world_size, local_batch_size = draw(st.integers(1, 3)), draw(st.integers(1, 5))
    return WindowedOrder(
        draw(shard_counts),
        seed=draw(st.integers(-(2**63), 2**63 - 1)),
        epoch=draw(st.integers(0, 5)),
        window=draw(st.integers(1, 8)),
        streams=machines,
        global_batch_size=machines * local_world_size * local_batch_size,
        clean_cuts=draw(st.none() | st.lists(st.integers(0, 29), max_size=4)),
        ranks=machines * local_world_size,
    )


def remade(order: WindowedOrder, **changes: Any) -> WindowedOrder:
    """``order``'s settings with ``changes``: the same storage and run, read from elsewhere or cut elsewhere."""
    settings = {"seed": order.seed, "epoch": order.epoch, "window": order.window, "streams": order.streams}
    settings |= {"global_batch_size": order.global_batch_size, "clean_cuts": order.clean_cuts, "ranks": order.ranks}
    return WindowedOrder(order.counts, **(settings | changes))


def whole_epoch(order: WindowedOrder) -> np.ndarray:
    """The samples of the epoch's positions from its start, the last batch's padding included."""
    return order.sample_at(np.arange(order.start, order.padded_end))


def once_each(order: WindowedOrder, samples: np.ndarray) -> np.ndarray:
    """``samples`` read in an epoch of ``order`` (from its start) less the last batch's padding: those it repeats."""
    padding = order.padded_end - order.sample_count
    values, counts = np.unique(samples, return_counts=True)
    assert int((counts - 1).sum()) == padding
    return values


@settings(max_examples=200, deadline=None)
@given(orders())
def test_an_epoch_reads_every_sample_exactly_once(order: WindowedOrder) -> None:
    assert np.array_equal(once_each(order, whole_epoch(order)), np.arange(order.sample_count))


@settings(max_examples=200, deadline=None)
@given(orders())
def test_the_last_batch_pads_each_machine_with_its_own_samples(order: WindowedOrder) -> None:
    """A machine's ranks read only its stream in the last, short batch too: it downloads no other's shards."""
    plan = BatchPlan(order.sample_count, order.global_batch_size // order.ranks, order.ranks, False)
    if plan.full_batch_count == plan.batch_count:
        return  # no short batch
    for rank in range(order.ranks):
        machine = rank // (order.ranks // order.streams)
        begin, end = order.stream_bounds(machine)
        streams, _ = order.stream_offsets(plan.rank_positions(plan.batch_count - 1, rank))
        assert begin == end or set(streams.tolist()) == {machine}  # (an empty share has nothing to repeat)


@settings(max_examples=200, deadline=None)
@given(orders())
def test_machines_read_disjoint_shares_but_for_a_shard_at_each_share_boundary(order: WindowedOrder) -> None:
    streams, _ = order.stream_offsets(np.arange(order.padded_end))  # the last batch too: it is read by machines
    shards = order.shards_of(whole_epoch(order))
    readers_of_shard = [set(streams[shards == shard].tolist()) for shard in range(len(order.counts))]
    extra_readers = sum(len(readers) - 1 for readers in readers_of_shard if readers)
    assert extra_readers <= order.streams - 1  # a shard is read twice only where one share ends and the next begins


@settings(max_examples=200, deadline=None)
@given(orders())
def test_a_machine_reads_its_end_parts_and_its_whole_shards_and_nothing_else(order: WindowedOrder) -> None:
    """What a machine names for partial downloads: the samples at its share's two ends, the shards it reads whole."""
    streams, _ = order.stream_offsets(np.arange(order.padded_end))
    samples = whole_epoch(order)
    for machine in range(order.streams):
        mine = np.unique(samples[streams == machine])
        ranges, whole = order.end_parts(machine)
        in_parts = np.zeros(len(mine), bool)
        for first, stop in ranges:
            in_parts |= (mine >= first) & (mine < stop)
        assert np.array_equal(mine[~in_parts], mine[np.isin(order.shards_of(mine), whole) & ~in_parts])
        for first, stop in ranges:  # the machine's own samples, the first and last part all it reads of its shard
            assert np.isin(np.arange(first, stop), mine).all()
        for first, stop in ranges[:2]:
            shard = int(order.shards_of(np.array([first]))[0])
            assert np.array_equal(mine[order.shards_of(mine) == shard], np.arange(first, stop))


@settings(max_examples=200, deadline=None)
@given(orders())
def test_a_machine_has_at_most_window_shards_begun_and_unfinished(order: WindowedOrder) -> None:
    for stream in range(order.streams):
        share = order.stream(stream)
        shards = order.shards_of(order.stream_samples(stream, np.arange(share.length)))
        parts = np.searchsorted(np.unique(shards), shards)  # any numbering of the stream's shards
        first = {part: at for at, part in reversed(list(enumerate(parts.tolist())))}
        last = {part: at for at, part in enumerate(parts.tolist())}
        for at in range(share.length):
            open_parts = sum(1 for part in first if first[part] <= at <= last[part])
            assert open_parts <= order.window


@settings(max_examples=100, deadline=None)
@given(orders(), st.data())
def test_resuming_at_a_global_batch_continues_the_same_order(order: WindowedOrder, data: st.DataObject) -> None:
    batches = order.sample_count // order.global_batch_size
    start = data.draw(st.integers(0, batches)) * order.global_batch_size
    resumed = remade(order, start=start)
    assert np.array_equal(whole_epoch(resumed), whole_epoch(order)[start:])


@settings(max_examples=100, deadline=None)
@given(orders(), st.data())
def test_elastic_resumes_with_other_batch_sizes_skip_and_repeat_nothing(
    order: WindowedOrder, data: st.DataObject
) -> None:
    """Two restarts, each with another global batch size and number of ranks (any: they need not split evenly
    between the machines)."""
    read: list[np.ndarray] = []
    current = order
    for _ in range(2):
        whole_batches = (current.sample_count - current.start) // current.global_batch_size
        stop = current.start + data.draw(st.integers(0, whole_batches)) * current.global_batch_size
        read.append(current.sample_at(np.arange(current.start, stop)))
        current = current.at(stop, data.draw(st.integers(1, 40)), data.draw(st.integers(1, 6)))
    read.append(whole_epoch(current))
    assert np.array_equal(once_each(current, np.concatenate(read)), np.arange(order.sample_count))


@settings(max_examples=100, deadline=None)
@given(orders(), st.booleans())
def test_the_ranks_of_a_machine_read_its_share_in_every_whole_batch(order: WindowedOrder, drop_last: bool) -> None:
    world_size = order.streams  # one rank per machine, reading the machine's samples of each global batch
    plan = BatchPlan(order.sample_count, order.global_batch_size // world_size, world_size, drop_last)
    for batch in range(plan.full_batch_count):
        for rank in range(world_size):
            streams, _ = order.stream_offsets(plan.rank_positions(batch, rank))
            assert set(streams.tolist()) == {rank}


@settings(max_examples=100, deadline=None)
@given(orders())
def test_rotated_shares_walk_the_shards_in_storage_order(order: WindowedOrder) -> None:
    rotated = remade(order, clean_cuts=[0, *range(1, len(order.counts), 3)])
    for stream in range(rotated.streams):
        shards = rotated.stream(stream).shard_positions
        assert np.all(np.diff(shards) % len(rotated.counts) > 0)  # ascending, but for one wrap to the first shard
        assert np.sum(np.diff(shards) < 0) <= 1


def test_the_order_mixes_about_window_shards_in_every_128_samples() -> None:
    order = WindowedOrder(np.full(64, 128), seed=0, epoch=0, window=14, streams=1, global_batch_size=8)
    shards = order.shards_of(whole_epoch(order))
    distinct = [len(set(shards[at : at + 128].tolist())) for at in range(0, len(shards) - 127, 128)]
    assert min(distinct) >= 12


def test_another_seed_or_epoch_gives_another_order() -> None:
    def order(seed: int, epoch: int) -> np.ndarray:
        windowed = WindowedOrder(np.full(16, 20), seed=seed, epoch=epoch, window=4, streams=2, global_batch_size=4)
        return whole_epoch(windowed)

    assert not np.array_equal(order(0, 0), order(1, 0))
    assert not np.array_equal(order(0, 0), order(0, 1))
    assert np.array_equal(order(5, 2), order(5, 2))


def test_each_global_batch_brings_every_stream_to_its_count_of_the_positions_before_it() -> None:
    order = WindowedOrder(np.full(10, 7), seed=0, epoch=0, window=2, streams=4, global_batch_size=6)
    streams, _ = order.stream_offsets(np.arange(order.full_batches * 6))
    for end in range(6, order.full_batches * 6 + 1, 6):
        counts = np.bincount(streams[:end], minlength=4)
        assert counts.tolist() == taken_from_stream(end, np.arange(4), 4).tolist()
