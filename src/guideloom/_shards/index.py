"""A local storage's shard index: each committed shard's facts, so opening a storage reads no shard.

``shards.index`` (next to ``guideloom.json``) is a file of fixed 40-byte records, one per commit,
appended with ``O_APPEND`` after the shard's hard link (see docs/format.md)::

    u64 shard id   u64 record count   u64 element count   u64 file size   u32 data CRC-32   u32 check

The listing of ``shards/`` stays the truth of what is committed; the index only says what is in
each listed shard. It is derived data: a record that is torn (a writer killed while appending),
damaged (its check fails) or missing (a storage written by guideloom 0.2, a writer killed between
its link and its append) costs one footer read when the storage is opened, and the facts read
are appended for the next reader (where the storage is writable). Writers of different shards
never coordinate: each appends its own records, a reader keeps the last record of each id.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from collections.abc import Iterable, Iterator
from pathlib import Path

import numpy as np
from numpy.lib.recfunctions import repack_fields

from guideloom._shards.layout import MAX_SHARD_ID, SHARDS_DIR, ShardFile, ShardInfo, StorageHeader, committed_shard_ids

INDEX_NAME = "shards.index"
RECORD = np.dtype(
    [
        ("id", "<i8"),
        ("record_count", "<i8"),
        ("element_count", "<i8"),
        ("size", "<i8"),
        ("data_crc", "<u4"),
        ("check", "<u4"),
    ]
)
FACT_FIELDS = ("id", "record_count", "element_count", "size", "data_crc")
FACTS = np.dtype(
    [("id", "<i8"), ("record_count", "<i8"), ("element_count", "<i8"), ("size", "<i8"), ("data_crc", "<u4")]
)
_DIGITS = 10 ** np.arange(11, -1, -1, dtype=np.int64)
_SHARD_NAME = re.compile(r"[0-9]{12}\.shard")
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9), np.uint64(0x94D049BB133111EB))


class ShardTable:
    """A snapshot's shards and their facts, one row per shard in ascending id: what readers index by.

    Held as one NumPy record array (36 bytes per shard), so 10^5 shards are cheap to build, to pickle
    to worker processes and to broadcast to ranks; ``table[position]`` is that shard's :class:`ShardInfo`.
    """

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = np.ascontiguousarray(rows, FACTS)

    @classmethod
    def of(cls, infos: Iterable[ShardInfo]) -> ShardTable:
        fields = [(info.id, info.record_count, info.element_count, info.size, info.data_crc) for info in infos]
        return cls(np.array(fields, FACTS))

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, position: int) -> ShardInfo:
        row = self.rows[position]
        return ShardInfo(
            int(row["id"]), int(row["record_count"]), int(row["element_count"]), int(row["data_crc"]), int(row["size"])
        )

    def __iter__(self) -> Iterator[ShardInfo]:
        for position in range(len(self)):
            yield self[position]

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ShardTable) and np.array_equal(self.rows, other.rows)

    __hash__ = None  # type: ignore[assignment]

    @property
    def ids(self) -> np.ndarray:
        return self.rows["id"]

    def select(self, shard_ids: Iterable[int]) -> tuple[ShardTable, list[int]]:
        """The rows of these ids (ascending), and the ids that are not in the table."""
        wanted = np.asarray(list(shard_ids) if not isinstance(shard_ids, np.ndarray) else shard_ids, np.int64)
        positions = np.searchsorted(self.ids, wanted)
        found = positions < len(self)
        found[found] = self.ids[positions[found]] == wanted[found]
        return ShardTable(self.rows[positions[found]]), wanted[~found].tolist()

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards)"


def _checks(records: np.ndarray) -> np.ndarray:
    """The 32-bit check of each record's fields: a mix of them that a torn or overwritten record fails."""
    with np.errstate(over="ignore"):
        x = np.zeros(len(records), np.uint64)
        for field in FACT_FIELDS:
            x = (x ^ records[field].astype(np.uint64)) * _MIX[0]
            x ^= x >> np.uint64(29)
        x *= _MIX[1]
    return (x >> np.uint64(32)).astype(np.uint32)


def append_facts(path: Path, infos: Iterable[ShardInfo]) -> None:
    """Append these shards' facts to the index of the storage at ``path`` (one write; no fsync: derived data)."""
    table = ShardTable.of(infos)
    if not len(table):
        return
    records = np.zeros(len(table), RECORD)
    for field in FACT_FIELDS:
        records[field] = table.rows[field]
    records["check"] = _checks(records)
    descriptor = os.open(path / INDEX_NAME, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    try:
        os.write(descriptor, records.tobytes())
    finally:
        os.close(descriptor)


def read_facts(path: Path) -> np.ndarray:
    """The sound records of the index (FACTS rows, ascending id, the last record of each id); none if absent."""
    try:
        descriptor = os.open(path / INDEX_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # absent (0.2), or not a file we may read: the footers say it all
        return np.empty(0, FACTS)
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):  # a FIFO or device planted under the name
            return np.empty(0, FACTS)
        raw = _read_all(descriptor)
    finally:
        os.close(descriptor)
    records = np.frombuffer(raw, RECORD, len(raw) // RECORD.itemsize)  # a torn last record is left out
    ids = records["id"]
    sound = (_checks(records) == records["check"]) & (ids >= 0) & (ids <= MAX_SHARD_ID)
    rows: np.ndarray = repack_fields(records[list(FACT_FIELDS)] if sound.all() else records[sound][list(FACT_FIELDS)])
    ids = rows["id"]
    if len(ids) > 1 and not bool((ids[1:] > ids[:-1]).all()):  # commits out of order, or a shard indexed twice
        rows = rows[np.argsort(ids, kind="stable")]
        last = np.ones(len(rows), bool)
        last[:-1] = rows["id"][1:] != rows["id"][:-1]
        rows = rows[last]
    return rows.astype(FACTS, copy=False)


def _read_all(descriptor: int) -> bytes:
    size = os.fstat(descriptor).st_size
    chunks = []
    while size > 0 and (chunk := os.read(descriptor, size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def listed_shard_ids(path: Path) -> np.ndarray:
    """Ids of the shards listed in ``shards/`` now, ascending (int64), parsed as whole arrays."""
    try:
        names = os.listdir(path / SHARDS_DIR)
    except OSError:  # let the one listing function say precisely what is wrong
        return np.asarray(committed_shard_ids(path), np.int64)
    joined = "".join(names)
    candidates = names if len(joined) == 18 * len(names) else [name for name in names if len(name) == 18]
    encoded = (joined if candidates is names else "".join(candidates)).encode("utf-8", "surrogateescape")
    if len(encoded) != 18 * len(candidates):  # a name with non-ASCII characters: the careful way
        return np.asarray(sorted(int(name[:12]) for name in candidates if _SHARD_NAME.fullmatch(name)), np.int64)
    characters = np.frombuffer(encoded, np.uint8).reshape(-1, 18)
    digits = characters[:, :12]
    valid = ((digits >= ord("0")) & (digits <= ord("9"))).all(axis=1)
    valid &= (characters[:, 12:] == np.frombuffer(b".shard", np.uint8)).all(axis=1)
    ids: np.ndarray = (digits[valid].astype(np.int64) - ord("0")) @ _DIGITS
    ids.sort()
    return ids


def local_snapshot(path: Path, header: StorageHeader) -> ShardTable:
    """The shards committed now at ``path``: one listing and the index; a footer read per shard the index lacks."""
    ids = listed_shard_ids(path)
    facts = read_facts(path)
    if np.array_equal(facts["id"], ids):  # the usual case: the index knows every listed shard, and no other
        return ShardTable(facts)
    positions = np.searchsorted(facts["id"], ids)
    known = positions < len(facts)
    known[known] = facts["id"][positions[known]] == ids[known]
    rows = np.empty(len(ids), FACTS)
    rows[known] = facts[positions[known]]
    missing = ids[~known].tolist()
    if missing:
        found = [footer_facts(path, shard, header) for shard in missing]
        rows[~known] = ShardTable.of(found).rows
        with contextlib.suppress(OSError):  # read-only storage: the next reader reads the footers again
            append_facts(path, found)
    return ShardTable(rows)


def footer_facts(path: Path, shard: int, header: StorageHeader) -> ShardInfo:
    """A shard's facts from its footer (the file is opened, checked as a reader checks it, and closed)."""
    opened = ShardFile(path, shard, header)
    try:
        return opened.info
    finally:
        opened.close()
