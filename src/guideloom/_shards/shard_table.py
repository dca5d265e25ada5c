"""A snapshot's shards and their facts as one NumPy table: what readers index by, states digest and ranks share.

A row is the shard index's own 40-byte record (see ``_shards.index``), so the table read from a
local storage's index is that file's bytes, not a copy of them field by field::

    i64 shard id   i64 record count   i64 element count   i64 file size   u32 data CRC-32   u32 check
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.layout import ShardInfo
from guideloom._shards.shard_names import MAX_SHARD_ID

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
# The check: bits 32..63 of SEED + Σ word_i · K_i (mod 2**64) over the record's five 64-bit words, the
# last one without the check itself. Any flip of one bit changes it, as do zeros (a hole a crash left)
# and a record shifted out of place; it is meant against accidents, not forgery.
_SEED = np.uint64(0x6A09E667F3BCC908)
_WEIGHTS = np.array(
    [0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9, 0x94D049BB133111EB, 0xD6E8FEB86659FD93, 0xA0761D6478BD642F], np.uint64
)
_MAX_ID = np.uint64(MAX_SHARD_ID)
CHUNK = 16384  # records checked at a time: the work stays in the processor's caches


def record_checks(records: np.ndarray) -> np.ndarray:
    """The 32-bit check of each record's five facts (see above), computed a chunk at a time."""
    checks = np.empty(len(records), np.uint32)
    for start, part in _chunks(records):
        checks[start : start + len(part)] = part
    return checks


def sound_records(records: np.ndarray) -> np.ndarray:
    """Which records pass their check and name a valid shard id (a bool per record)."""
    stored = np.ascontiguousarray(records, RECORD)
    stored_checks = stored.view(np.uint32).reshape(-1, 10)[:, 9]
    sound = np.empty(len(stored), bool)
    for start, part in _chunks(stored):
        np.equal(part, stored_checks[start : start + len(part)], out=sound[start : start + len(part)])
    ids = stored["id"].view(np.uint64)  # a negative id is a huge one here
    if len(ids) and ids.max() > _MAX_ID:  # one pass without a temporary in the usual case, where none is
        sound &= ids <= _MAX_ID
    return sound


def _chunks(records: np.ndarray) -> Iterator[tuple[int, np.ndarray]]:
    """Each chunk's first position and its records' checks (uint32, a view of a buffer the next chunk reuses)."""
    stored = np.ascontiguousarray(records, RECORD)
    words, halves = stored.view(np.uint64).reshape(-1, 5), stored.view(np.uint32).reshape(-1, 10)
    mixed, term = np.empty(min(CHUNK, len(words)), np.uint64), np.empty(min(CHUNK, len(words)), np.uint64)
    for start in range(0, len(words), CHUNK):
        part = words[start : start + CHUNK]
        total, spare = mixed[: len(part)], term[: len(part)]
        np.multiply(halves[start : start + len(part), 8], _WEIGHTS[4], out=total)  # the data CRC, the check left out
        total += _SEED
        for column in range(4):
            np.multiply(part[:, column], _WEIGHTS[column], out=spare)
            total += spare
        yield start, total.view(np.uint32)[1::2]  # bits 32..63 (little-endian, as the records are stored)


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

    def detach(self) -> None:
        """Hold the rows in memory of the table's own, so that the index file they were mapped from is let go."""
        if not self.rows.flags.owndata:
            self.rows = self.rows.copy()

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
        positions, found = self._find(wanted)
        return ShardTable(self.rows[positions[found]]), wanted[~found].tolist()

    def lacking(self, shard_ids: np.ndarray) -> np.ndarray:
        """Those of ``shard_ids`` (ascending int64) that are not in the table."""
        missing: np.ndarray = shard_ids[~self._find(shard_ids)[1]]
        return missing

    def _find(self, shard_ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Where each of ``shard_ids`` is in the table, and whether it is there at all."""
        positions = np.searchsorted(self.ids, shard_ids)
        found = positions < len(self)
        found[found] = self.ids[positions[found]] == shard_ids[found]
        return positions, found

    def __repr__(self) -> str:
        return f"ShardTable({len(self)} shards)"


def selected(table: ShardTable, shard_ids: list[int] | None, location: str) -> ShardTable:
    """The rows of ``table`` for these ids (all of them if None); a missing one is named as vanished."""
    if shard_ids is None:
        return table
    chosen, missing = table.select(shard_ids)
    if missing:
        raise CorruptStorageError(f"shard {missing[0]} vanished: it is no longer listed at {location}")
    return chosen
