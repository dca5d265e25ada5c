"""A local storage's snapshot: the shards committed now and their facts, from its index alone where it can.

A complete index (see ``_shards.index``) is read and nothing else. Otherwise (a storage of
guideloom 0.2, an index of an earlier build, a damaged record) the listing of ``shards/`` decides:
the index's sound records give the facts they know, the footers of the other listed shards the rest,
and, where the storage is writable, a complete index replaces the old one, so the next opening
lists nothing. A listed shard whose commit was cut short (linked, not indexed) counts as committed
on that path: a listing cannot tell it from a shard whose record was damaged.
"""

from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path

import numpy as np

from guideloom._shards.index import IndexContents, append_records, read_index, replace_index
from guideloom._shards.layout import SHARDS_DIR, ShardFile, ShardInfo, StorageHeader, committed_shard_ids
from guideloom._shards.shard_table import ShardTable

_DIGITS = 10 ** np.arange(11, -1, -1, dtype=np.int64)
_SHARD_NAME = re.compile(r"[0-9]{12}\.shard")


def local_snapshot(path: Path, header: StorageHeader) -> ShardTable:
    """The shards committed now at ``path``: the index if it is complete, else the listing and footers."""
    contents = read_index(path)
    if contents.complete:
        return contents.table
    table = _from_listing(path, header, contents)
    with contextlib.suppress(OSError):  # a read-only storage: the next reader lists again, and reads the same
        replace_index(path, table)
        later = table.lacking(listed_shard_ids(path))  # committed while we listed: their records may be lost
        if len(later):
            append_records(path, ShardTable.of(footer_facts(path, int(shard), header) for shard in later), durable=True)
    return table


def _from_listing(path: Path, header: StorageHeader, contents: IndexContents) -> ShardTable:
    ids = listed_shard_ids(path)
    known, unknown = contents.table.select(ids)
    if not unknown:
        return known
    found = ShardTable.of(footer_facts(path, shard, header) for shard in unknown)
    return ShardTable(np.sort(np.concatenate([known.rows, found.rows]), order="id"))


def visible_shard_ids(path: Path) -> np.ndarray:
    """Ids of the shards this process sees committed at ``path`` (ascending int64), without reading a footer."""
    contents = read_index(path)
    return contents.table.ids if contents.complete else listed_shard_ids(path)


def listed_shard_ids(path: Path) -> np.ndarray:
    """Ids of the shards listed in ``shards/`` now, ascending (int64), parsed as whole arrays."""
    try:
        names = os.listdir(path / SHARDS_DIR)
    except OSError:  # let the one listing function say precisely what is wrong
        return np.asarray(committed_shard_ids(path), np.int64)
    joined = "".join(names)
    candidates = names if len(joined) == 18 * len(names) else [name for name in names if len(name) == 18]
    encoded = (joined if candidates is names else "".join(candidates)).encode("utf-8", "surrogateescape")
    if len(encoded) != 18 * len(candidates):  # a name with non-ASCII characters: the careful way
        return np.asarray(sorted(int(name[:12]) for name in candidates if _SHARD_NAME.fullmatch(name)), np.int64)
    characters = np.frombuffer(encoded, np.uint8).reshape(-1, 18)
    digits = characters[:, :12]
    valid = ((digits >= ord("0")) & (digits <= ord("9"))).all(axis=1)
    valid &= (characters[:, 12:] == np.frombuffer(b".shard", np.uint8)).all(axis=1)
    ids: np.ndarray = (digits[valid].astype(np.int64) - ord("0")) @ _DIGITS
    ids.sort()
    return ids


def footer_facts(path: Path, shard: int, header: StorageHeader) -> ShardInfo:
    """A shard's facts from its footer (the file is opened, checked as a reader checks it, and closed)."""
    opened = ShardFile(path, shard, header)
    try:
        return opened.info
    finally:
        opened.close()
