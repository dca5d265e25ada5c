"""Snapshots: the shards a reader reads and their facts, taken from one listing, and the shard set over them.

A snapshot is a :class:`ShardTable`. A loader takes one when it is made (rank 0 of a job takes it
for every rank, see ``_loading.job_snapshot``), pins it for its workers and its states, and opens
readers over it without listing again; a reader opened by shard ids takes a fresh one and selects.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.files import LocalShards
from guideloom._shards.header import StorageHeader
from guideloom._shards.index import append_records, read_index, replace_index
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.snapshot import footer_facts, listed_shard_ids, local_snapshot

DEFAULT_MAX_OPEN_SHARDS = 128


def local_shard_set(
    path: Path, header: StorageHeader, shards: list[int] | ShardTable | None, max_open: int
) -> LocalShards:
    """The shard set of the local storage at ``path`` over a snapshot, these ids (each committed) or all now."""
    table = shards if isinstance(shards, ShardTable) else selected(local_snapshot(path, header), shards, str(path))
    return LocalShards(path, header, table, max_open)


def selected(table: ShardTable, shard_ids: list[int] | None, location: str) -> ShardTable:
    """The rows of ``table`` for these ids (all of them if None); a missing one is named as vanished."""
    if shard_ids is None:
        return table
    chosen, missing = table.select(shard_ids)
    if missing:
        raise CorruptStorageError(f"shard {missing[0]} vanished: it is no longer listed at {location}")
    return chosen


def rewrite_local_index(path: Path, header: StorageHeader) -> int:
    """Write the local storage's shard index afresh from its listing (the index's sound records spare
    footer reads); the number of shards it names."""
    known, unknown = read_index(path).table.select(listed_shard_ids(path))
    found = ShardTable.of(footer_facts(path, shard, header) for shard in unknown)
    table = ShardTable(np.sort(np.concatenate([known.rows, found.rows]), order="id")) if unknown else known
    replace_index(path, table)
    later = table.lacking(listed_shard_ids(path))  # committed while we listed: their records may be lost
    if len(later):
        append_records(path, ShardTable.of(footer_facts(path, int(shard), header) for shard in later), durable=True)
    return len(table) + len(later)
