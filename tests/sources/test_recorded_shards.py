"""Tests for what a state records about its shards: ranges, and a digest that names a changed shard."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import StateMismatchError
from guideloom._sources.recorded_shards import ShardSetDigest, describe_shards, parse_ranges, recorded_shards

shard_sets = st.lists(st.integers(0, 10**12 - 1), min_size=1, max_size=40, unique=True).map(sorted)


def entries(ids: list[int], changed: dict[int, int] | None = None) -> list[tuple[int, int, int]]:
    """(id, record count, checksum) of each shard; ``changed`` replaces some checksums."""
    changed = changed or {}
    return [(shard, 100 + shard % 7, changed.get(shard, shard * 31 % 2**32)) for shard in ids]


@given(ids=shard_sets)
@settings(max_examples=100, deadline=None)
def test_ranges_round_trip(ids: list[int]) -> None:
    ranges = parse_ranges(describe_shards(ids))
    assert [shard for first, last in ranges for shard in range(first, last + 1)] == ids


def test_contiguous_ids_are_one_short_range() -> None:
    assert describe_shards(list(range(10_000))) == "0-9999"
    assert describe_shards([0, 1, 2, 5, 7, 8, 9]) == "0-2, 5, 7-9"


@given(ids=shard_sets, pick=st.integers(0, 39), checksum=st.integers(0, 2**32 - 1))
@settings(max_examples=200, deadline=None)
def test_the_digest_names_the_one_changed_shard(ids: list[int], pick: int, checksum: int) -> None:
    shard = ids[pick % len(ids)]
    then = ShardSetDigest.of(entries(ids))
    now = ShardSetDigest.of(entries(ids, {shard: checksum}))
    assert then.changed_key(now) == (None if now == then else shard)


def test_the_digest_does_not_name_a_shard_when_two_changed() -> None:
    ids = list(range(100))
    then = ShardSetDigest.of(entries(ids))
    now = ShardSetDigest.of(entries(ids, {3: 1, 50: 2}))
    assert now != then and then.changed_key(now) is None


def test_a_changed_record_count_changes_the_digest() -> None:
    then = ShardSetDigest.of([(4, 10, 99)])
    assert then.changed_key(ShardSetDigest.of([(4, 11, 99)])) == 4


def test_the_digest_survives_its_text_form() -> None:
    digest = ShardSetDigest.of(entries(list(range(1000))))
    assert ShardSetDigest.from_text(digest.to_text()) == digest and len(digest.to_text()) == 50


@pytest.mark.parametrize("text", ["", "a-b", "3-1", "0-2, 1", 5])
def test_recorded_ranges_that_guideloom_never_writes_are_refused(text: object) -> None:
    if text == "":
        assert parse_ranges(text) == []
        return
    with pytest.raises(StateMismatchError):
        parse_ranges(text)


def test_a_missing_shard_is_named() -> None:
    with pytest.raises(StateMismatchError, match="shard 7 of the storage S, which the state read, is missing"):
        recorded_shards(parse_ranges("0-9"), [0, 1, 2, 3, 4, 5, 6, 8, 9, 10], "the storage S")
    assert recorded_shards(parse_ranges("0-2, 5"), [0, 1, 2, 3, 5, 6], "S") == [0, 1, 2, 5]


def test_a_crafted_huge_range_allocates_nothing() -> None:
    with pytest.raises(StateMismatchError, match="shard 3 of S"):
        recorded_shards(parse_ranges("0-999999999999"), [0, 1, 2], "S")
