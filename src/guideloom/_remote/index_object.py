"""A remote storage's index object, ``shards.index`` beside ``guideloom.json``: the facts of the shards before it.

It is derived data, written by ``storage.write_index()`` (``guideloom index URL``, the end of
``guideloom tokenize`` and of the Ray datasink), never by a commit: a shard object is committed
whether an index names it or not. The object is a 40-byte preamble and then the committed shards'
40-byte records in ascending id, the records of a local storage's index (``_shards.shard_table``)::

    8s magic "GLOOMRX1"   u32 version   u32 header checksum   u32 location check   u32 zero   u64 shard count   8x

The header checksum and the location check (CRC-32 of the storage's URL) tie the object to its
storage: another storage's index copied in is refused, as is one that is cut short, extended, damaged
(each record carries its check) or larger than any index of ``MAX_INDEXED_SHARDS`` shards. A refused
index is bypassed (readers list the whole storage) and named by ``verify``.
"""

from __future__ import annotations

import struct
import zlib

import numpy as np

from guideloom._shards.header import StorageHeader
from guideloom._shards.shard_table import RECORD, ShardTable, sound_records

INDEX_OBJECT = "shards.index"
MAGIC = b"GLOOMRX1"
VERSION = 1
PREAMBLE = struct.Struct("<8sIIIIQ8x")
MAX_INDEXED_SHARDS = 10**7  # 400 MB of records: a larger object is refused before it is read
MAX_INDEX_BYTES = PREAMBLE.size + MAX_INDEXED_SHARDS * RECORD.itemsize


def location_check(url: str) -> int:
    return zlib.crc32(url.encode())


def index_object_bytes(table: ShardTable, header: StorageHeader, url: str) -> bytes:
    """The index object of these shards (ascending, one record each) for the storage at ``url``."""
    preamble = PREAMBLE.pack(MAGIC, VERSION, header.checksum, location_check(url), 0, len(table))
    return preamble + table.rows.tobytes()


def parse_index_object(
    raw: bytes, total: int, header: StorageHeader, url: str, limit: int = MAX_INDEX_BYTES, any_location: bool = False
) -> ShardTable | str:
    """The shards an index object names, or the problem that makes it unusable (a sentence naming it).

    ``raw`` is the object's first ``limit`` bytes and ``total`` its size: a larger object is refused unread.
    ``any_location``: the index may name another storage location (files served over HTTP are a copy of a
    storage written elsewhere); its header must still match.
    """
    name = f"{url}/{INDEX_OBJECT}"
    if total > limit:
        return f"{name} has {total} bytes, more than an index of {(limit - PREAMBLE.size) // RECORD.itemsize} shards"
    if len(raw) != total:
        return f"{name} was read short ({len(raw)} of {total} bytes)"
    if total < PREAMBLE.size or raw[: len(MAGIC)] != MAGIC:
        return f"{name} is not a guideloom index object ({total} bytes, no preamble)"
    _, version, header_checksum, location, reserved, count = PREAMBLE.unpack_from(raw)
    if version != VERSION or reserved:
        return f"{name} has index version {version}, which this guideloom does not read"
    if header_checksum != header.checksum:
        return f"{name} was written for another storage header (copied from another storage?)"
    if location != location_check(url) and not any_location:
        return f"{name} was written for a storage at another location (copied from another storage?)"
    if total != PREAMBLE.size + count * RECORD.itemsize:
        return f"{name} has {total - PREAMBLE.size} bytes of records for {count} shards: cut short or extended"
    records = np.frombuffer(raw, RECORD, count, PREAMBLE.size)
    sound = sound_records(records)
    if not sound.all():
        return f"{name} has a damaged record (record {int(np.argmin(sound))} of {count})"
    ids = records["id"]
    if count > 1 and not bool((ids[1:] > ids[:-1]).all()):
        return f"{name} has records out of id order"
    return ShardTable(records)
