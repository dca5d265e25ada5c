"""Where a storage's bytes live, as readers and writers see it: shard sets to read, targets to commit to.

Readers index shards by their :class:`ShardInfo` and open them through a :class:`ShardSet`; writers
build shards in a local directory and hand them to a :class:`CommitTarget`. The local implementations
here map the storage's own files and commit by hard link; the remote ones (``_remote.remote_files``) download
into a cache and commit by upload. Neither readers nor writers know which they have.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from pathlib import Path
from typing import Protocol

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import INCOMPLETE_DIR, INDEX_NAME, SHARDS_DIR, ShardFile, ShardInfo, shard_file_name
from guideloom._shards.local_commit import commit_shard, is_committed
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.snapshot import refresh_snapshot


class ShardSet(Protocol):
    """The shards a reader reads, in order: their facts up front, each shard opened on demand."""

    infos: ShardTable
    location: str
    max_open: int  # how many shards a reader keeps open at once

    def open(self, position: int) -> ShardFile: ...

    def release(self, position: int, shard: ShardFile) -> None: ...

    def prefetch(self, positions: list[int]) -> None: ...

    def close(self) -> None: ...


class CommitTarget(Protocol):
    """Where a writer's finished shards go: ``publish`` is the commit, atomic and at most once per shard id."""

    incomplete: Path  # a local directory for shards being built

    def committed(self, shard: int) -> bool: ...

    def publish(self, temporary: Path, info: ShardInfo) -> bool: ...

    def describe(self, shard: int) -> str: ...


class LocalShards:
    """The shards of a local storage's snapshot, each mapped when first read; a reader keeps ``max_open`` mapped."""

    def __init__(self, path: Path, header: StorageHeader, infos: ShardTable, max_open: int) -> None:
        self.location = str(path)
        self.path = path
        self.header = header
        self.infos = infos
        self.max_open = max_open

    def open(self, position: int) -> ShardFile:
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
                refresh_snapshot(self.path, header, ShardTable.of(self.committed_infos))
            self.committed_infos = []

    def describe(self, shard: int) -> str:
        return str(self.path / SHARDS_DIR / shard_file_name(shard))


def clean_incomplete(incomplete: Path, older_than: float) -> list[Path]:
    """Delete the files in ``incomplete`` untouched for ``older_than`` seconds (what dead writers left).

    Never through a symlink: a crafted storage must not make clean delete files elsewhere.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        directory = os.open(incomplete, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return removed
    except OSError as error:
        reason = error.strerror or error
        raise CorruptStorageError(f"{incomplete} is not a directory ({reason}): nothing cleaned") from None
    try:
        for entry in os.scandir(directory):
            with contextlib.suppress(FileNotFoundError):
                status = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(status.st_mode):  # writers make files only: not theirs, left alone
                    continue
                if now - status.st_mtime >= older_than:
                    os.unlink(entry.name, dir_fd=directory)  # a symlink goes, not its target
                    removed.append(incomplete / entry.name)
    finally:
        os.close(directory)
    return removed


def first_positions(positions: np.ndarray, limit: int) -> list[int]:
    """The first ``limit`` distinct values of ``positions``, in order of first appearance."""
    seen: dict[int, None] = {}
    for position in positions.tolist():
        if position not in seen:
            seen[position] = None
            if len(seen) >= limit:
                break
    return list(seen)
