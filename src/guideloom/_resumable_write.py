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
import uuid
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path

from guideloom._errors import CorruptStorageError, ShardExistsError, UnfinishedWriteError
from guideloom._layout import (
    INCOMPLETE_DIR,
    MAX_HEADER_BYTES,
    SHARDS_DIR,
    ShardFile,
    StorageHeader,
    committed_shard_ids,
    fsync_directory,
    publish,
    shard_file_name,
)

WRITES_DIR = "writes"
_WRITE_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")
_LEFTOVER = re.compile(r"([0-9]{12})\.shard\..+")


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


@dataclass
class WriteRecord:
    """What a named write keeps in the storage: where its shard ids start and whether it finished."""

    write_id: str
    first_shard: int
    finished: bool = False
    shards: list[int] = field(default_factory=list)
    records: int = 0

    @classmethod
    def load(cls, storage_path: Path, write_id: str) -> WriteRecord | None:
        path = storage_path / WRITES_DIR / f"{write_id}.json"
        try:
            with open(path, "rb") as file:
                raw = file.read(MAX_HEADER_BYTES + 1)
        except FileNotFoundError:
            return None
        try:
            fields = json.loads(raw)
            record = cls(**fields)
            valid = isinstance(record.first_shard, int) and record.write_id == write_id
        except (ValueError, TypeError, UnicodeDecodeError, RecursionError):
            valid = False
        if len(raw) > MAX_HEADER_BYTES or not valid:
            raise CorruptStorageError(f"the write record {path} is damaged")
        return record

    def save(self, storage_path: Path, *, exclusive: bool) -> bool:
        """Write the record atomically; with ``exclusive``, only if none exists yet (True if written)."""
        directory = storage_path / WRITES_DIR
        directory.mkdir(exist_ok=True)
        temporary = storage_path / INCOMPLETE_DIR / f"write-{self.write_id}.{uuid.uuid4().hex}"
        with open(temporary, "xb") as file:
            file.write(json.dumps(asdict(self), sort_keys=True).encode() + b"\n")
            file.flush()
            os.fsync(file.fileno())
        final = directory / f"{self.write_id}.json"
        if exclusive:
            return publish(temporary, final)
        os.replace(temporary, final)
        fsync_directory(directory)
        return True


def unfinished_writes(storage_path: Path) -> list[str]:
    """Write ids of the named writes recorded in the storage that never finished."""
    try:
        names = sorted(os.listdir(storage_path / WRITES_DIR))
    except FileNotFoundError:
        return []
    unfinished = []
    for name in names:
        write_id = name.removesuffix(".json")
        if name.endswith(".json") and _WRITE_ID.fullmatch(write_id):
            record = WriteRecord.load(storage_path, write_id)
            if record is not None and not record.finished:
                unfinished.append(write_id)
    return unfinished


def start_write(storage_path: Path, write_id: str | None) -> int:
    """The first shard id of a write starting now: its recorded one when a named write runs again.

    A new write is refused while another named write is unfinished: it would take the shard ids that
    the unfinished write needs when it runs again.
    """
    if write_id is not None:
        record = WriteRecord.load(storage_path, write_id)
        if record is not None:
            return record.first_shard
    others = [other for other in unfinished_writes(storage_path) if other != write_id]
    if others:
        raise UnfinishedWriteError(
            f"the write {others[0]!r} into {storage_path} never finished: run it again with "
            f"write_id={others[0]!r} to complete it, or delete {storage_path / WRITES_DIR / others[0]}.json "
            "to abandon it (the shards it committed stay)"
        )
    existing = committed_shard_ids(storage_path)
    first_shard = existing[-1] + 1 if existing else 0
    if write_id is not None and not WriteRecord(write_id, first_shard).save(storage_path, exclusive=True):
        record = WriteRecord.load(storage_path, write_id)  # the same write started twice at once
        assert record is not None
        return record.first_shard
    return first_shard


def finish_write(storage_path: Path, write_id: str | None, first_shard: int, shards: list[int], records: int) -> None:
    if write_id is not None:
        WriteRecord(write_id, first_shard, True, sorted(shards), records).save(storage_path, exclusive=False)


@dataclass
class ShardDigest:
    """Record count, byte size and CRC-32 of a shard's data, as its footer records them."""

    records: int = 0
    data_size: int = 0
    data_crc: int = 0

    def update(self, payload: memoryview) -> None:
        self.records += 1
        self.data_size += payload.nbytes
        self.data_crc = zlib.crc32(payload, self.data_crc)


def committed_digest(storage_path: Path, header: StorageHeader, shard: int) -> ShardDigest | None:
    """The digest of a committed shard, read from its footer; None if the shard is not committed."""
    if not (storage_path / SHARDS_DIR / shard_file_name(shard)).exists():
        return None
    committed = ShardFile(storage_path, shard, header)
    try:
        return ShardDigest(committed.record_count, committed.data_size, committed.data_crc)
    finally:
        committed.close()


def check_same_shard(storage_path: Path, header: StorageHeader, shard: int, digest: ShardDigest) -> None:
    """Accept an already committed shard only if it holds exactly the rows digested."""
    found = committed_digest(storage_path, header, shard)
    if found != digest:
        raise ShardExistsError(
            f"shard {shard} of {storage_path} is committed with other data ({found}) than this write task's "
            f"rows ({digest}): the dataset changed since the write first ran, or another writer took the id"
        )


def remove_leftovers(storage_path: Path, first_shard: int, stop_shard: int | None) -> int:
    """Delete files in ``incomplete/`` of shards in ``[first_shard, stop_shard)``: attempts that died."""
    removed = 0
    incomplete = storage_path / INCOMPLETE_DIR
    try:
        names = os.listdir(incomplete)
    except FileNotFoundError:
        return 0
    for name in names:
        match = _LEFTOVER.fullmatch(name)
        if match and first_shard <= int(match.group(1)) and (stop_shard is None or int(match.group(1)) < stop_shard):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(incomplete / name)
                removed += 1
    return removed
