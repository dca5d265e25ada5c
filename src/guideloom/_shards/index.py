"""A local storage's shard index, ``shards.index``: the committed shards' facts, so opening reads no shard.

The index is derived data. The shard files under their names in ``shards/`` are the commits (see
``_shards.local_commit``); the index only remembers their facts (one 40-byte record per shard, see
``_shards.shard_table``) and the state of the ``shards/`` directory when they were listed, so that a
reader can tell cheaply whether anything was committed since (``_shards.freshness``). It is written
whole to a temporary file and renamed into place, never changed in place.

Layout of version 2 (little-endian; docs/format.md): an 80-byte header, then the records in ascending id::

    8s magic "GLOOMIX1"   u32 version 2   u32 digest: CRC-32 of the rest of the header and of the sum of the checks
    i64 record count      u64 shards/ inode   i64 shards/ mtime_ns   i64 shards/ ctime_ns
    i64 listed after (the file system's clock before the listing)   24 bytes zero

Version 1 (guideloom 0.3) was a 40-byte preamble and records appended by commits; its records are
read, but they prove nothing about freshness. Anything else under the name is named as damage and
bypassed: the listing and the footers say what is committed, and the index is written anew.
"""

from __future__ import annotations

import mmap
import os
import stat
import struct
import zlib
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from guideloom._shards.layout import INDEX_NAME
from guideloom._shards.shard_table import RECORD, ShardTable, last_of_each_id, sound_records

MAGIC = b"GLOOMIX1"
PREAMBLE = MAGIC + (1).to_bytes(4, "little") + bytes(RECORD.itemsize - 12)  # guideloom 0.3's index (version 1)
HEADER = struct.Struct("<8sIIqQqqq24x")  # magic, version, CRC, count, then the directory stamp (see above)
VERSION = 2
MAPPED_SIZE = 1 << 20  # an index this large (about 26,000 shards) is mapped, a smaller one read
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at once (Linux)
_SPARSE_RATIO = 8  # an index with fewer allocated bytes than this fraction of its size was never written whole


@dataclass(frozen=True)
class DirectoryStamp:
    """What ``stat`` said of ``shards/`` before a listing, and the file system's time then (``listed_after``)."""

    inode: int
    mtime_ns: int
    ctime_ns: int
    listed_after: int


@dataclass(frozen=True)
class IndexContents:
    """What an index file says: its shards' facts, the directory stamp it was listed at, what is wrong with it.

    ``stamp`` is None for an index that proves nothing about freshness (guideloom 0.3's, or none);
    ``problem`` names damage (then ``table`` holds only what can still save footer reads, or nothing).
    """

    table: ShardTable
    stamp: DirectoryStamp | None
    problem: str | None
    present: bool = True


EMPTY = ShardTable(np.empty(0, RECORD))


def read_index(path: Path) -> IndexContents:
    """What the index of the storage at ``path`` says; its size is checked before anything past its header is read."""
    try:
        descriptor = os.open(path / INDEX_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:  # a storage of guideloom 0.2, or an index deleted: the listing says it all
        return IndexContents(EMPTY, None, None, present=False)
    except OSError as error:
        return IndexContents(EMPTY, None, f"it cannot be opened ({error.strerror or error})")
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):  # a FIFO or device planted under the name
            return IndexContents(EMPTY, None, "it is not a regular file")
        head = os.pread(descriptor, HEADER.size, 0)
        if not head.startswith(MAGIC) or head[8:12] == PREAMBLE[8:12]:
            return _version_1(descriptor, status.st_size)
        return _version_2(descriptor, status, head)
    finally:
        os.close(descriptor)


def _version_2(descriptor: int, status: os.stat_result, head: bytes) -> IndexContents:
    if len(head) < HEADER.size:
        return IndexContents(EMPTY, None, f"it is cut short: {status.st_size} bytes, less than its header")
    _, version, crc, count, inode, mtime_ns, ctime_ns, listed_after = HEADER.unpack(head)
    if version != VERSION:
        return IndexContents(EMPTY, None, f"its version {version} is not one this guideloom reads")
    expected = HEADER.size + count * RECORD.itemsize if count >= 0 else -1
    if status.st_size != expected:
        return IndexContents(EMPTY, None, f"it is {status.st_size:,} bytes, but its header counts {count:,} shards")
    if status.st_size > MAPPED_SIZE and status.st_blocks * 512 * _SPARSE_RATIO < status.st_size:
        return IndexContents(EMPTY, None, f"it is a sparse file of {status.st_size:,} bytes (never written whole)")
    raw = _contents(descriptor, status.st_size)
    records = np.frombuffer(raw, RECORD, count, HEADER.size)
    if _digest(head[16:], records) != crc:
        return IndexContents(EMPTY, None, "its checksum does not match its contents")
    ids = records["id"]
    if count and (ids[0] < 0 or bool((ids[1:] <= ids[:-1]).any()) or not bool(sound_records(records).all())):
        return IndexContents(EMPTY, None, "its records are out of order or unsound")
    return IndexContents(ShardTable(records), DirectoryStamp(inode, mtime_ns, ctime_ns, listed_after), None)


def _version_1(descriptor: int, size: int) -> IndexContents:
    """An index of guideloom 0.3 (or one without any header): its sound records, which save footer reads only."""
    if size > MAPPED_SIZE and os.fstat(descriptor).st_blocks * 512 * _SPARSE_RATIO < size:
        return IndexContents(EMPTY, None, f"it is a sparse file of {size:,} bytes (never written whole)")
    raw = _contents(descriptor, size)
    has_preamble = bytes(raw[: len(PREAMBLE)]) == PREAMBLE
    start = len(PREAMBLE) if has_preamble else 0
    records = np.frombuffer(raw, RECORD, (len(raw) - start) // RECORD.itemsize, start)
    sound = sound_records(records)
    problem = None if has_preamble else "it has no header"
    if not bool(sound.all()):
        problem = f"{int((~sound).sum())} of its records are unsound"
        records = records[sound]
    return IndexContents(ShardTable(last_of_each_id(records)), None, problem)


def _contents(descriptor: int, size: int) -> bytes | mmap.mmap:
    """The file's first ``size`` bytes: mapped from the page cache when large (no copy into fresh memory, which
    at 4 MB, 10^5 shards, costs more than the rest of opening), else read. The index is replaced by rename,
    never written in place, so the mapping stays what it was; the table keeps it until ``ShardTable.detach``."""
    if size >= MAPPED_SIZE:
        return mmap.mmap(descriptor, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)
    return os.pread(descriptor, size, 0)


def _digest(header_rest: bytes, records: np.ndarray) -> int:
    """The header's digest: each record is covered by its own check (``sound_records``), all of them by their sum.

    Reading 4 MB again for a CRC of the whole file would double what opening 10^5 shards costs.
    """
    total = int(records["check"].sum(dtype=np.uint64))
    return zlib.crc32(header_rest + total.to_bytes(8, "little"))


def encode_index(table: ShardTable, stamp: DirectoryStamp) -> bytes:
    """The bytes of a version-2 index of ``table``, listed at ``stamp`` (also the format of a remote index)."""
    fields = (len(table), stamp.inode, stamp.mtime_ns, stamp.ctime_ns, stamp.listed_after)
    header = HEADER.pack(MAGIC, VERSION, 0, *fields)
    return HEADER.pack(MAGIC, VERSION, _digest(header[16:], table.rows), *fields) + table.rows.tobytes()
