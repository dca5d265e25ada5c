"""A storage in a local directory: shards mapped in place, committed by hard link, indexed by ``shards.index``."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from pathlib import Path

import numpy as np

from guideloom._shards.header import HEADER_NAME, MAX_HEADER_BYTES, StorageHeader, read_header
from guideloom._shards.index import EMPTY
from guideloom._shards.layout import (
    INCOMPLETE_DIR,
    SHARDS_DIR,
    ShardFile,
    ShardInfo,
    committed_shard_ids,
    fsync_directory,
    holds_storage,
    incomplete_dir,
    publish,
)
from guideloom._shards.local_commit import is_committed
from guideloom._shards.local_listing import local_snapshot, reindex, visible_shard_ids
from guideloom._shards.local_shards import LocalShards, LocalTarget
from guideloom._shards.shard_table import ShardTable, selected
from guideloom._shards.upkeep import clean_local, verify_local


class LocalDirectory:
    """The directory ``path`` holding a storage's header, ``shards/``, ``incomplete/`` and its index."""

    is_remote = False
    cache_limit = None  # read in place: no cache
    retry_count = 0

    def __init__(self, path: Path) -> None:
        self.path = path
        self.name = str(path)
        self.index_problem: str | None = None  # why the last snapshot could not use shards.index (it rebuilt it)

    def use_compression(self, compression: str | None, level: int | None) -> None:
        pass  # local shards are never compressed (the storages refuse it before)

    def read_header(self) -> StorageHeader:
        return read_header(self.path)

    def create(self, header: StorageHeader, existing_header: Callable[[], StorageHeader | None]) -> None:
        try:
            for directory in (self.path, self.path / SHARDS_DIR, self.path / INCOMPLETE_DIR):
                directory.mkdir(parents=True, exist_ok=True)
        except (FileExistsError, NotADirectoryError):
            files = [part for part in (self.path, *self.path.parents) if part.exists() and not part.is_dir()]
            if not files:
                raise
            raise NotADirectoryError(f"cannot create a storage at {self.path}: {files[-1]} is a file") from None
        if existing_header() is None:
            temporary = self.path / INCOMPLETE_DIR / f"{HEADER_NAME}.{uuid.uuid4().hex}"
            with open(temporary, "xb") as file:
                file.write(header.to_json())
                file.flush()
                os.fsync(file.fileno())
            if not publish(temporary, self.path / HEADER_NAME):
                existing_header()  # another writer created it first: it must match
            fsync_directory(self.path.parent)

    def committed_shards(self, snapshot: Callable[[], ShardTable]) -> list[int]:
        if not holds_storage(self.path):
            return committed_shard_ids(self.path)  # [], or the precise error of a path that holds no storage
        return snapshot().ids.tolist()  # type: ignore[no-any-return]

    def committed_shard_sizes(self, header_for_reading: Callable[[], StorageHeader]) -> list[int]:
        if not holds_storage(self.path):
            return []
        return self.snapshot(read_header(self.path)).rows["size"].tolist()  # type: ignore[no-any-return]

    def snapshot(self, header: StorageHeader) -> ShardTable:
        """The shards committed now, from the shard index where it is current (see ``_shards.local_listing``); a
        damaged index is bypassed (and rebuilt), and ``index_problem`` says why."""
        table, self.index_problem = local_snapshot(self.path, header)
        return table

    def unseen_shards(self, snapshot: ShardTable) -> np.ndarray:
        return np.setdiff1d(snapshot.ids, visible_shard_ids(self.path), assume_unique=True)

    def shard_set(self, header: StorageHeader, shards: list[int] | ShardTable | None, max_open: int) -> LocalShards:
        """The shard set over a snapshot, these ids (each committed) or all committed now."""
        table = shards if isinstance(shards, ShardTable) else selected(self.snapshot(header), shards, self.name)
        return LocalShards(self.path, header, table, max_open)

    def committed_facts(self, header: StorageHeader, shard: int) -> ShardInfo | None:
        if not is_committed(self.path, shard):
            return None
        committed = ShardFile(self.path, shard, header)
        try:
            return committed.info
        finally:
            committed.close()

    def commit_target(self) -> LocalTarget:
        return LocalTarget(self.path)

    def incomplete_dir(self) -> Path:
        return incomplete_dir(self.path)

    def write_index(self, header: StorageHeader) -> int:
        """Write the shard index afresh from one listing (the old index's sound records spare footer reads)."""
        return len(reindex(self.path, header, EMPTY))

    def verify(self, header: StorageHeader, progress: Callable[[int], None] | None) -> list[str]:
        return verify_local(self.path, header, progress)

    def clean(self, older_than: float) -> list[Path | str]:
        return list(clean_local(self.path, older_than))

    def trust_key(self) -> str:
        return str(self.path.resolve())

    def read_small(self, name: str) -> bytes | None:
        try:
            with open(self.path / name, "rb") as file:
                return file.read(MAX_HEADER_BYTES)
        except FileNotFoundError:
            return None

    def names_in(self, folder: str) -> set[str]:
        try:
            return set(os.listdir(self.path / folder))
        except FileNotFoundError:
            return set()

    def create_once(self, name: str, data: bytes) -> bool:
        final = self.path / name
        final.parent.mkdir(exist_ok=True)
        temporary = self.path / INCOMPLETE_DIR / f"write-{final.name}.{uuid.uuid4().hex}"
        with open(temporary, "xb") as file:
            file.write(data + b"\n")
            file.flush()
            os.fsync(file.fileno())
        return publish(temporary, final)
