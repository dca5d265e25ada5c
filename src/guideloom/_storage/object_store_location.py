"""A storage on an object store (an fsspec URL): shards downloaded into a local cache, committed by upload."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._remote.remote_files import RemoteFiles, RemoteTarget
from guideloom._remote.remote_shards import RemoteShards
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo
from guideloom._shards.shard_table import ShardTable, selected


class ObjectStoreLocation:
    """The objects under one URL and this machine's cache of them (see docs/object-storage.md)."""

    is_remote = True

    def __init__(
        self, url: str, options: dict[str, Any] | None, cache_dir: Path | None, cache_limit_bytes: int | None
    ) -> None:
        self.files = RemoteFiles(url, options, cache_dir, cache_limit_bytes)
        self.name = self.files.url
        self._listed: ShardTable | None = None  # the last snapshot: readers of ids it holds need no new listing

    @property
    def path(self) -> Path:
        raise AttributeError(f"{self.name} is a storage on an object store: it has no local path")

    @property
    def cache_limit(self) -> int | None:
        return self.files.cache.limit_bytes

    @property
    def retry_count(self) -> int:
        return self.files.store.retrying.count

    @property
    def index_problem(self) -> str | None:
        return self.files.index_problem

    def use_compression(self, compression: str | None, level: int | None) -> None:
        self.files.compression = compression
        self.files.compression_level = self.files.compression_level if level is None else level

    def read_header(self) -> StorageHeader:
        return self.files.read_header()

    def create(self, header: StorageHeader, existing_header: Callable[[], StorageHeader | None]) -> None:
        if existing_header() is None:
            self.files.create_header(header)
            existing_header()  # if another writer created it first, it must match

    def committed_shards(self, snapshot: Callable[[], ShardTable]) -> list[int]:
        return snapshot().ids.tolist()  # type: ignore[no-any-return]

    def committed_shard_sizes(self, header_for_reading: Callable[[], StorageHeader]) -> list[int]:
        return self.snapshot(header_for_reading()).rows["size"].tolist()  # type: ignore[no-any-return]

    def snapshot(self, header: StorageHeader) -> ShardTable:
        """The index object's shards and a listing of what it cannot know (``_remote.indexed_listing``)."""
        self._listed = self.files.list_shards(header)
        return self._listed

    def unseen_shards(self, snapshot: ShardTable) -> np.ndarray:
        return np.empty(0, np.int64)  # every rank sees the same objects; one gone later is named when downloaded

    def shard_set(self, header: StorageHeader, shards: list[int] | ShardTable | None, max_open: int) -> RemoteShards:
        if not isinstance(shards, ShardTable):
            listed = self._listed
            if shards is None or listed is None or len(listed.lacking(np.asarray(sorted(shards), np.int64))):
                listed = self.snapshot(header)
            shards = selected(listed, shards, self.name)
        return RemoteShards(self.files, header, shards, max_open)

    def committed_facts(self, header: StorageHeader, shard: int) -> ShardInfo | None:
        found, _ = self.snapshot(header).select([shard])
        return found[0] if len(found) else None

    def commit_target(self) -> RemoteTarget:
        return RemoteTarget(self.files)

    def incomplete_dir(self) -> Path:
        return self.commit_target().incomplete

    def write_index(self, header: StorageHeader) -> int:
        return self.files.write_index(header)

    def verify(self, header: StorageHeader, progress: Callable[[int], None] | None) -> list[str]:
        return self.files.verify(header, progress)

    def clean(self, older_than: float) -> list[Path | str]:
        """What dead writers and loaders left (``RemoteFiles.clean``)."""
        return list(self.files.clean(older_than))

    def trust_key(self) -> str:
        return self.name

    def read_small(self, name: str) -> bytes | None:
        return self.files.store.read(name)

    def names_in(self, folder: str) -> set[str]:
        return set(self.files.store.listing(folder))

    def create_once(self, name: str, data: bytes) -> bool:
        return self.files.store.create(name, data)
