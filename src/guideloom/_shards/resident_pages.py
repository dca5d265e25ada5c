"""Mapped pages that reads leave resident in a process, given back as they add up.

A record read from a mapped shard is not copied: its pages are mapped into the reading process, and
memory tools count every page a process has touched as resident (``RssFile``) for as long as the
mapping lives, so a loader reading a storage larger than its memory seems to hold all of it. The
pages belong to the page cache, which reclaims them under pressure; dropping a process's mapping of
them (``madvise(MADV_DONTNEED)``) changes nothing a view reads, since a later access maps the same
page of the file again. So after every so many bytes of records read (the bound, below), a document
reader drops its open shards' pages, if those shards map more than that in all.

Every page dropped is mapped again (a page fault) when a shuffled epoch comes back to it, and a fault maps
the whole folio of the page cache that holds the page (up to 2 MiB: a shard written in large pieces is held
in large folios) or 64 KiB around it. Small records share folios, so after a release an epoch of them faults
in most of the storage again, and soon: their bound is large (1 GiB of records), and a storage that maps less
keeps its pages, as any reader that maps it would. A large record fills folios of its own: the pages it maps
are about its bytes, and the fault that maps them again is paid once a record anyway. Records of
``LARGE_RECORD`` bytes or more on average are given back after every 64 MiB, which keeps their resident pages
near that.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from typing import Protocol

RELEASE_BYTES = 2**30  # small records read between two releases, and the mapped total below which none is needed
LARGE_RECORD = 16 * 1024  # records at least this large on average ...
LARGE_RECORD_BOUND_SHARE = 16  # ... have a bound this many times smaller (64 MiB)
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)


class MappedShard(Protocol):
    @property
    def mapping(self) -> mmap.mmap | None: ...


def release_pages(mapping: mmap.mmap | None) -> None:
    """Drop this process's resident pages of a read-only file mapping; the data stays (in the page cache)."""
    if mapping is not None and _DONTNEED is not None:
        with contextlib.suppress(OSError, ValueError):  # a mapping closed meanwhile, a platform that refuses
            mapping.madvise(_DONTNEED)


def mapped_size(mapping: mmap.mmap | None) -> int:
    """The bytes a mapping spans (0 once closed)."""
    if mapping is None or mapping.closed:
        return 0
    return len(mapping)


class ResidentPages:
    """Counts the records read and their bytes, and drops the shards' mapped pages after every ``limit`` bytes of
    small records, or every sixteenth of it of large ones (the bound).

    Shards that map at most the bound in all are left as they are: their pages cannot add up to more.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RELEASE_BYTES if limit is None else limit
        self.read = 0
        self.records = 0

    def add(self, read_bytes: int, records: int = 1) -> None:
        self.read += read_bytes
        self.records += records

    def settle(self, shards: Iterable[MappedShard]) -> None:
        """Drop the mapped pages of ``shards`` (the reader's open ones) once enough was read since the last time."""
        large = self.read >= LARGE_RECORD * self.records
        bound = self.limit // LARGE_RECORD_BOUND_SHARE if large else self.limit
        if self.read >= bound:
            self.read = self.records = 0
            mappings = [shard.mapping for shard in shards]
            if sum(map(mapped_size, mappings)) > bound:
                for mapping in mappings:
                    release_pages(mapping)
