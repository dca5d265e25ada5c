"""Storages of many small shards, written fast: the shard files are laid out as a writer lays them out.

Committing through a writer fsyncs every shard and its directory, which is right for users and far
too slow for a test that needs 10^4 shards. These helpers write the same bytes (data, offsets and
footer from the layout's own ``shard_trailer``) without the fsyncs, and write the storage's index as a
closing writer does (``indexed=False`` leaves the storage without an index, as guideloom 0.2 did).
"""

from __future__ import annotations

import zlib
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentJsonFormat, DocumentStorage, TokenStorage
from guideloom._shards.checkpoints import checkpoints_of
from guideloom._shards.index import INDEX_NAME
from guideloom._shards.layout import SHARDS_DIR, ShardInfo, StorageHeader, shard_file_name, shard_size, shard_trailer
from guideloom._shards.local_listing import reindex
from guideloom._shards.shard_table import ShardTable


def _write_shard(
    path: Path, storage: TokenStorage | DocumentStorage[Any, Any], shard: int, data: bytes, offsets: list[int]
) -> ShardInfo:
    header = storage.create()
    data_crc = zlib.crc32(data)
    checkpoints = checkpoints_of(data, header.checkpoint_bytes)
    (path / SHARDS_DIR / shard_file_name(shard)).write_bytes(
        data + shard_trailer(shard, offsets, len(data), data_crc, header, checkpoints=checkpoints)
    )
    size = shard_size(len(offsets) - 1, len(data), header)
    return ShardInfo(shard, len(offsets) - 1, len(data) // header.element_size, data_crc, size)


def _index(path: Path, header: StorageHeader, infos: list[ShardInfo], indexed: bool) -> None:
    """Write the index as a closing writer does, or remove it (guideloom 0.2 had none; it is derived data)."""
    if indexed:
        reindex(path, header, ShardTable.of(infos))
    else:
        (path / INDEX_NAME).unlink(missing_ok=True)


def token_shards(
    path: Path,
    shards: int,
    documents_per_shard: int = 2,
    tokens_per_document: int = 8,
    *,
    indexed: bool = True,
    **arguments: Any,
) -> TokenStorage:
    """``shards`` uint32 shards; token ``t`` of the whole stream is ``t`` (so every window names its place).

    ``arguments`` go to the storage (``max_open_shards=``, ...).
    """
    storage = TokenStorage(path, "uint32", **arguments)
    storage.create()
    per_shard = documents_per_shard * tokens_per_document
    offsets = list(range(0, per_shard + 1, tokens_per_document))
    infos = []
    for shard in range(shards):
        tokens = np.arange(shard * per_shard, (shard + 1) * per_shard, dtype="<u4")
        infos.append(_write_shard(path, storage, shard, tokens.tobytes(), offsets))
    _index(path, storage.create(), infos, indexed)
    return storage


def document_shards(
    path: Path, shards: int, records_per_shard: int = 2, *, indexed: bool = True, **arguments: Any
) -> DocumentStorage[Any, Any]:
    """``shards`` JSON shards; record ``i`` of the storage is ``{"id": i}``."""
    storage: DocumentStorage[Any, Any] = DocumentStorage(path, DocumentJsonFormat(), **arguments)
    storage.create()
    infos = []
    for shard in range(shards):
        records = [storage.format.pack({"id": shard * records_per_shard + i}) for i in range(records_per_shard)]
        offsets = np.concatenate([[0], np.cumsum([len(record) for record in records])]).tolist()
        infos.append(_write_shard(path, storage, shard, b"".join(records), offsets))
    _index(path, storage.create(), infos, indexed)
    return storage
