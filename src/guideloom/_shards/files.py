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
from guideloom._shards.layout import (
    INCOMPLETE_DIR,
    SHARDS_DIR,
    ShardFile,
    ShardInfo,
    StorageHeader,
    committed_shard_ids,
    publish,
    shard_file_name,
)


class ShardSet(Protocol):
    """The shards a reader reads, in order: their infos up front, each shard opened on demand."""

    infos: list[ShardInfo]
    location: str
    max_open: int | None  # how many shards a reader should keep open at once (None: all)

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
    """The committed shards of a local storage, all mapped when the set is made (as readers always did)."""

    def __init__(self, path: Path, header: StorageHeader, shard_ids: list[int] | None = None) -> None:
        self.location = str(path)
        self.max_open: int | None = None
        self._files: list[ShardFile] = []
        try:
            for shard in committed_shard_ids(path) if shard_ids is None else shard_ids:
                self._files.append(ShardFile(path, shard, header))
        except BaseException:
            self.close()
            raise
        self.infos = [shard.info for shard in self._files]

    def open(self, position: int) -> ShardFile:
        return self._files[position]

    def release(self, position: int, shard: ShardFile) -> None:
        pass  # mapped for the set's whole life

    def prefetch(self, positions: list[int]) -> None:
        pass

    def close(self) -> None:
        for shard in self._files:
            shard.close()
        self._files = []


class LocalTarget:
    """Commit into a local storage directory: a hard link that fails if the shard exists."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.incomplete = path / INCOMPLETE_DIR

    def committed(self, shard: int) -> bool:
        return (self.path / SHARDS_DIR / shard_file_name(shard)).exists()

    def publish(self, temporary: Path, info: ShardInfo) -> bool:
        return publish(temporary, self.path / SHARDS_DIR / shard_file_name(info.id))

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
