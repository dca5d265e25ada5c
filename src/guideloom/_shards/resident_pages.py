"""Mapped pages that reads leave resident in a process, given back as they add up.

A record read from a mapped shard is not copied: its pages are mapped into the reading process, and
memory tools count every page a process has touched as resident (``RssFile``) for as long as the
mapping lives, so a loader reading a storage larger than its memory seems to hold all of it. The
pages belong to the page cache, which reclaims them under pressure; dropping a process's mapping of
them (``madvise(MADV_DONTNEED)``) changes nothing a view reads, since a later access maps the same
page of the file again. So after every ``RELEASE_BYTES`` of records read, a document reader drops
its open shards' pages, if those shards map more than that in all.

Every page dropped is mapped again (a page fault) when a shuffled epoch comes back to it, and the kernel
maps up to 64 KiB around each page it faults in, so a bound much smaller than the storage makes an epoch
of small records fault in most of the storage again after every release: the bound is large (256 MiB)
so an epoch pays few such rounds.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from typing import Protocol

RELEASE_BYTES = 256 * 2**20  # records read between two releases, and the mapped total below which none is needed
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
    """Counts the bytes of records read, and drops the shards' mapped pages after every ``limit`` of them.

    Shards that map at most ``limit`` bytes in all are left as they are: their pages cannot add up to more.
    """

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RELEASE_BYTES if limit is None else limit
        self.read = 0

    def add(self, read_bytes: int) -> None:
        self.read += read_bytes

    def settle(self, shards: Iterable[MappedShard]) -> None:
        """Drop the mapped pages of ``shards`` (the reader's open ones) once ``limit`` bytes were read since last."""
        if self.read >= self.limit:
            self.read = 0
            mappings = [shard.mapping for shard in shards]
            if sum(map(mapped_size, mappings)) > self.limit:
                for mapping in mappings:
                    release_pages(mapping)
