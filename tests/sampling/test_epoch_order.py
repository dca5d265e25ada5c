"""Tests for the lazy epoch permutation and the distributed batch plan."""

from __future__ import annotations

import dataclasses
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._sampling.epoch_order import BatchPlan, EpochOrder

EDGE_COUNTS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, 255, 256, 257, 1023, 1024, 1025]


def shuffled(n: int, seed: int = 0, epoch: int = 0) -> list[int]:
    """The whole shuffled order of an epoch of `n` samples."""
    return [int(i) for i in EpochOrder(n, shuffle=True, seed=seed, epoch=epoch).indices(np.arange(n))]


def consumed(plan: BatchPlan, batches: range | None = None) -> list[int]:
    """All positions read by all ranks, batch by batch, rank by rank."""
    out: list[int] = []
    for batch in batches if batches is not None else range(plan.batch_count):
        for rank in range(plan.world_size):
            out.extend(int(p) for p in plan.rank_positions(batch, rank))
    return out


def plans(drop_last: bool | None = None) -> st.SearchStrategy[BatchPlan]:
    """Small plans starting at position 0; `drop_last` is drawn unless given."""
    return st.builds(
        BatchPlan,
        sample_count=st.integers(0, 300),
        local_batch_size=st.integers(1, 9),
        world_size=st.integers(1, 8),
        drop_last=st.booleans() if drop_last is None else st.just(drop_last),
    )


# --- EpochOrder ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("n", EDGE_COUNTS)
def test_shuffle_is_permutation_edge_counts(n: int) -> None:
    assert sorted(shuffled(n)) == list(range(n))


@given(n=st.integers(1, 3000), seed=st.integers(-(2**70), 2**70), epoch=st.integers(0, 2**40))
@settings(max_examples=100, deadline=None)
def test_shuffle_is_permutation(n: int, seed: int, epoch: int) -> None:
    assert sorted(shuffled(n, seed, epoch)) == list(range(n))


def test_same_seed_and_epoch_give_same_order() -> None:
    assert shuffled(1000, seed=7, epoch=3) == shuffled(1000, seed=7, epoch=3)


def test_different_seeds_give_different_orders() -> None:
    orders = {tuple(shuffled(1000, seed=seed)) for seed in range(20)}
    assert len(orders) == 20


def test_different_epochs_give_different_orders() -> None:
    orders = {tuple(shuffled(1000, seed=5, epoch=epoch)) for epoch in range(20)}
    assert len(orders) == 20


def test_shuffle_is_not_identity() -> None:
    assert shuffled(1000) != list(range(1000))


@pytest.mark.parametrize("n", [0, 1, 10, 10**12])
def test_no_shuffle_is_identity(n: int) -> None:
    positions = np.arange(min(n, 1000), dtype=np.int64)
    result = EpochOrder(n, shuffle=False, seed=1, epoch=2).indices(positions)
    assert result.dtype == np.int64
    assert result.tolist() == positions.tolist()


def test_indices_keeps_shape_and_dtype() -> None:
    order = EpochOrder(100, shuffle=True, seed=1, epoch=0)
    assert order.indices(np.arange(12).reshape(3, 4)).shape == (3, 4)
    assert order.indices(np.int64(5)).shape == ()
    assert order.indices(np.arange(10, dtype=np.int32)).dtype == np.int64


def test_indices_is_consistent_per_position() -> None:
    order = EpochOrder(5000, shuffle=True, seed=3, epoch=1)
    full = order.indices(np.arange(5000))
    picked = np.array([4999, 0, 17, 17, 2500])
    assert order.indices(picked).tolist() == full[picked].tolist()


@given(
    n=st.integers(1, 100_000),
    seed=st.integers(-(2**70), 2**70),
    positions=st.lists(st.integers(0, 10**9), max_size=64),
)
@settings(max_examples=100, deadline=None)
def test_walking_in_numpy_and_in_integers_agree(n: int, seed: int, positions: list[int]) -> None:
    order = EpochOrder(n, shuffle=True, seed=seed, epoch=1)
    wanted = [position % n for position in positions]
    assert order.indices(np.array(wanted, np.int64)).tolist() == [order.sample_at_one(p) for p in wanted]


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 60_000), seed=st.integers(0, 2**32), runs=st.lists(st.integers(0, 6000), min_size=1))
def test_reading_runs_in_turn_gives_the_order_of_each_position(n: int, seed: int, runs: list[int]) -> None:
    order, fresh = EpochOrder(n, shuffle=True, seed=seed, epoch=1), EpochOrder(n, shuffle=True, seed=seed, epoch=1)
    position, served = 0, []
    for size in [*runs, n]:  # consecutive runs, as a loader reads an epoch (large ones answered from a block ahead)
        got = order.sample_at(np.arange(position, position + size, dtype=np.int64))
        every = max(1, size // 40)
        assert got[::every].tolist() == [fresh.sample_at_one(p) for p in range(position, position + size, every)]
        served.extend(got.tolist())
        position += size
    assert sorted(served[-n:]) == list(range(n))  # the last n positions read: one whole epoch


def test_empty_positions() -> None:
    for n in (0, 10):
        result = EpochOrder(n, shuffle=True, seed=0, epoch=0).indices(np.array([], dtype=np.int64))
        assert result.dtype == np.int64 and result.size == 0
    assert len(EpochOrder(0, shuffle=True, seed=0, epoch=0)) == 0


@pytest.mark.parametrize("n", [10**10, 10**12, 2**63 - 1])
def test_huge_dataset_is_lazy(n: int) -> None:
    order = EpochOrder(n, shuffle=True, seed=42, epoch=9)
    positions = np.arange(1000, dtype=np.int64) * (n // 1000)
    tracemalloc.start()
    try:
        result = order.indices(positions)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 1_000_000
    assert result.min() >= 0 and result.max() < n
    assert len(set(result.tolist())) == 1000


def test_no_numpy_warnings() -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        EpochOrder(10**12, shuffle=True, seed=-1, epoch=0).indices(np.int64(123))
        EpochOrder(10**12, shuffle=True, seed=2**64 - 1, epoch=0).indices(np.arange(100))


def test_golden_sequence() -> None:
    first = np.arange(20)
    epoch0 = EpochOrder(1000, shuffle=True, seed=1234, epoch=0).indices(first).tolist()
    epoch1 = EpochOrder(1000, shuffle=True, seed=1234, epoch=1).indices(first).tolist()
    assert epoch0 == [
        352,
        59,
        621,
        137,
        996,
        608,
        220,
        9,
        695,
        665,
        683,
        87,
        342,
        723,
        539,
        221,
        303,
        600,
        703,
        329,
    ]
    assert epoch1 == [
        825,
        869,
        944,
        867,
        85,
        904,
        997,
        807,
        171,
        153,
        398,
        687,
        712,
        611,
        228,
        356,
        44,
        198,
        614,
        548,
    ]


def test_sample_at_wraps_around() -> None:
    order = EpochOrder(10, shuffle=True, seed=1, epoch=0)
    assert order.sample_at(np.arange(10, 25)).tolist() == order.indices(np.arange(15) % 10).tolist()


@pytest.mark.parametrize(
    ("kwargs", "error", "name"),
    [
        ({"sample_count": -1}, ValueError, "sample_count"),
        ({"sample_count": 2**63}, ValueError, "sample_count"),
        ({"sample_count": 1.5}, TypeError, "sample_count"),
        ({"shuffle": 1}, TypeError, "shuffle"),
        ({"seed": "1"}, TypeError, "seed"),
        ({"epoch": -1}, ValueError, "epoch"),
    ],
)
def test_epoch_order_rejects_bad_arguments(kwargs: dict[str, object], error: type[Exception], name: str) -> None:
    arguments: dict[str, object] = {"sample_count": 10, "shuffle": True, "seed": 0, "epoch": 0, **kwargs}
    with pytest.raises(error, match=name):
        EpochOrder(**arguments)  # type: ignore[arg-type]


@pytest.mark.parametrize("positions", [[-1], [10], [0, 3, 11]])
def test_indices_rejects_out_of_range(positions: list[int]) -> None:
    with pytest.raises(IndexError, match="positions"):
        EpochOrder(10, shuffle=True, seed=0, epoch=0).indices(np.array(positions))


def test_positions_must_be_integers() -> None:
    with pytest.raises(TypeError, match="positions"):
        EpochOrder(10, shuffle=True, seed=0, epoch=0).indices(np.array([1.0]))


def test_sample_at_rejects_negative_and_empty_dataset() -> None:
    with pytest.raises(IndexError, match="positions"):
        EpochOrder(10, shuffle=True, seed=0, epoch=0).sample_at(np.array([-1]))
    with pytest.raises(IndexError, match="positions"):
        EpochOrder(0, shuffle=True, seed=0, epoch=0).sample_at(np.array([0]))


# --- BatchPlan ----------------------------------------------------------------------------------------


@given(plan=plans())
def test_ranks_get_equal_batches(plan: BatchPlan) -> None:
    for batch in range(plan.batch_count):
        sizes = {len(plan.rank_positions(batch, rank)) for rank in range(plan.world_size)}
        assert len(sizes) == 1 and sizes.pop() > 0


@given(plan=plans())
def test_ranks_are_disjoint(plan: BatchPlan) -> None:
    positions = consumed(plan)
    assert len(positions) == len(set(positions))


@given(plan=plans(drop_last=False).filter(lambda plan: plan.sample_count > 0))
def test_padding_covers_every_sample(plan: BatchPlan) -> None:
    positions = consumed(plan)
    n, world = plan.sample_count, plan.world_size
    assert len(positions) == -(-n // world) * world
    assert {p % n for p in positions} == set(range(n))
    assert all(p < n for p in positions[: len(positions) - (world - 1)])


@given(plan=plans(drop_last=True))
def test_drop_last_batches_are_full(plan: BatchPlan) -> None:
    positions = consumed(plan)
    assert len(positions) == plan.batch_count * plan.global_batch_size
    assert positions == list(range(len(positions)))
    assert all(p < plan.sample_count for p in positions)
    assert plan.batch_count == plan.full_epoch_batch_count == plan.sample_count // plan.global_batch_size


@given(n=st.integers(1, 300), local=st.integers(1, 9))
def test_single_rank_short_last_batch(n: int, local: int) -> None:
    plan = BatchPlan(n, local, 1, drop_last=False)
    assert consumed(plan) == list(range(n))
    assert len(plan.rank_positions(plan.batch_count - 1, 0)) == n - (plan.batch_count - 1) * local


def test_distributed_sampler_example() -> None:
    plan = BatchPlan(10, 2, 3, drop_last=False)
    assert plan.batch_count == 2
    assert [plan.rank_positions(0, r).tolist() for r in range(3)] == [[0, 1], [2, 3], [4, 5]]
    assert [plan.rank_positions(1, r).tolist() for r in range(3)] == [[6, 7], [8, 9], [10, 11]]
    assert [plan.batch_end(b) for b in range(2)] == [6, 10]


def test_short_last_batch_is_split_evenly() -> None:
    plan = BatchPlan(10, 4, 2, drop_last=False)
    assert plan.batch_count == 2
    assert [plan.rank_positions(1, r).tolist() for r in range(2)] == [[8], [9]]


@given(plan=plans())
def test_batch_end(plan: BatchPlan) -> None:
    ends = [plan.batch_end(batch) for batch in range(plan.batch_count)]
    assert ends == sorted(ends)
    if ends:
        assert ends[-1] == plan.sample_count
        assert ends[:-1] == [(b + 1) * plan.global_batch_size for b in range(len(ends) - 1)]


@given(plan=plans(), data=st.data())
def test_batch_ends_are_each_batch_end_in_turn(plan: BatchPlan, data: st.DataObject) -> None:
    resumed = BatchPlan(*dataclasses.astuple(plan)[:4], start=data.draw(st.integers(0, plan.sample_count)))
    for each in (plan, resumed):
        assert list(each.batch_ends()) == [each.batch_end(batch) for batch in range(each.batch_count)]


@given(
    n=st.integers(1, 300),
    sizes=st.tuples(st.integers(1, 9), st.integers(1, 8), st.integers(1, 9), st.integers(1, 8)),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_elastic_resume(n: int, sizes: tuple[int, int, int, int], drop_last: bool, data: st.DataObject) -> None:
    local1, world1, local2, world2 = sizes
    first = BatchPlan(n, local1, world1, drop_last)
    k = data.draw(st.integers(0, first.batch_count))
    position = first.batch_end(k - 1) if k else 0
    before = consumed(first, range(k))
    if not (drop_last and k == first.batch_count):  # after the last batch, a dropped tail counts as read
        assert [p for p in before if p < n] == list(range(position))
    second = BatchPlan(n, local2, world2, drop_last, start=position)
    everything = before + consumed(second)
    padding = [p >= n for p in everything]
    assert padding == sorted(padding)  # padding only at the very end
    combined = [p for p in everything if p < n]
    if drop_last:
        assert combined == list(range(len(combined)))
        assert n - len(combined) < max(first.global_batch_size, second.global_batch_size)
    else:
        assert combined == list(range(n))


@pytest.mark.parametrize(
    ("args", "error", "name"),
    [
        ((-1, 1, 1, False), ValueError, "sample_count"),
        ((10, 0, 1, False), ValueError, "local_batch_size"),
        ((10, 1, 0, False), ValueError, "world_size"),
        ((10, 1, 1, False, -1), ValueError, "start"),
        ((10, 1, 1, False, 11), ValueError, "start"),
        ((10, 1, 1, None), TypeError, "drop_last"),
        ((10, 1.0, 1, False), TypeError, "local_batch_size"),
    ],
)
def test_batch_plan_rejects_bad_arguments(args: tuple[object, ...], error: type[Exception], name: str) -> None:
    with pytest.raises(error, match=name):
        BatchPlan(*args)  # type: ignore[arg-type]


def test_batch_plan_rejects_bad_batch_and_rank() -> None:
    plan = BatchPlan(10, 2, 2, drop_last=False)
    with pytest.raises(IndexError, match="batch"):
        plan.rank_positions(plan.batch_count, 0)
    with pytest.raises(IndexError, match="batch"):
        plan.batch_end(plan.batch_count)
    with pytest.raises(ValueError, match="batch"):
        plan.batch_end(-1)
    with pytest.raises(IndexError, match="rank"):
        plan.rank_positions(0, 2)
    with pytest.raises(ValueError, match="rank"):
        plan.rank_positions(0, -1)


def test_nothing_remaining_gives_no_batches() -> None:
    for drop_last in (False, True):
        assert BatchPlan(10, 3, 2, drop_last, start=10).batch_count == 0
        assert BatchPlan(0, 3, 2, drop_last).batch_count == 0


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 300), st.integers(1, 7), st.integers(1, 5), st.booleans(), st.integers(0, 300), st.data())
def test_full_rank_positions_equal_rank_positions_row_by_row(
    n: int, local: int, world: int, drop_last: bool, start: int, data: st.DataObject
) -> None:
    plan = BatchPlan(n, local, world, drop_last, min(start, n))
    rank = data.draw(st.integers(0, world - 1))
    rows = plan.full_rank_positions(0, plan.full_batch_count, rank)
    assert rows.shape == (plan.full_batch_count, local)
    for batch, row in enumerate(rows):
        assert row.tolist() == plan.rank_positions(batch, rank).tolist()
    assert plan.batch_count - plan.full_batch_count in ((0,) if drop_last else (0, 1))
