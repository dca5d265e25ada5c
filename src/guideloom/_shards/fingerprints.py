"""A snapshot's fingerprint: what a loader state records to recognise the exact shards it read."""

from __future__ import annotations

import zlib

import numpy as np

from guideloom._shards.header import StorageHeader
from guideloom._shards.shard_table import CHUNK, ShardTable


def snapshot_fingerprint(header: StorageHeader, infos: ShardTable) -> str:
    """The CRC-32 of the header and of the sum of the shards' record checks, the shard count and the records.

    A record's check hashes all its facts (id, record and token counts, size, data checksum), and a
    snapshot holds each id once, in ascending order, so their sum identifies the shards as a CRC over
    every fact would, from one pass over 4 bytes a shard.
    """
    rows = infos.rows
    checks = int(rows["check"].sum(dtype=np.uint64))  # at most 2**32 a shard: no wrap below 2**32 shards
    crc = zlib.crc32(checks.to_bytes(8, "little"), zlib.crc32(header.to_json()))
    return f"{crc:08x}-{len(infos)}-{int(rows['record_count'].sum())}"


def earlier_fingerprint(header: StorageHeader, infos: ShardTable) -> str:
    """The fingerprint guideloom 0.2 and the first 0.3 builds recorded in states: the CRC-32 of the header and
    each shard's id, record count and checksum, the shard count and the records."""
    rows, crc = infos.rows, zlib.crc32(header.to_json())
    entries = np.empty((min(len(rows), CHUNK), 3), "<u8")  # a chunk at a time: it stays in the caches
    for start in range(0, len(rows), CHUNK):
        part = rows[start : start + CHUNK]
        chunk = entries[: len(part)]
        chunk[:, 0], chunk[:, 1], chunk[:, 2] = part["id"], part["record_count"], part["data_crc"]
        crc = zlib.crc32(chunk.data, crc)
    return f"{crc:08x}-{len(infos)}-{int(rows['record_count'].sum())}"
