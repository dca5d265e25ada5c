"""How a local directory finds its committed shards and their facts: from its index alone where it can.

What a local storage's snapshot is made from (``local_snapshot``), and how its index is rewritten
(``reindex``: after a writer's commits, by ``storage.write_index()``, by a reader that found it stale).

The listing of ``shards/`` is the truth (a shard file under its name is committed, see
``_shards.local_commit``). A current index (``_shards.freshness``: one ``stat`` says nothing changed
since it was listed) is read and nothing else. Otherwise ``shards/`` is listed once, the index's
records give the facts of the listed shards they know, one footer read per other listed shard gives
the rest, and, where the storage is writable, a new index replaces the old one, so the next opening
lists nothing. A damaged index, or one made for another directory, gives no facts at all.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from guideloom._shards.freshness import begin_index, is_current, stamp_directory
from guideloom._shards.index import EMPTY, IndexContents, read_index
from guideloom._shards.layout import INDEX_NAME, SHARDS_DIR, ShardFile, ShardInfo, StorageHeader, committed_shard_ids
from guideloom._shards.shard_names import shard_ids_among
from guideloom._shards.shard_table import ShardTable


def local_snapshot(path: Path, header: StorageHeader) -> tuple[ShardTable, str | None]:
    """The shards committed now at ``path`` (a current index alone, else one listing and the footers it lacks),
    and why the index could not be used, or None (a current index, a stale one, none at all)."""
    contents = read_index(path)
    if is_current(contents, path):
        return contents.table, None
    return reindex(path, header, EMPTY, contents), index_problem(contents, path)


def reindex(path: Path, header: StorageHeader, known: ShardTable, contents: IndexContents | None = None) -> ShardTable:
    """The shards listed at ``path`` now, their facts from ``known``, the index (if usable) or their footers; the
    index is written anew from them where the storage is writable."""
    contents = read_index(path) if contents is None else contents
    draft = begin_index(path)  # before the listing: the index it becomes can then prove itself current
    try:
        records = usable_records(contents, path)
        if len(known):
            others = records.rows[~np.isin(records.ids, known.ids)]
            records = ShardTable(np.sort(np.concatenate([known.rows, others]), order="id"))
        table = _from_listing(path, header, records, listed_shard_ids(path))
    except BaseException:
        if draft is not None:
            draft.discard()
        raise
    if draft is not None:
        draft.publish(table)
    return table


def usable_records(contents: IndexContents, path: Path) -> ShardTable:
    """The records of an index that may stand in for footers: none of a damaged one or of another directory's."""
    if contents.problem is not None or _other_directory(contents, path) is not None:
        return EMPTY
    return contents.table


def index_problem(contents: IndexContents, path: Path) -> str | None:
    """What is wrong with the index read at ``path`` (naming the file), or None; a stale one is not wrong."""
    reason = contents.problem or _other_directory(contents, path)
    return None if reason is None else f"the shard index {path / INDEX_NAME} is damaged: {reason}"


def _other_directory(contents: IndexContents, path: Path) -> str | None:
    if contents.stamp is None:
        return None
    try:
        inode = stamp_directory(path, 0).inode
    except OSError:
        return None
    if inode == contents.stamp.inode:
        return None
    return "it was made for another shards/ directory (copied from another storage, or the storage was copied)"


def _from_listing(path: Path, header: StorageHeader, records: ShardTable, ids: np.ndarray) -> ShardTable:
    known, unknown = records.select(ids)
    if not unknown:
        return known
    found = ShardTable.of(footer_facts(path, shard, header) for shard in unknown)
    return ShardTable(np.sort(np.concatenate([known.rows, found.rows]), order="id"))


def visible_shard_ids(path: Path) -> np.ndarray:
    """Ids of the shards this process sees committed at ``path`` (ascending int64), without reading a footer."""
    contents = read_index(path)
    return contents.table.ids if is_current(contents, path) else listed_shard_ids(path)


def listed_shard_ids(path: Path) -> np.ndarray:
    """Ids of the shards listed in ``shards/`` now, ascending (int64), parsed as whole arrays."""
    try:
        names = os.listdir(path / SHARDS_DIR)
    except OSError:  # let the one listing function say precisely what is wrong
        return np.asarray(committed_shard_ids(path), np.int64)
    return shard_ids_among(names)


def footer_facts(path: Path, shard: int, header: StorageHeader) -> ShardInfo:
    """A shard's facts from its footer (the file is opened, checked as a reader checks it, and closed)."""
    opened = ShardFile(path, shard, header)
    try:
        return opened.info
    finally:
        opened.close()
