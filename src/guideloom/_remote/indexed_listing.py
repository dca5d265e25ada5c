"""A remote storage's snapshot from its index object plus the listing of only what the index cannot know.

Shard objects are named by their 12-digit id, so their keys sort by id and a listing can start after
any id (``ObjectStore.listing`` after a name). A shard the index lacks has an id either above the index's last
one, or in a gap below it (an id absent when the index was written and committed since, by a writer
that never coordinates with the index's writer). So a reader lists:

* from the index's last shard on: the shards committed above it, and the last shard's own objects,
  which must match its record (an index naming a shard the store lacks, or another's, is refused);
* each run of ids the index skips, one request each while the listing finds nothing in the run.

Every id the index does not name is listed, so an index can never hide a shard, however old it is.
A storage written in one run (contiguous ids) costs one listing request beyond the index; when the
gaps would cost more requests than listing everything, everything is listed.
"""

from __future__ import annotations

import math
from functools import partial
from typing import Protocol

import numpy as np

from guideloom._remote.index_object import INDEX_OBJECT, MAX_INDEX_BYTES, parse_index_object
from guideloom._remote.object_backend import PAGE_SIZE
from guideloom._remote.object_store import ObjectStore
from guideloom._shards.layout import SHARDS_DIR, ShardInfo, StorageHeader, shard_file_name
from guideloom._shards.shard_table import ShardTable


class ListedStorage(Protocol):
    """What a listing needs of a remote storage's files (``RemoteFiles``): its store, URL, and how listed
    names become shards."""

    store: ObjectStore
    url: str

    def infos_from_names(
        self, names: dict[str, int], header: StorageHeader, read_footers: bool = True
    ) -> dict[int, ShardInfo]: ...


def read_index_object(files: ListedStorage, header: StorageHeader) -> ShardTable | str | None:
    """The storage's index object: its shards, the problem that makes it unusable, or None where there is none.

    A store that cannot list (a static HTTP server) serves a copy of a storage written elsewhere: its index
    object was written for that location."""
    found = files.store.read_start(INDEX_OBJECT, MAX_INDEX_BYTES)
    if found is None:
        return None
    copy = not files.store.listable
    return parse_index_object(found[0], found[1], header, files.url, MAX_INDEX_BYTES, any_location=copy)


def listed_id(name: str) -> int:
    """The shard id a listed name starts with, or -1 (a name that is no shard's or marker's)."""
    prefix = name[:12]
    return int(prefix) if len(prefix) == 12 and prefix.isascii() and prefix.isdigit() else -1


def gap_runs(ids: np.ndarray) -> list[tuple[int, int]]:
    """The runs ``(first, last)`` of ids below ``ids[-1]`` that ``ids`` (ascending) lacks."""
    if not len(ids):
        return []
    runs = [(0, int(ids[0]) - 1)] if ids[0] > 0 else []
    jumps = np.flatnonzero(ids[1:] - ids[:-1] > 1)
    runs += [(int(ids[jump]) + 1, int(ids[jump + 1]) - 1) for jump in jumps.tolist()]
    return runs


def full_listing_pages(shards: int) -> int:
    """Requests a listing of everything costs: a page per 1,000 objects, a shard and its marker each."""
    return max(1, math.ceil(2 * shards / PAGE_SIZE))


def snapshot_after_index(files: ListedStorage, header: StorageHeader, index: ShardTable) -> ShardTable | str | None:
    """The committed shards: the index's and those listed beyond it; a problem where the store
    contradicts the index; None where its gaps cost more to list than everything."""
    ids = index.ids
    runs = gap_runs(ids)
    if len(runs) + 1 > full_listing_pages(len(ids)):
        return None
    found: dict[int, ShardInfo] = {}
    for first, last in runs:
        names = files.store.listing(SHARDS_DIR, f"{first:012d}", partial(_beyond, last=last))
        found.update(files.infos_from_names(_between(names, first, last), header))
    last_id = int(ids[-1]) if len(ids) else -1
    # Start with the last indexed shard's own objects: its record is checked against them.
    names = files.store.listing(SHARDS_DIR, f"{last_id:012d}" if last_id >= 0 else "")
    if last_id >= 0:
        problem = _contradiction(files, header, index[len(index) - 1], _between(names, last_id, last_id))
        if problem is not None:
            return problem
    found.update(files.infos_from_names(_between(names, last_id + 1, None), header))
    if not found:
        return index
    added = ShardTable.of(found[shard] for shard in sorted(found))
    return ShardTable(np.sort(np.concatenate([index.rows, added.rows]), order="id"))


def _beyond(name: str, last: int) -> bool:
    shard = listed_id(name)
    return shard < 0 or shard > last


def _between(names: dict[str, int], first: int, last: int | None) -> dict[str, int]:
    kept = {}
    for name, size in names.items():
        shard = listed_id(name)
        if shard >= first and (last is None or shard <= last):
            kept[name] = size
    return kept


def _contradiction(files: ListedStorage, header: StorageHeader, record: ShardInfo, names: dict[str, int]) -> str | None:
    """Why the listed objects of the index's last shard contradict its record, or None."""
    where = f"{files.url}/{INDEX_OBJECT}"
    if shard_file_name(record.id) not in names:
        return f"{where} names shard {record.id}, which the store does not hold (deleted since, or another's index)"
    listed = files.infos_from_names(names, header, read_footers=False).get(record.id)
    if listed is not None and listed != record:
        return f"{where} does not match the listing of shard {record.id} ({record} != {listed})"
    if listed is None and header.compression is None and names[shard_file_name(record.id)] != record.size:
        return f"{where} gives shard {record.id} {record.size} bytes, the store {names[shard_file_name(record.id)]}"
    return None


def problem_of_index(index: ShardTable | str | None, listed: ShardTable, url: str) -> str | None:
    """What ``verify`` says of the index object, given a listing of everything: None if it is absent or sound.

    Shards committed after the index are no problem (readers list them); shards it names that are not
    committed, or with other facts than the store's, are: readers would take them for committed.
    """
    advice = f"readers list past it; `guideloom index {url}` rewrites it"
    if isinstance(index, str):
        return f"{index}: {advice}"
    if index is None:
        return None
    where = f"{url}/{INDEX_OBJECT}"
    invented = listed.lacking(index.ids)
    if len(invented):
        return (
            f"{where} names {len(invented)} shards that are not committed (first: shard {int(invented[0])}): {advice}"
        )
    same, _ = listed.select(index.ids)
    differing = np.flatnonzero(same.rows != index.rows)
    if len(differing):
        position = int(differing[0])
        facts = f"{index[position]} != {same[position]}"
        return f"{where} gives shard {index[position].id} other facts than the store's ({facts}): {advice}"
    return None
