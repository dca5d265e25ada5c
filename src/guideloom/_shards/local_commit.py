"""How a shard is committed into a local storage: a hard link, then its record fsynced into the index.

The record is the commit point (``_shards.index``). A writer killed between the two leaves a
*stray* shard: linked, not indexed, so not committed, and invisible to readers of the index. The
next commit of that id replaces it. A writer holds an ``flock`` on its shard's file from before the
link until its record is written, so a stray is told from a commit in progress without any
coordination between writers of different shards.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path

import numpy as np

from guideloom._shards.index import IndexContents, append_records, read_index
from guideloom._shards.layout import SHARDS_DIR, ShardInfo, fsync_directory, shard_file_name
from guideloom._shards.shard_table import ShardTable
from guideloom._shards.snapshot import listed_shard_ids


def commit_shard(path: Path, temporary: Path, info: ShardInfo) -> bool:
    """Commit the finished file ``temporary`` as shard ``info.id``; False if that shard is committed already.

    ``temporary`` is gone afterwards either way. If the index cannot be written, the link is undone
    and the ``OSError`` raised: nothing is half committed.
    """
    final = path / SHARDS_DIR / shard_file_name(info.id)
    lock = os.open(temporary, os.O_RDONLY)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)  # ours alone: nobody else knows the file yet
        try:
            os.link(temporary, final)
        except FileExistsError:
            if not is_stray(path, info.id):
                return False
            os.replace(temporary, final)  # the stray was never committed: ours takes its place
        fsync_directory(final.parent)
        try:
            append_records(path, ShardTable.of([info]), durable=True)
        except OSError:
            with contextlib.suppress(OSError):
                os.unlink(final)
            raise
        return True
    finally:
        os.close(lock)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def is_committed(path: Path, shard: int) -> bool:
    """Whether ``shard`` is committed at ``path``: its file is there and it is no stray."""
    return (path / SHARDS_DIR / shard_file_name(shard)).exists() and not is_stray(path, shard)


def is_stray(path: Path, shard: int) -> bool:
    """Whether the file of ``shard`` is a stray: no writer is committing it, and a complete index lacks it.

    Where the index is not complete (a storage of guideloom 0.2, a damaged index) the listing decides,
    and a listed shard is committed.
    """
    return _unlocked(path, shard) and _not_indexed(read_index(path), np.array([shard], np.int64)).size == 1


def stray_shards(path: Path) -> list[int]:
    """Ids of the strays at ``path`` now: listed in ``shards/``, no writer committing them, not in its complete index.

    One listing: for ``guideloom inspect`` and ``clean``, never for opening a storage. Empty where the
    index is not complete (then the listing decides, and nothing listed is a stray).
    """
    unindexed = _not_indexed(read_index(path), listed_shard_ids(path))
    unlocked = np.array([shard for shard in unindexed.tolist() if _unlocked(path, shard)], np.int64)
    return _not_indexed(read_index(path), unlocked).tolist()  # type: ignore[no-any-return]  # read after the locks


def _unlocked(path: Path, shard: int) -> bool:
    """Whether the file of ``shard`` is there and no writer holds its lock (between its link and its record).

    Read the index only after this: a writer releases the lock once its record is written.
    """
    try:
        descriptor = os.open(path / SHARDS_DIR / shard_file_name(shard), os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        return False
    except OSError:  # a symlink or a file we may not read: no writer of ours made it
        return True
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    finally:
        os.close(descriptor)
    return True


def _not_indexed(contents: IndexContents, shard_ids: np.ndarray) -> np.ndarray:
    """Those of ``shard_ids`` (ascending int64) that a complete index lacks; none if the index is not complete."""
    return contents.table.lacking(shard_ids) if contents.complete else shard_ids[:0]


def remove_strays(path: Path, older_than: float) -> list[Path]:
    """Delete the strays at ``path`` whose files are ``older_than`` seconds old (never committed: nothing is lost)."""
    removed = []
    now = time.time()
    for shard in stray_shards(path):
        file = path / SHARDS_DIR / shard_file_name(shard)
        with contextlib.suppress(FileNotFoundError):
            if now - file.lstat().st_mtime >= older_than and is_stray(path, shard):
                file.unlink()
                removed.append(file)
    return removed
