"""Whether a local storage's index is current, from one ``stat`` of ``shards/``; writing an index that can say so.

A commit links a name into ``shards/``, which changes the directory's inode times. An index records
those times as they were before the listing it was made from, and the file system's clock at that
moment (``listed_after``: the modification time of the index's own temporary file, created just
before). If the directory's inode and times are unchanged, and its last change is older than
``listed_after``, nothing was committed or removed since the listing: a commit after it would have
stamped the directory with a time at least ``listed_after``. A change within the same clock tick as
the listing leaves the index unproven, and the next reader lists again. Both times come from the
same clock (the file server's, on NFS); a clock stepped back can hide a commit until the next one.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path

from guideloom._shards.index import DirectoryStamp, IndexContents, encode_index
from guideloom._shards.layout import INCOMPLETE_DIR, INDEX_NAME, SHARDS_DIR
from guideloom._shards.shard_table import ShardTable


def is_current(contents: IndexContents, path: Path) -> bool:
    """Whether the index read at ``path`` holds exactly the shards committed now (one ``stat``, no listing)."""
    stamp = contents.stamp
    if stamp is None or contents.problem is not None:
        return False
    try:
        status = os.stat(path / SHARDS_DIR)
    except OSError:
        return False
    return (
        status.st_ino == stamp.inode
        and status.st_mtime_ns == stamp.mtime_ns
        and status.st_ctime_ns == stamp.ctime_ns
        and stamp.listed_after > max(stamp.mtime_ns, stamp.ctime_ns)
    )


class IndexDraft:
    """A new index begun before its listing: its temporary file is made first, then ``shards/`` is stamped.

    ``publish`` writes the table listed after ``stamp`` and renames it into place. A storage that cannot
    be written has no draft (``begin_index`` says None, ``try_begin_index`` why); nothing is lost then,
    the next reader lists again.
    """

    def __init__(self, path: Path, descriptor: int, temporary: Path, listed_after: int) -> None:
        self.path = path
        self.stamp = stamp_directory(path, listed_after)
        self._descriptor = descriptor
        self._temporary = temporary

    def publish(self, table: ShardTable) -> OSError | None:
        """Write the index of ``table`` (the shards listed after ``stamp``) in place of the old one, if possible: the
        error that kept it from being written (a full disk, `guideloom clean` removing the draft), or None."""
        try:
            data = memoryview(encode_index(table, self.stamp))
            while data:
                data = data[os.write(self._descriptor, data) :]
            # No fsync: an index a power cut tore is named as damaged and rebuilt, like any other.
            os.replace(self._temporary, self.path / INDEX_NAME)
        except OSError as error:
            return error
        finally:
            self.discard()
        return None

    def discard(self) -> None:
        if self._descriptor >= 0:
            os.close(self._descriptor)
            self._descriptor = -1
        with contextlib.suppress(OSError):
            os.unlink(self._temporary)


def begin_index(path: Path) -> IndexDraft | None:
    """A draft of a new index for the storage at ``path``, or None where it cannot be written (read only)."""
    draft = try_begin_index(path)
    return None if isinstance(draft, OSError) else draft


def try_begin_index(path: Path) -> IndexDraft | OSError:
    """A draft of a new index for the storage at ``path``, or the error that keeps one from being written there (a
    storage its user may not write; ``shards/`` missing or no directory, which the listing names)."""
    temporary = path / INCOMPLETE_DIR / f"{INDEX_NAME}.{uuid.uuid4().hex}"
    try:  # not O_EXCL: an exclusive create on NFS may park a verifier in the times this reads
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as error:
        return error
    try:
        return IndexDraft(path, descriptor, temporary, os.fstat(descriptor).st_mtime_ns)
    except BaseException as error:
        os.close(descriptor)
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        if isinstance(error, OSError):
            return error
        raise


def stamp_directory(path: Path, listed_after: int) -> DirectoryStamp:
    """The stamp of ``shards/`` now (``OSError`` if it cannot be stat'ed); ``listed_after`` from a file made before."""
    status = os.stat(path / SHARDS_DIR)
    return DirectoryStamp(status.st_ino, status.st_mtime_ns, status.st_ctime_ns, listed_after)
