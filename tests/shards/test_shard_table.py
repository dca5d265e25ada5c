"""The shard index's records and their checks: what a torn, zeroed, shifted or flipped record looks like."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from guideloom._shards.layout import MAX_SHARD_ID, ShardInfo
from guideloom._shards.shard_table import RECORD, ShardTable, last_of_each_id, record_checks, sound_records


def reference_check(info: ShardInfo) -> int:
    """A record's check as docs/format.md defines it, in plain integers: bits 32..63 of a weighted sum."""
    words = (info.id, info.record_count, info.element_count, info.size, info.data_crc)
    weights = (0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93, 0xA0761D6478BD642F)
    total = 0x6A09E667F3BCC908 + sum(word * weight for word, weight in zip(words, weights, strict=True))
    return (total >> 32) & 0xFFFFFFFF


infos = st.builds(
    ShardInfo,
    st.integers(0, MAX_SHARD_ID),
    st.integers(0, 2**40),
    st.integers(0, 2**50),
    st.integers(0, 2**32 - 1),
    st.integers(0, 2**60),
)


@given(st.lists(infos, min_size=1, max_size=50), st.data())
def test_one_flipped_bit_anywhere_fails_the_record_s_check(shards: list[ShardInfo], data: st.DataObject) -> None:
    records = np.array(ShardTable.of(shards).rows)
    assert sound_records(records).all()
    raw = bytearray(records.tobytes())
    bit = data.draw(st.integers(0, len(raw) * 8 - 1))
    raw[bit // 8] ^= 1 << (bit % 8)
    damaged = np.frombuffer(bytes(raw), RECORD)
    assert sound_records(damaged).tolist().count(False) == 1


def test_a_record_of_zeros_and_a_shifted_record_fail() -> None:
    records = ShardTable.of([ShardInfo(shard, 2, 16, shard, 200) for shard in range(3)]).rows
    assert not sound_records(np.zeros(1, RECORD)).any()
    shifted = np.frombuffer(records.tobytes()[8:-32], RECORD)
    assert not sound_records(shifted).any()


@given(st.lists(infos, min_size=1, max_size=20))
def test_each_check_is_the_documented_formula(shards: list[ShardInfo]) -> None:
    records = ShardTable.of(shards).rows
    expected = {info.id: reference_check(info) for info in shards}  # the last of an id wins, as in the table
    assert records["check"].tolist() == [expected[shard] for shard in records["id"].tolist()]


def test_a_record_naming_an_impossible_id_is_not_sound_however_well_checked() -> None:
    records = np.array(ShardTable.of([ShardInfo(shard, 1, 1, 0, 1) for shard in range(4)]).rows)
    for shard in (-1, MAX_SHARD_ID + 1):
        records["id"][2] = shard
        records["check"] = record_checks(records)
        assert sound_records(records).tolist() == [True, True, False, True]


def test_checks_are_the_same_a_chunk_at_a_time_or_whole() -> None:
    shards = [ShardInfo(shard, shard % 7, shard * 3, shard * 11, shard * 13) for shard in range(40_000)]
    records = ShardTable.of(shards).rows
    assert np.array_equal(record_checks(records), records["check"])
    assert np.array_equal(record_checks(records[::3]), records["check"][::3])


def test_the_last_record_of_an_id_wins_and_ids_come_out_ascending() -> None:
    table = ShardTable.of([ShardInfo(5, 1, 1, 0, 1), ShardInfo(2, 1, 1, 0, 1), ShardInfo(5, 9, 9, 0, 9)])
    assert table.ids.tolist() == [2, 5] and table[1].record_count == 9
    assert len(last_of_each_id(table.rows)) == 2
