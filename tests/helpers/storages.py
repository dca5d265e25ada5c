"""Storages the tests read: a raw-bytes format, random token and JSON document storages, committed shards."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentJsonFormat, DocumentStorage, TokenStorage
from guideloom._storage.storages import AnyFormatStorage
from guideloom.types import DocumentStorageFormat


class RawFormat(DocumentStorageFormat[bytes, bytes]):
    """Records are their own bytes: decoding never fails and empty records are possible, so only storage is tested."""

    name = "raw-bytes"

    def pack(self, data: bytes) -> bytes:
        return bytes(data)

    def unpack(self, encoded_data: memoryview, shard: int) -> bytes:
        return bytes(encoded_data)


def make_token_storage(
    path: Path,
    documents_per_shard: tuple[int, ...] = (7, 5, 9),
    *,
    dtype: str = "uint32",
    longest: int = 40,
    seed: int = 0,
) -> TokenStorage:
    """Shard k holds ``documents_per_shard[k]`` random documents of 1 to ``longest - 1`` tokens below 50,000."""
    rng = np.random.default_rng(seed)
    storage = TokenStorage(path, dtype)
    with storage.sync_writer() as writer:
        for shard, documents in enumerate(documents_per_shard):
            for _ in range(documents):
                writer.append(shard, rng.integers(0, 50_000, int(rng.integers(1, longest))))
    return storage


def make_document_storage(
    path: Path, count: int = 23, shards: int = 3, record: Callable[[int], dict[str, Any]] | None = None
) -> DocumentStorage[Any, Any]:
    """``count`` JSON records (``{"id": i}`` or ``record(i)``), spread in order over shards 0 to ``shards - 1``."""
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(count):
            writer.append(index * shards // count, record(index) if record else {"id": index})
    return storage


def open_storage(path: Path, kind: str) -> Any:
    """A storage of raw-bytes documents (``kind="documents"``) or uint16 tokens (``kind="tokens"``)."""
    return TokenStorage(path, "uint16") if kind == "tokens" else DocumentStorage(path, RawFormat())


def committed_shards(path: Path) -> list[int]:
    """The shards committed at ``path`` as readers see them (every shard file under its name in ``shards/``)."""
    return AnyFormatStorage(path).committed_shards()


def make_counted_tokens(path: Path, *, shards: int, tokens: int = 40) -> TokenStorage:
    """Shard k holds one document: the ``tokens`` consecutive ids from 10·k on."""
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            writer.append(shard, list(range(shard * 10, shard * 10 + tokens)))
    return storage
