"""How a shard is committed into a local storage: its finished, fsynced file gets its name in ``shards/``.

The shard is the commit: a file under its final name in ``shards/`` is committed, and nothing else
is. A commit is ``os.link(temporary, final)``, which creates the name only if it does not exist
(atomically, on NFS too), then an fsync of ``shards/``. It relies on nothing a shared file system may
not give: no append, no lock. Every other file of the storage (``shards.index``) is derived from the
names and footers in ``shards/``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

from guideloom._shards.layout import SHARDS_DIR, ShardInfo, fsync_directory, shard_file_name


def commit_shard(path: Path, temporary: Path, info: ShardInfo) -> bool:
    """Commit the finished, fsynced file ``temporary`` as shard ``info.id``; False if that shard is committed already.

    ``temporary`` is gone afterwards either way. An ``OSError`` before the link leaves the shard absent.
    Once linked, the shard is committed: readers may already read it and another writer of its id is
    told it exists, so it is never unlinked again. If the fsync of ``shards/`` then fails, the
    ``OSError`` says the shard is committed but its name may not survive a power cut.
    """
    final = path / SHARDS_DIR / shard_file_name(info.id)
    try:
        try:
            os.link(temporary, final)
        except FileExistsError:
            if not _is_same_file(temporary, final):
                return False
            # An NFS client whose link reply was lost retries the call and gets EEXIST for its own link.
        except FileNotFoundError:
            if os.path.lexists(temporary):
                raise
            raise FileNotFoundError(
                f"shard {info.id} cannot be committed: its unfinished file {temporary} was deleted before its commit "
                "(by 'guideloom clean' with an age shorter than this writer took?); the shard is not committed"
            ) from None
        try:
            fsync_directory(final.parent)
        except OSError as error:
            raise OSError(
                error.errno,
                f"shard {info.id} is committed (its file is complete and fsynced, and readers see it), but fsync of "
                f"{final.parent} failed ({error.strerror or error}): a power cut before the file system writes the "
                "directory back may lose the shard's name",
                str(final.parent),
            ) from error
        return True
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)


def _is_same_file(temporary: Path, final: Path) -> bool:
    """Whether ``final`` is ``temporary`` under another name (the link was made, and its success not heard)."""
    try:
        ours, theirs = os.stat(temporary), os.stat(final)
    except FileNotFoundError:
        return False
    return (ours.st_dev, ours.st_ino) == (theirs.st_dev, theirs.st_ino)


def is_committed(path: Path, shard: int) -> bool:
    """Whether ``shard`` is committed at ``path``: its name is taken in ``shards/``."""
    return os.path.lexists(path / SHARDS_DIR / shard_file_name(shard))
