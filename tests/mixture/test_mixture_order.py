"""Tests for the mixture's pure arithmetic: schedules, exact block proportions, component passes."""

from __future__ import annotations

from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._mixture.mixture_order import MixtureOrder
from guideloom._mixture.schedule import largest_remainder, parse_schedule
from guideloom._sampling.passes import pass_domain, permute_many

NAMES = ("a", "b", "c", "d", "e")


def order(
    weights: list[float] | None = None,
    sizes: list[int] | None = None,
    *,
    schedule: list[tuple[int, list[float]]] | None = None,
    block_size: int = 64,
    shuffle: bool = True,
    seed: int = 0,
) -> MixtureOrder:
    """A `MixtureOrder` over components named a, b, c, ... with these weights (or stages) and sizes."""
    count = len(weights if weights is not None else schedule[0][1])  # type: ignore[index]
    names = NAMES[:count]
    stages = None if schedule is None else [(start, dict(zip(names, w, strict=True))) for start, w in schedule]
    plain = None if weights is None else dict(zip(names, weights, strict=True))
    parsed = parse_schedule(names, plain, stages, block_size)
    return MixtureOrder(parsed, sizes or [1000] * count, shuffle=shuffle, seed=seed)


weight_lists = st.lists(st.sampled_from([0.0, 0.001, 1 / 3, 0.5, 1.0, 2.0, 7.25]), min_size=2, max_size=5).filter(any)


# --- largest remainder ----------------------------------------------------------------------------------


@given(weights=weight_lists, total=st.integers(1, 5000))
@settings(max_examples=200, deadline=None)
def test_largest_remainder_sums_and_stays_within_one_of_the_exact_share(weights: list[float], total: int) -> None:
    counts = largest_remainder(weights, total)
    assert sum(counts) == total
    whole = sum(Fraction(w) for w in weights)
    for weight, count in zip(weights, counts, strict=True):
        share = Fraction(weight) * total / whole
        assert share - 1 < count <= share + 1 and (count == int(share) or count == int(share) + 1)


def test_largest_remainder_ties_go_to_the_earlier_component() -> None:
    assert largest_remainder([1, 1, 1], 10) == [4, 3, 3]
    assert largest_remainder([1, 2, 1, 2], 7) == [1, 3, 1, 2]


def test_largest_remainder_gives_the_largest_remainders_the_extra_samples() -> None:
    assert largest_remainder([5, 3, 1], 16) == [9, 5, 2]  # shares 8.89, 5.33, 1.78
    assert largest_remainder([0.001, 1 / 3, 0], 1024) == [3, 1021, 0]  # shares 3.06, 1020.94, 0


# --- exact proportions ----------------------------------------------------------------------------------


@given(
    weights=weight_lists,
    block_size=st.integers(1, 300),
    seed=st.integers(-(2**64), 2**64),
    start=st.integers(0, 10**9),
)
@settings(max_examples=100, deadline=None)
def test_every_aligned_block_holds_exactly_the_rounded_counts(
    weights: list[float], block_size: int, seed: int, start: int
) -> None:
    mix = order(weights, block_size=block_size, seed=seed)
    first = start * block_size
    components, _ = mix.draws(np.arange(first, first + 3 * block_size))
    expected = largest_remainder(weights, block_size)
    for block in components.reshape(3, block_size):
        assert np.bincount(block, minlength=len(weights)).tolist() == expected


@pytest.mark.parametrize(
    "weights",
    [[1 / 3, 2 / 3], [0.001, 1 / 3, 0.0], [1 / 3, 1 / 3, 1 / 3, 0.001], [0.0, 1 / 3, 0.001, 5.0, 1 / 7]],
)
def test_proportions_counted_per_block_over_a_long_run(weights: list[float]) -> None:
    mix = order(weights, sizes=[997, 10**6, 31, 5, 123][: len(weights)], block_size=1024, seed=3)
    components, draws = mix.draws(np.arange(100 * 1024))
    per_block = np.stack([np.bincount(block, minlength=len(weights)) for block in components.reshape(100, 1024)])
    assert (per_block == largest_remainder(weights, 1024)).all()
    for k in range(len(weights)):  # each component's draws are 0, 1, 2, ... in order of appearance
        assert draws[components == k].tolist() == list(range(int(per_block[:, k].sum())))


def test_a_zero_weight_switches_a_component_off() -> None:
    components, _ = order([1.0, 0.0, 2.0], sizes=[10, 0, 10]).locate(np.arange(6400))
    assert 1 not in components.tolist()


def test_the_slot_order_is_seeded_and_interleaves_components() -> None:
    first = order([1.0, 1.0], seed=1).draws(np.arange(64))[0].tolist()
    assert first != order([1.0, 1.0], seed=2).draws(np.arange(64))[0].tolist()
    assert first != sorted(first) and first == order([1.0, 1.0], seed=1).draws(np.arange(64))[0].tolist()


# --- component passes -----------------------------------------------------------------------------------


def test_a_component_smaller_than_its_share_cycles_through_reshuffled_passes() -> None:
    mix = order([1.0, 3.0], sizes=[1000, 7], seed=5)
    components, samples = mix.locate(np.arange(640))
    small = samples[components == 1]
    passes = small[: len(small) // 7 * 7].reshape(-1, 7)
    assert len(passes) > 60
    assert all(sorted(row) == list(range(7)) for row in passes.tolist())
    assert len({tuple(row) for row in passes.tolist()}) > 30  # each pass is a fresh permutation


def test_without_shuffle_components_are_served_in_storage_order() -> None:
    components, samples = order([1.0, 3.0], sizes=[1000, 7], shuffle=False).locate(np.arange(640))
    assert samples[components == 1].tolist() == [i % 7 for i in range(480)]
    assert samples[components == 0].tolist() == list(range(160))


@given(
    weights=weight_lists,
    sizes=st.lists(st.integers(1, 50), min_size=5, max_size=5),
    seed=st.integers(0, 2**32),
    indices=st.lists(st.integers(0, 10**6), min_size=1, max_size=40),
)
@settings(max_examples=100, deadline=None)
def test_any_index_is_located_alone_as_in_any_batch(
    weights: list[float], sizes: list[int], seed: int, indices: list[int]
) -> None:
    mix = order(weights, sizes=sizes[: len(weights)], block_size=32, seed=seed)
    components, samples = mix.locate(np.array(indices))
    fresh = order(weights, sizes=sizes[: len(weights)], block_size=32, seed=seed)
    alone = [fresh.locate(np.array([i])) for i in reversed(indices)][::-1]
    assert components.tolist() == [int(c[0]) for c, _ in alone]
    assert samples.tolist() == [int(s[0]) for _, s in alone]
    assert all(0 <= s < sizes[c] for c, s in zip(components.tolist(), samples.tolist(), strict=True))


def test_far_indices_cost_no_more_than_near_ones() -> None:
    mix = order([0.5, 0.25, 0.25], sizes=[10**9, 3, 10**12], block_size=1024)
    components, samples = mix.locate(np.array([10**15, 10**15 + 1, 4 * 10**17]))
    assert components.shape == samples.shape == (3,)


# --- schedules ------------------------------------------------------------------------------------------


def test_a_schedule_switch_lands_on_its_start_sample() -> None:
    mix = order(schedule=[(0, [1.0, 0.0]), (2048, [0.0, 1.0]), (4096, [1.0, 1.0])], block_size=1024)
    components, draws = mix.draws(np.arange(6144))
    assert components[:2048].tolist() == [0] * 2048
    assert components[2048:4096].tolist() == [1] * 2048
    assert draws[2048] == 0 and draws[4095] == 2047
    assert np.bincount(components[4096:]).tolist() == [1024, 1024]
    assert draws[4096:][components[4096:] == 0].min() == 2048  # component a continues where it stopped


@given(
    stages=st.lists(st.tuples(st.integers(1, 5), weight_lists.filter(lambda w: len(w) == 3)), min_size=1, max_size=4),
    probe=st.integers(0, 40),
)
@settings(max_examples=50, deadline=None)
def test_draws_before_a_block_match_counting_every_sample(stages: list[tuple[int, list[float]]], probe: int) -> None:
    starts = np.cumsum([0] + [gap for gap, _ in stages[1:]]) * 8
    schedule = [(int(start), weights) for start, (_, weights) in zip(starts, stages, strict=True)]
    mix = order(schedule=schedule, block_size=8)
    components, draws = mix.draws(np.arange(8 * probe + 8))
    last = components[-8:]
    for k in range(3):
        seen_before = int((components[: 8 * probe] == k).sum())
        mine = draws[-8:][last == k]
        assert mine.tolist() == list(range(seen_before, seen_before + len(mine)))


def test_first_difference_allows_changes_from_the_position_on() -> None:
    names = ("a", "b")
    old = parse_schedule(names, None, [(0, {"a": 1, "b": 1}), (2048, {"a": 1, "b": 0})], 1024)
    later = parse_schedule(names, None, [(0, {"a": 1, "b": 1}), (3072, {"a": 0, "b": 1})], 1024)
    rescaled = parse_schedule(names, None, [(0, {"a": 5, "b": 5}), (2048, {"a": 3, "b": 0})], 1024)
    assert old.first_difference(later, 2048) is None
    assert old.first_difference(rescaled, 10**9) is None
    assert old.first_difference(later, 2049) == "the weights in force at global sample 2048 differ"
    assert old.first_difference(parse_schedule(names, {"a": 1, "b": 2}, None, 1024), 1) is not None


def test_default_samples_per_epoch_ends_at_the_first_components_last_sample() -> None:
    mix = order([0.3, 0.7], sizes=[1000, 5], block_size=64, seed=9)
    length = mix.default_samples_per_epoch()
    components, draws = mix.draws(np.arange(length))
    assert components[-1] == 0 and draws[-1] == 999 and int((components == 0).sum()) == 1000


# --- validation -----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("weights", "schedule", "block_size", "error", "message"),
    [
        ({"a": 1, "b": 1}, None, 0, ValueError, "block_size must be >= 1"),
        ({"a": 1}, None, 8, ValueError, "misses ['b']"),
        ({"a": 1, "b": 1, "z": 1}, None, 8, ValueError, "unknown components ['z']"),
        ({"a": -1, "b": 1}, None, 8, ValueError, "weights['a'] must be a finite number >= 0"),
        ({"a": float("nan"), "b": 1}, None, 8, ValueError, "weights['a']"),
        ({"a": "1", "b": 1}, None, 8, TypeError, "weights['a'] must be a number"),
        ({"a": 0, "b": 0.0}, None, 8, ValueError, "must not all be zero"),
        (None, None, 8, ValueError, "exactly one of weights= and schedule="),
        ({"a": 1, "b": 1}, [(0, {"a": 1, "b": 1})], 8, ValueError, "exactly one of"),
        (None, [], 8, TypeError, "non-empty list"),
        (None, [(8, {"a": 1, "b": 1})], 8, ValueError, "schedule[0] start must be 0"),
        (None, [(0, {"a": 1, "b": 1}), (12, {"a": 1, "b": 1})], 8, ValueError, "multiple of block_size (8)"),
        (None, [(0, {"a": 1, "b": 1}), (0, {"a": 1, "b": 1})], 8, ValueError, "starts must increase"),
        (None, [(0, {"a": 1, "b": 1}), (8, {"a": 1})], 8, ValueError, "schedule[1] weights must name exactly"),
    ],
)
def test_bad_schedules_are_refused_naming_the_problem(
    weights: object, schedule: object, block_size: int, error: type[Exception], message: str
) -> None:
    with pytest.raises(error, match=None) as raised:
        parse_schedule(("a", "b"), weights, schedule, block_size)
    assert message in str(raised.value)


def test_a_component_with_a_share_but_no_samples_is_refused() -> None:
    with pytest.raises(ValueError, match="component 'b' has no samples"):
        order([1.0, 1.0], sizes=[10, 0])


@given(count=st.integers(1, 3000), seed=st.integers(-(2**64), 2**64), number=st.integers(0, 2**40))
@settings(max_examples=60, deadline=None)
def test_each_component_pass_is_a_permutation_of_its_samples(count: int, seed: int, number: int) -> None:
    permuted = permute_many(np.arange(count), np.zeros(count, np.int64), [count], [seed], [number])
    assert sorted(permuted.tolist()) == list(range(count))


def test_passes_differ_between_seeds_and_pass_numbers() -> None:
    first = permute_many(np.arange(1000), np.zeros(1000, np.int64), [1000], [1], [0]).tolist()
    assert first != list(range(1000))
    assert first != permute_many(np.arange(1000), np.zeros(1000, np.int64), [1000], [2], [0]).tolist()
    assert first != permute_many(np.arange(1000), np.zeros(1000, np.int64), [1000], [1], [1]).tolist()


@given(
    orders=st.lists(
        st.tuples(st.integers(1, 5000), st.integers(-(2**64), 2**64), st.integers(0, 2**40)), min_size=1, max_size=6
    ),
    picks=st.lists(st.tuples(st.integers(0, 5), st.integers(0, 10**6)), min_size=1, max_size=60),
)
@settings(max_examples=100, deadline=None)
def test_many_passes_at_once_equal_passes_one_by_one(
    orders: list[tuple[int, int, int]], picks: list[tuple[int, int]]
) -> None:
    numbers = np.array([number % len(orders) for number, _ in picks], np.int64)
    positions = np.array([position % orders[n][0] for n, (_, position) in zip(numbers, picks, strict=True)], np.int64)
    counts, seeds, epochs = (list(column) for column in zip(*orders, strict=True))
    many = permute_many(positions, numbers, counts, seeds, epochs)
    one_by_one = [
        int(permute_many(np.array([p]), np.zeros(1, np.int64), [counts[n]], [seeds[n]], [epochs[n]])[0])
        for n, p in zip(numbers.tolist(), positions.tolist(), strict=True)
    ]
    assert many.tolist() == one_by_one


@pytest.mark.parametrize("count", [1, 2, 3, 7, 1024, 4394, 2**40 + 3, 2**63 - 1])
def test_a_pass_domain_covers_its_samples_tightly_with_radixes_below_2_to_the_32(count: int) -> None:
    rows, columns = pass_domain(count)
    assert count <= rows * columns < count + rows
    assert max(rows, columns) < 2**32


def test_positions_walked_together_land_where_positions_walked_alone_do() -> None:
    count = 2929  # its domain holds 11 more values, so a whole pass walks more positions than are walked alone
    together = permute_many(np.arange(count), np.zeros(count, np.int64), [count], [9], [4]).tolist()
    alone = [int(permute_many(np.array([p]), np.zeros(1, np.int64), [count], [9], [4])[0]) for p in range(count)]
    assert together == alone
