"""Opening a storage's writer: the caller names each record's shard, or, given a shard size, the writer picks ids."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, Protocol

from guideloom._core.sizes import parse_shard_size
from guideloom._shards.field_columns import ColumnSplitter
from guideloom._shards.header import StorageHeader
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.record_lengths import defines_length
from guideloom._shards.rolling_writer import RollingWriter
from guideloom._shards.shard_access import CommitTarget
from guideloom._shards.writer import SyncWriter
from guideloom._storage.trust import note_committed


class WritableStorage(Protocol):
    """What opening a writer asks of a storage (``_storage.storages``' storages are such)."""

    def commit_target(self) -> CommitTarget: ...

    def create(self) -> StorageHeader: ...

    def trust_key(self) -> str: ...

    def highest_committed(self) -> int: ...


def open_writer(
    storage: WritableStorage,
    encode: Callable[[Any], tuple[memoryview, int]],
    shard_size: object,
    measure: Callable[[Any], int] | None = None,
    columns: ColumnSplitter | None = None,
    direct: bool = False,
) -> SyncWriter[Any] | RollingWriter[Any]:
    """A writer of ``storage`` (created if needed): a ``SyncWriter`` without ``shard_size``, else a ``RollingWriter``
    whose shards hold ``shard_size`` bytes (an int, or a size such as ``"256MiB"``); ``columns`` splits a record
    into its field columns' values, where the storage's header names field columns. With ``direct`` (a
    ``SyncWriter`` only), the shards' data goes past the page cache (``_shards.direct_writes``)."""
    size = None if shard_size is None else parse_shard_size(shard_size, "shard_size")
    target, header = storage.commit_target(), storage.create()
    on_commit = functools.partial(note_committed, storage.trust_key())
    if size is None:
        return SyncWriter(target, header, encode, measure, on_commit, columns, direct)
    encoder = RecordEncoder(encode, measure)
    return RollingWriter(target, header, encoder, size, storage.highest_committed, on_commit, columns)


def record_measure(document_format: object, record_lengths: bool, location: str) -> Callable[[Any], int] | None:
    """The format's ``length`` if the storage records lengths; an error if the format and the storage disagree."""
    measured = defines_length(document_format)
    if measured != record_lengths:
        name = type(document_format).__name__
        raise ValueError(
            f"{name} {'defines' if measured else 'defines no'} length(), but the storage at {location} was created "
            f"{'without' if measured else 'with'} record lengths: every shard of a storage measures its records the "
            "same way, so write with the format it was created with, or into a new storage"
        )
    length: Callable[[Any], int] | None = getattr(document_format, "length", None) if measured else None
    return length
