"""Storages of a ``RecordSchema`` written by the field tests: every record in one shard."""

from __future__ import annotations

from pathlib import Path

from guideloom import DocumentStorage
from guideloom.fields import RecordSchema


def write(path: Path, schema: RecordSchema, records: list[dict[str, object]]) -> DocumentStorage:
    """A storage at ``path`` holding ``records``, in order, in shard 0."""
    storage = DocumentStorage(path, schema)
    with storage.sync_writer() as writer:
        for record in records:
            writer.append(0, record)
    return storage
