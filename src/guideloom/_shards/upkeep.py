"""Looking after a local storage: verifying every committed shard and its index, cleaning up.

What ``storage.verify()`` and ``storage.clean_leftovers()`` do for a local path (an object store's
storage has its own, in ``_remote.remote_files``). ``verify`` lists ``shards/``, opens and checks
every listed shard, names a damaged index or one that disagrees with the shards, and writes the
index anew from the footers it read. ``clean`` deletes only unfinished files in ``incomplete/``.
"""

from __future__ import annotations

import contextlib
import os
import stat
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np

from guideloom._core.errors import CorruptStorageError, FormatMismatchError
from guideloom._shards.freshness import IndexDraft, is_current, try_begin_index
from guideloom._shards.index import IndexContents, read_index
from guideloom._shards.layout import INCOMPLETE_DIR, INDEX_NAME, ShardFile, ShardInfo, StorageHeader, verify_shards
from guideloom._shards.local_listing import index_problem, listed_shard_ids
from guideloom._shards.shard_table import ShardTable


def verify_local(path: Path, header: StorageHeader, progress: Callable[[int], None] | None) -> list[str]:
    """Recompute every committed shard's checksums and check the index against them; the problems found, each
    naming its shard or the index."""
    problems: list[str] = []
    contents = read_index(path)
    current = is_current(contents, path)
    draft = try_begin_index(path)  # before the listing, as any index is
    footers: list[ShardInfo] = []
    try:
        ids = listed_shard_ids(path)
        verify_shards(_each_shard(path, header, ids, problems, footers), progress, problems)
    except BaseException:
        if isinstance(draft, IndexDraft):
            draft.discard()
        raise
    index_problems = _index_problems(path, contents, current, ids, ShardTable.of(footers))
    if isinstance(draft, OSError):
        rebuilt = _not_rebuilt(draft)
    elif len(footers) == len(ids):  # every listed shard opened: the index is rebuilt from them
        failed = draft.publish(ShardTable.of(footers))
        rebuilt = "rebuilt from the shards" if failed is None else _not_rebuilt(failed)
    else:  # an index without a damaged shard would hide it from readers, who must name it
        draft.discard()
        rebuilt = "not rebuilt while a shard is damaged (readers bypass it)"
    return problems + [f"{problem}; {rebuilt}" for problem in index_problems]


def _not_rebuilt(error: OSError) -> str:
    """Why the index could not be written (a storage its user may not write, a full disk): the directory and the
    system's reason, not the name of a temporary file."""
    where = f" in {Path(error.filename).parent}" if error.filename else ""
    return f"not rebuilt: cannot write{where} ({error.strerror or error})"


def _each_shard(
    path: Path, header: StorageHeader, ids: np.ndarray, problems: list[str], footers: list[ShardInfo]
) -> Iterator[ShardFile]:
    """Each listed shard, opened in turn (its footer's facts kept in ``footers``) and closed after; one that
    cannot be opened is a problem."""
    for shard in ids.tolist():
        try:
            opened = ShardFile(path, shard, header)
        except (CorruptStorageError, FormatMismatchError) as error:
            problems.append(str(error))
            continue
        footers.append(opened.info)
        try:
            yield opened
        finally:
            opened.close()


def _index_problems(
    path: Path, contents: IndexContents, current: bool, listed: np.ndarray, footers: ShardTable
) -> list[str]:
    """How the index read before the listing disagrees with the shards' footers (a stale one may lack or keep
    shards committed or removed since: only a current one must match them exactly)."""
    damage = index_problem(contents, path)
    if damage is not None:
        return [damage]
    if not contents.present:
        return []
    known = contents.table.select(footers.ids)[0]
    differing = np.flatnonzero(known.rows != footers.select(known.ids)[0].rows)
    if len(differing):
        shard = known[int(differing[0])]
        return [
            f"the shard index {path / INDEX_NAME} records shard {shard.id} as {shard}, but its file holds "
            f"{footers.select([shard.id])[0][0]}"
        ]
    if not current:
        return []
    unknown, extra = contents.table.lacking(listed), np.setdiff1d(contents.table.ids, listed)
    if len(unknown) or len(extra):
        named = f"lacks shard {int(unknown[0])}" if len(unknown) else f"records shard {int(extra[0])}, not in shards/"
        return [f"the shard index {path / INDEX_NAME} {named} though it says it is current"]
    return []


def clean_local(path: Path, older_than: float) -> list[Path]:
    """Delete what dead writers left in ``incomplete/``, untouched for ``older_than`` seconds; never a shard."""
    return clean_incomplete(path / INCOMPLETE_DIR, older_than)


def clean_incomplete(incomplete: Path, older_than: float) -> list[Path]:
    """Delete the files in ``incomplete`` untouched for ``older_than`` seconds (what dead writers left).

    Never through a symlink: a crafted storage must not make clean delete files elsewhere.
    """
    removed: list[Path] = []
    now = time.time()
    try:
        directory = os.open(incomplete, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return removed
    except OSError as error:
        reason = error.strerror or error
        raise CorruptStorageError(f"{incomplete} is not a directory ({reason}): nothing cleaned") from None
    try:
        for entry in os.scandir(directory):
            with contextlib.suppress(FileNotFoundError):
                status = entry.stat(follow_symlinks=False)
                if stat.S_ISDIR(status.st_mode):  # writers make files only: not theirs, left alone
                    continue
                if now - status.st_mtime >= older_than:
                    os.unlink(entry.name, dir_fd=directory)  # a symlink goes, not its target
                    removed.append(incomplete / entry.name)
    finally:
        os.close(directory)
    return removed
