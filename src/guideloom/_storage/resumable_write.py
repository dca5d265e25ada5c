"""The engine-free half of a distributed write: its record, its shard ids, shard identity, leftovers.

A distributed write (``guideloom.ray.StorageDatasink``) numbers its shards from a *first shard id*
chosen when it starts: the id after the storage's committed shards. A named write keeps that id in
``writes/<write id>.json`` inside the storage, so running the same write again (after its driver
died) writes the same shard ids, and every task whose shard is already committed only checks that
the shard holds exactly its rows. Readers ignore ``writes/``.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from guideloom._core.checksums import crc32
from guideloom._core.errors import CorruptStorageError, ShardExistsError, UnfinishedWriteError
from guideloom._shards.header import StorageHeader
from guideloom._shards.shard_names import unfinished_shard_id

if TYPE_CHECKING:
    from guideloom._storage.storages import StorageBase

WRITES_DIR = "writes"
_WRITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


def check_write_id(write_id: object) -> str | None:
    if write_id is None:
        return None
    if not isinstance(write_id, str):
        raise TypeError(f"write_id must be a str or None, got {type(write_id).__name__}")
    if not _WRITE_ID.fullmatch(write_id):
        raise ValueError(
            f"write_id must be 1 to 128 letters, digits, '.', '_' or '-', not starting with a symbol; got {write_id!r}"
        )
    return write_id


class WriteRecords:
    """The named writes recorded in a storage: ``writes/<id>.json`` when one starts, ``<id>.done`` when it ends.

    Both are created once and never changed (a hard link locally, a conditional create on an object
    store), so a crash at any moment leaves either no record, a started one, or a finished one.
    """

    def __init__(self, storage: StorageBase) -> None:
        self._storage = storage

    def first_shard(self, write_id: str) -> int | None:
        """The first shard id of the named write, if it started before."""
        raw = self._read(f"{write_id}.json")
        if raw is None:
            return None
        try:
            fields = json.loads(raw)
            first_shard = fields["first_shard"]
            valid = fields["write_id"] == write_id and type(first_shard) is int and first_shard >= 0
        except (ValueError, TypeError, KeyError, UnicodeDecodeError, RecursionError):
            valid = False
        if not valid:
            raise CorruptStorageError(f"the write record {self._name(f'{write_id}.json')} is damaged")
        return int(first_shard)

    def unfinished(self) -> list[str]:
        names = self._names()
        started = sorted(name.removesuffix(".json") for name in names if name.endswith(".json"))
        return [write_id for write_id in started if f"{write_id}.done" not in names]

    def start(self, write_id: str, first_shard: int) -> int:
        """Record the write's first shard id; if the same write started meanwhile, its recorded one."""
        record = {"write_id": write_id, "first_shard": first_shard}
        if self._create(f"{write_id}.json", json.dumps(record).encode()):
            return first_shard
        recorded = self.first_shard(write_id)
        assert recorded is not None
        return recorded

    def finish(self, write_id: str, shards: list[int], records: int) -> None:
        self._create(
            f"{write_id}.done", json.dumps({"write_id": write_id, "shards": shards, "records": records}).encode()
        )

    def _name(self, name: str) -> str:
        return f"{self._storage.location}/{WRITES_DIR}/{name}"

    def _read(self, name: str) -> bytes | None:
        return self._storage.home.read_small(f"{WRITES_DIR}/{name}")

    def _names(self) -> set[str]:
        return self._storage.home.names_in(WRITES_DIR)

    def _create(self, name: str, data: bytes) -> bool:
        """Create the record unless it exists; True if this call created it."""
        return self._storage.home.create_once(f"{WRITES_DIR}/{name}", data)


def start_write(storage: StorageBase, write_id: str | None) -> int:
    """The first shard id of a write starting now: its recorded one when a named write runs again.

    A new write is refused while another named write is unfinished: it would take the shard ids that
    the unfinished write needs when it runs again.
    """
    records = WriteRecords(storage)
    if write_id is not None:
        recorded = records.first_shard(write_id)
        if recorded is not None:
            return recorded
    others = [other for other in records.unfinished() if other != write_id]
    if others:
        raise UnfinishedWriteError(
            f"the write {others[0]!r} into {storage.location} never finished: run it again with "
            f"write_id={others[0]!r} to complete it, or delete {WRITES_DIR}/{others[0]}.json in the storage "
            "to abandon it (the shards it committed stay)"
        )
    existing = storage.committed_shards()
    first_shard = existing[-1] + 1 if existing else 0
    return first_shard if write_id is None else records.start(write_id, first_shard)


def finish_write(storage: StorageBase, write_id: str | None, shards: list[int], records: int) -> None:
    if write_id is not None:
        WriteRecords(storage).finish(write_id, sorted(shards), records)


@dataclass
class ShardContents:
    """Record count, byte size and CRC-32 of a shard's data, as its footer records them (a retry compares them)."""

    records: int = 0
    data_size: int = 0
    data_crc: int = 0

    def update(self, payload: memoryview) -> None:
        self.records += 1
        self.data_size += payload.nbytes
        self.data_crc = crc32(payload, self.data_crc)


def committed_digest(storage: StorageBase, header: StorageHeader, shard: int) -> ShardContents | None:
    """The digest of a committed shard, from its footer or the store's listing; None if not committed."""
    info = storage.home.committed_facts(header, shard)
    if info is None:
        return None
    return ShardContents(info.record_count, info.element_count * header.element_size, info.data_crc)


def check_same_shard(storage: StorageBase, header: StorageHeader, shard: int, digest: ShardContents) -> None:
    """Accept an already committed shard only if it holds exactly the rows digested."""
    found = committed_digest(storage, header, shard)
    if found != digest:
        raise ShardExistsError(
            f"shard {shard} of {storage.location} is committed with other data ({found}) than this write task's "
            f"rows ({digest}): the dataset changed since the write first ran, or another writer took the id"
        )


def remove_leftovers(incomplete: Path, first_shard: int, stop_shard: int | None) -> int:
    """Delete files in ``incomplete`` of shards in ``[first_shard, stop_shard)``: attempts that died."""
    removed = 0
    try:
        names = os.listdir(incomplete)
    except FileNotFoundError:
        return 0
    for name in names:
        shard = unfinished_shard_id(name)
        if shard is not None and first_shard <= shard and (stop_shard is None or shard < stop_shard):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(incomplete / name)
                removed += 1
    return removed
