"""A local storage's shard index, ``shards.index``: the record of what is committed, so opening reads no shard.

The file (next to ``guideloom.json``) starts with a 40-byte preamble and then holds one 40-byte
record per commit (see ``_shards.shard_table`` and docs/format.md). A commit appends its shard's
record with ``O_APPEND`` after the shard's hard link and fsyncs it: the record is the commit point,
so a reader of a *complete* index (preamble present, every record sound) lists nothing. Writers of
different shards never coordinate; a reader keeps the last record of each id.

An index without the preamble or with a damaged record, and a storage without one (written by
guideloom 0.2), are read from the listing of ``shards/`` and the footers the index lacks; where the
storage is writable, a complete index is then written in place of the old one (see ``_shards.snapshot``).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import uuid
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from guideloom._shards.layout import INCOMPLETE_DIR, INDEX_NAME
from guideloom._shards.shard_table import RECORD, ShardTable, last_of_each_id, sound_records

MAPPED_SIZE = 1 << 20  # an index this large (about 26,000 shards) is mapped, a smaller one read
_POPULATE = getattr(mmap, "MAP_POPULATE", 0)  # fault the pages in at once (Linux)
PREAMBLE = b"GLOOMIX1" + (1).to_bytes(4, "little") + bytes(RECORD.itemsize - 12)  # magic, index version 1


@dataclass(frozen=True)
class IndexContents:
    """The sound records of an index (ascending id, the last of each id), and whether they are all there is.

    ``complete`` means the index starts with the preamble and every whole record is sound: its records
    are exactly the committed shards. Otherwise the listing decides and the records only save footer reads.
    """

    table: ShardTable
    complete: bool


def read_index(path: Path) -> IndexContents:
    """What the index of the storage at ``path`` says; an absent or unreadable one says nothing."""
    try:
        descriptor = os.open(path / INDEX_NAME, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:  # absent (0.2), or not a file we may read: the listing and footers say it all
        return IndexContents(ShardTable(np.empty(0, RECORD)), complete=False)
    try:
        status = os.fstat(descriptor)
        if not stat.S_ISREG(status.st_mode):  # a FIFO or device planted under the name
            return IndexContents(ShardTable(np.empty(0, RECORD)), complete=False)
        raw = _mapped(descriptor, status.st_size) if status.st_size >= MAPPED_SIZE else _read_all(descriptor)
    finally:
        os.close(descriptor)
    has_preamble = bytes(raw[: len(PREAMBLE)]) == PREAMBLE
    start = len(PREAMBLE) if has_preamble else 0
    count = (len(raw) - start) // RECORD.itemsize
    # A part of a record at the end is an append still being copied in, or one a power cut tore before
    # its fsync returned: not a commit either way, so it is left out and the index may still be complete.
    records = np.frombuffer(raw, RECORD, count, start)
    sound = sound_records(records)
    complete = has_preamble and bool(sound.all())
    if not complete:
        records = records[sound]
    return IndexContents(ShardTable(last_of_each_id(records)), complete)


def _mapped(descriptor: int, size: int) -> mmap.mmap:
    """The index's first ``size`` bytes, mapped from the page cache: no copy into fresh memory, which at 4 MB
    (10^5 shards) costs more than all the rest of opening. The table keeps the mapping (and the duplicate
    descriptor ``mmap`` holds) until ``ShardTable.detach``; only appends ever follow, never in place."""
    return mmap.mmap(descriptor, size, flags=mmap.MAP_SHARED | _POPULATE, prot=mmap.PROT_READ)


def _read_all(descriptor: int) -> bytes:
    size = os.fstat(descriptor).st_size
    chunks = []
    while size > 0 and (chunk := os.read(descriptor, size)):
        chunks.append(chunk)
        size -= len(chunk)
    return b"".join(chunks)


def append_records(path: Path, table: ShardTable, *, durable: bool) -> bool:
    """Append these shards' records to the index at ``path`` in one write (fsynced if ``durable``).

    False, with nothing written, where there is no index to append to (a storage of guideloom 0.2,
    or a name that is not a regular file): its listing is what is committed. Failing to write an
    index that is there is an ``OSError``.
    """
    try:
        descriptor = os.open(path / INDEX_NAME, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as error:
        if error.errno in (errno.ENOENT, errno.EISDIR, errno.ELOOP):  # ELOOP: a symlink, which readers ignore too
            return False
        raise
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            return False
        if len(table):
            records = table.rows.tobytes()
            written = os.write(descriptor, records)
            if written != len(records):  # a full disk: the part written puts later records out of step
                raise OSError(errno.ENOSPC, f"only {written} of {len(records)} bytes appended", str(path / INDEX_NAME))
            if durable:
                os.fsync(descriptor)
        return True
    finally:
        os.close(descriptor)


def create_index(path: Path) -> None:
    """Give a new storage (no header yet, so no shard) its empty, complete index, unless one is there."""
    _publish_index(path, ShardTable(np.empty(0, RECORD)), replace=False)


def replace_index(path: Path, table: ShardTable) -> None:
    """Put a complete index of ``table`` in place of the storage's index (one ``rename``; ``OSError`` if it cannot).

    A writer that appended to the old file meanwhile committed a shard listed before this call returns:
    whoever replaces the index lists again afterwards and appends what it lacks (``_shards.snapshot``).
    """
    _publish_index(path, table, replace=True)


def _publish_index(path: Path, table: ShardTable, *, replace: bool) -> None:
    temporary = path / INCOMPLETE_DIR / f"{INDEX_NAME}.{uuid.uuid4().hex}"
    with open(temporary, "xb") as file:
        file.write(PREAMBLE + table.rows.tobytes())
        file.flush()
        os.fsync(file.fileno())
    try:
        if replace:
            os.replace(temporary, path / INDEX_NAME)
        else:
            with contextlib.suppress(FileExistsError):  # another creator's index: as empty as ours
                os.link(temporary, path / INDEX_NAME)
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
