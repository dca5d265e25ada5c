"""A local storage's shards: a reader's snapshot mapped in place, and the hard-link commit of a writer's shard."""

from __future__ import annotations

import contextlib
from pathlib import Path

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.field_columns import ShardColumns
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import INCOMPLETE_DIR, INDEX_NAME, SHARDS_DIR, ShardFile, ShardInfo, shard_file_name
from guideloom._shards.local_commit import commit_shard, is_committed
from guideloom._shards.local_listing import reindex
from guideloom._shards.parts import ReadPlan
from guideloom._shards.shard_table import ShardTable


class LocalShards:
    """The shards of a local storage's snapshot, each mapped when first read; a reader keeps ``max_open`` mapped."""

    mapped_in_place = True

    def __init__(self, path: Path, header: StorageHeader, infos: ShardTable, max_open: int) -> None:
        self.location = str(path)
        self.path = path
        self.header = header
        self.infos = infos
        self.max_open = max_open

    def use_plan(self, plan: ReadPlan) -> None:
        """Local shards are mapped where they lie: read in parts by the page cache already."""

    def open(self, position: int, whole: bool = False) -> ShardFile:
        expected = self.infos[position]
        shard = ShardFile(self.path, expected.id, self.header)
        if shard.info != expected:
            shard.close()
            raise CorruptStorageError(
                f"shard {expected.id} does not hold what the storage's index ({INDEX_NAME}) said when the reader was "
                f"opened ({shard.info} != {expected}): it was rewritten; 'guideloom verify {self.path}' rebuilds "
                "the index"
            )
        return shard

    def record_lengths(self, position: int) -> np.ndarray | None:
        return None  # mapped in place: the reader takes them from the opened shard

    def open_columns(self, position: int, fields: frozenset[str]) -> ShardColumns | None:
        return None  # mapped in place: the reader reads the columns in the mapped shard, touching their pages alone

    def release(self, position: int, shard: ShardFile) -> None:
        shard.close()

    def prefetch(self, positions: list[int]) -> None:
        pass  # mapped in place when read

    def close(self) -> None:
        self.infos.detach()  # a large index is mapped: closing lets it go (the reader closes the shards it opened)


class LocalTarget:
    """Commit into a local storage directory: a hard link that fails if the shard exists (the commit itself).

    It remembers the facts of the shards it committed, so that the writer, when it closes, gives the
    storage an index that spares the next reader their footer reads (``write_index``).
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self.incomplete = path / INCOMPLETE_DIR
        self.committed_infos: list[ShardInfo] = []

    def committed(self, shard: int) -> bool:
        return is_committed(self.path, shard)

    def publish(self, temporary: Path, info: ShardInfo) -> bool:
        if not commit_shard(self.path, temporary, info):
            return False
        self.committed_infos.append(info)
        return True

    def write_index(self, header: StorageHeader) -> None:
        """Bring the storage's index up to date with this writer's commits (one listing; best effort)."""
        if self.committed_infos:
            with contextlib.suppress(CorruptStorageError, OSError):  # derived data: the next reader lists again
                reindex(self.path, header, ShardTable.of(self.committed_infos))
            self.committed_infos = []

    def describe(self, shard: int) -> str:
        return str(self.path / SHARDS_DIR / shard_file_name(shard))
