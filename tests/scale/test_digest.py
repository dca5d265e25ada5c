"""The shard digest and fingerprints, computed over whole arrays, equal the per-shard formulas they replace.

States written before (per-shard Python loops) must still compare equal, so the reference formulas
are spelled out here as guideloom 0.2 computed them; today's fingerprint is spelled out as well.
"""

from __future__ import annotations

import zlib

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom._shards.fingerprints import earlier_fingerprint, snapshot_fingerprint
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.recorded_shards import PRIME, ShardSetDigest, describe_shards
from tests.shards.test_shard_table import reference_check

MASK64 = (1 << 64) - 1


def reference_digest(shards: list[tuple[int, int, int]]) -> tuple[int, int, int]:
    a = b = c = 0
    for key, record_count, checksum in shards:
        x = (key * 0x9E3779B97F4A7C15 ^ record_count * 0xC2B2AE3D27D4EB4F ^ checksum) & MASK64
        for multiplier in (0xBF58476D1CE4E5B9, 0x94D049BB133111EB):
            x = ((x ^ (x >> 31)) * multiplier) & MASK64
        h = x % (PRIME - 1) + 1
        a, b, c = (a + h) % PRIME, (b + key * h) % PRIME, (c + key * key % PRIME * h) % PRIME
    return a, b, c


def assert_fingerprint_is_the_per_shard_loop(infos: list[ShardInfo]) -> None:
    """The snapshot's fingerprint is the CRC of the sum of the shards' record checks; the fingerprint states recorded
    before is guideloom 0.2's CRC over each shard's id, record count and checksum."""
    header = StorageHeader("tokens", dtype="uint16")
    table, records = ShardTable.of(infos), sum(info.record_count for info in infos)
    checks = sum(reference_check(info) for info in table)
    crc = zlib.crc32(checks.to_bytes(8, "little"), zlib.crc32(header.to_json()))
    assert snapshot_fingerprint(header, table) == f"{crc:08x}-{len(infos)}-{records}"
    crc = zlib.crc32(header.to_json())
    for info in infos:
        crc = zlib.crc32(np.array([info.id, info.record_count, info.data_crc], "<u8").tobytes(), crc)
    assert earlier_fingerprint(header, table) == f"{crc:08x}-{len(infos)}-{records}"


shard_entries = st.lists(
    st.tuples(st.integers(0, 2**60), st.integers(0, 2**40), st.integers(0, 2**32 - 1)), max_size=60
)


@settings(max_examples=200, deadline=None)
@given(shard_entries)
def test_the_digest_of_arrays_is_the_per_shard_sum(shards: list[tuple[int, int, int]]) -> None:
    digest = ShardSetDigest.of(shards)
    assert (digest.a, digest.b, digest.c) == reference_digest(shards)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(0, 10**12 - 1), unique=True, max_size=40))
def test_ranges_and_fingerprint_match_the_per_shard_loops(ids: list[int]) -> None:
    ids.sort()
    infos = [ShardInfo(shard, shard % 7, shard % 11, zlib.crc32(str(shard).encode()), 100) for shard in ids]
    assert_fingerprint_is_the_per_shard_loop(infos)
    ranges = []
    for shard in ids:
        if ranges and ranges[-1][1] == shard - 1:
            ranges[-1][1] = shard
        else:
            ranges.append([shard, shard])
    expected = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges) or "none"
    assert describe_shards(ids) == expected


def test_digest_and_fingerprint_of_more_shards_than_a_chunk_match_the_per_shard_loops() -> None:
    rng = np.random.default_rng(3)
    shards = [(int(k), int(r), int(c)) for k, r, c in rng.integers(0, 2**32, (20_000, 3))]
    digest = ShardSetDigest.of(shards)
    assert (digest.a, digest.b, digest.c) == reference_digest(shards)
    infos = [ShardInfo(shard, shard % 7, shard % 11, shard * 3, 100) for shard in range(20_000)]
    assert_fingerprint_is_the_per_shard_loop(infos)
