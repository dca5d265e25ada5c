"""A snapshot's shards and their facts as one NumPy table: what readers index by, states digest and ranks share.

A row is the shard index's own 40-byte record (see ``_shards.index``), so the table read from a
local storage's index is that file's bytes, not a copy of them field by field::

    i64 shard id   i64 record count   i64 element count   i64 file size   u32 data CRC-32   u32 check
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from guideloom._shards.layout import MAX_SHARD_ID, ShardInfo

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
_SEED = np.uint64(0x6A09E667F3BCC908)  # so that a record of zeros (a hole a crash left) fails its check
_MIX = (np.uint64(0x9E3779B97F4A7C15), np.uint64(0xBF58476D1CE4E5B9))
_SHIFT, _HALF = np.uint64(29), np.uint64(32)


CHUNK = 8192  # records mixed at a time: the work stays in the processor's caches


def record_checks(records: np.ndarray) -> np.ndarray:
    """The 32-bit check of each record's five facts: a mix of them that a torn, shifted or zeroed record fails."""
    checks = np.empty(len(records), np.uint32)
    x, shifted = np.empty(CHUNK, np.uint64), np.empty(CHUNK, np.uint64)
    for start in range(0, len(records), CHUNK):
        part = records[start : start + CHUNK]
        mixed, spare = x[: len(part)], shifted[: len(part)]
        mixed.fill(_SEED)
        for field in FACT_FIELDS:
            column = part[field]
            np.bitwise_xor(mixed, column.view(np.uint64) if column.dtype.itemsize == 8 else column, out=mixed)
            np.multiply(mixed, _MIX[0], out=mixed)
            np.right_shift(mixed, _SHIFT, out=spare)
            np.bitwise_xor(mixed, spare, out=mixed)
        np.multiply(mixed, _MIX[1], out=mixed)
        np.right_shift(mixed, _HALF, out=mixed)
        checks[start : start + len(part)] = mixed
    return checks


def sound_records(records: np.ndarray) -> np.ndarray:
    """Which records pass their check and name a valid shard id (a bool per record)."""
    ids = records["id"]
    sound: np.ndarray = (record_checks(records) == records["check"]) & (ids >= 0) & (ids <= MAX_SHARD_ID)
    return sound


def last_of_each_id(records: np.ndarray) -> np.ndarray:
    """``records`` in ascending id, keeping the last record of an id written more than once (as appended)."""
    ids = records["id"]
    if len(ids) < 2 or bool((ids[1:] > ids[:-1]).all()):  # the usual case: commits in id order, each once
        return records
    ordered = records[np.argsort(ids, kind="stable")]
    last = np.ones(len(ordered), bool)
    last[:-1] = ordered["id"][1:] != ordered["id"][:-1]
    return ordered[last]


class ShardTable:
    """A snapshot's shards and their facts, one row per shard in ascending id: what readers index by.

    Held as one NumPy record array (40 bytes per shard), so 10^5 shards are cheap to build, to pickle
    to worker processes and to broadcast to ranks; ``table[position]`` is that shard's :class:`ShardInfo`.
    """

    def __init__(self, rows: np.ndarray) -> None:
        self.rows = np.ascontiguousarray(rows, RECORD)

    @classmethod
    def of(cls, infos: Iterable[ShardInfo]) -> ShardTable:
        fields = [(info.id, info.record_count, info.element_count, info.size, info.data_crc, 0) for info in infos]
        rows = np.array(fields, RECORD)
        rows["check"] = record_checks(rows)
        return cls(last_of_each_id(rows))

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

    def lacking(self, shard_ids: np.ndarray) -> np.ndarray:
        """Those of ``shard_ids`` (ascending int64) that are not in the table."""
        positions = np.searchsorted(self.ids, shard_ids)
        found = positions < len(self)
        found[found] = self.ids[positions[found]] == shard_ids[found]
        missing: np.ndarray = shard_ids[~found]
        return missing

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards)"
