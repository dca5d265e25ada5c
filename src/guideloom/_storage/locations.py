"""Where a storage lives, as one protocol: a local directory or an object store, chosen once by the path's form.

A snapshot is a :class:`ShardTable`: a loader takes one when it is made (rank 0 of a job takes it for
every rank, see ``_loading.snapshot_broadcast``), pins it for its workers and states, and opens readers
over it without listing again. A storage holds one :class:`Location` (``storage.home``) and asks it
for everything that depends on where its files are: the header, snapshots and shard sets to read, the
commit target writers publish to, the index, verification, clean-up, the small records of named writes,
and facts such as the cache's limit. The storages themselves carry no ``if remote``; a new kind of place
is a new implementation of the protocol.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol, TypedDict

import numpy as np

from guideloom._core.checks import check_path
from guideloom._remote.object_store import is_url
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo
from guideloom._shards.shard_access import CommitTarget, ShardSet
from guideloom._shards.shard_table import ShardTable
from guideloom._storage.local_directory import LocalDirectory

DEFAULT_MAX_OPEN_SHARDS = 128  # shards a reader keeps open (mapped, or leased from the cache) at once


class LocationOptions(TypedDict, total=False):
    """The keyword arguments every storage takes for where it lives and how it is read there (see
    docs/object-storage.md): fsspec's ``storage_options`` (URLs only), the cache of an object store's
    shards (``cache_dir``, ``cache_limit_bytes``), the shards a reader keeps open (``max_open_shards``,
    default 128) and an object store's compressed shard objects (``compression``, ``compression_level``,
    default 3)."""

    storage_options: dict[str, Any] | None
    cache_dir: str | os.PathLike[str] | None
    cache_limit_bytes: int | None
    max_open_shards: int
    compression: str | None
    compression_level: int


class Location(Protocol):
    """One place a storage's files live; ``name`` is how messages and states name it (a path or a URL)."""

    name: str
    is_remote: bool  # whether the files are objects of a store, read through a local cache

    @property
    def path(self) -> Path:
        """The local directory; AttributeError for a storage on an object store."""
        ...

    @property
    def cache_limit(self) -> int | None: ...

    @property
    def retry_count(self) -> int: ...

    @property
    def index_problem(self) -> str | None:
        """Why the last snapshot could not use the storage's index and listed its shards instead (a damaged local
        ``shards.index``, which it rebuilt; an object store's index object, which it listed past), or None."""
        ...

    def use_compression(self, compression: str | None, level: int | None) -> None: ...

    def read_header(self) -> StorageHeader: ...

    def create(self, header: StorageHeader, existing_header: Callable[[], StorageHeader | None]) -> None:
        """Create the storage with ``header`` unless it exists; ``existing_header`` reads and checks the one found."""
        ...

    def committed_shards(self, snapshot: Callable[[], ShardTable]) -> list[int]: ...

    def committed_shard_sizes(self, header_for_reading: Callable[[], StorageHeader]) -> list[int]: ...

    def snapshot(self, header: StorageHeader) -> ShardTable: ...

    def unseen_shards(self, snapshot: ShardTable) -> np.ndarray:
        """Ids of ``snapshot`` that this process cannot see (ascending): where another rank listed them."""
        ...

    def shard_set(self, header: StorageHeader, shards: list[int] | ShardTable | None, max_open: int) -> ShardSet: ...

    def committed_facts(self, header: StorageHeader, shard: int) -> ShardInfo | None: ...

    def commit_target(self) -> CommitTarget: ...

    def incomplete_dir(self) -> Path: ...

    def write_index(self, header: StorageHeader) -> int: ...

    def verify(self, header: StorageHeader, progress: Callable[[int], None] | None) -> list[str]: ...

    def clean(self, older_than: float) -> list[Path | str]: ...

    def trust_key(self) -> str: ...

    def read_small(self, name: str) -> bytes | None:
        """A small file of the storage (a named write's record) by its relative name; None if there is none."""
        ...

    def names_in(self, folder: str) -> set[str]: ...

    def create_once(self, name: str, data: bytes) -> bool:
        """Create a small file unless it exists, atomically; True if this call created it."""
        ...


def local_path(path: object, name: str = "path") -> Path:
    """A local storage's directory: ``path`` itself, or the path of a ``file://`` URL (``name``: the argument's)."""
    if isinstance(path, str) and path.startswith("file://"):
        path = path[len("file://") :]
    return check_path(name, path)


def locate(path: object, storage_options: object, cache_dir: Path | None, cache_limit_bytes: int | None) -> Location:
    """The location of a storage opened at ``path``: an object store for a URL, else a local directory."""
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    if is_url(path):
        assert isinstance(path, str)
        from guideloom._storage.object_store_location import ObjectStoreLocation  # fsspec is imported only for URLs

        options: dict[str, Any] | None = storage_options
        return ObjectStoreLocation(path, options, cache_dir, cache_limit_bytes)
    if storage_options:
        raise ValueError(f"storage_options apply to URLs only, but path is a local path: {path!r}")
    return LocalDirectory(local_path(path))  # cache_dir and cache_limit_bytes mean nothing here: read in place
