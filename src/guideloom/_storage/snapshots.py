"""Snapshots: the shards a reader reads and their facts, taken from one listing, and the shard set over them.

A snapshot is a :class:`ShardTable`. A loader takes one when it is made (rank 0 of a job takes it
for every rank, see ``_loading.job_snapshot``), pins it for its workers and its states, and opens
readers over it without listing again; a reader opened by shard ids takes a fresh one and selects.
"""

from __future__ import annotations

from pathlib import Path

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.files import LocalShards
from guideloom._shards.header import StorageHeader
from guideloom._shards.index import EMPTY
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.snapshot import local_snapshot, refresh_snapshot

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
    """Write the local storage's shard index afresh from one listing (the index's sound records spare footer
    reads); the number of shards it names."""
    return len(refresh_snapshot(path, header, EMPTY))
