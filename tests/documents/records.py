"""Document storages whose records say who they are: an id in their first 4 bytes, then filler up to a length."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentStorage
from tests.helpers.storages import RawFormat


def record(identifier: int, length: int) -> bytes:
    """A record of ``length`` bytes (at least 4): its length unit is a byte, as for any storage without lengths."""
    return identifier.to_bytes(4, "little") + b"x" * (length - 4)


def identifier(data: bytes) -> int:
    return int.from_bytes(bytes(data[:4]), "little")


def record_lengths(count: int, seed: int = 0, longest: int = 60) -> list[int]:
    return np.random.default_rng(seed).integers(4, longest + 1, count).tolist()  # type: ignore[no-any-return]


def make_sized_records(path: Path, lengths: list[int], shards: int = 3, first_id: int = 0) -> DocumentStorage[Any, Any]:
    """Record ``first_id + i`` of ``lengths[i]`` bytes, spread in order over ``shards`` shards."""
    storage = DocumentStorage(path, RawFormat())
    with storage.sync_writer() as writer:
        for index, length in enumerate(lengths):
            writer.append(index * shards // len(lengths), record(first_id + index, length))
    return storage


def ids(batch: list[bytes]) -> list[int]:
    """The collate of these tests: the records' ids, in batch order."""
    return [identifier(data) for data in batch]
