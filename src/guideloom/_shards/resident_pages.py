"""Mapped pages that reads leave resident in a process, given back as they add up.

A record read from a mapped shard is not copied: its pages are mapped into the reading process, and
memory tools count every page a process has touched as resident (``RssFile``) for as long as the
mapping lives, so a loader reading a storage larger than its memory seems to hold all of it. The
pages belong to the page cache, which reclaims them under pressure; dropping a process's mapping of
them (``madvise(MADV_DONTNEED)``) changes nothing a view reads, since a later access maps the same
page of the file again. So after every ``RELEASE_BYTES`` of records read, a document reader drops
its open shards' pages.
"""

from __future__ import annotations

import contextlib
import mmap
from collections.abc import Iterable
from typing import Protocol

RELEASE_BYTES = 32 * 2**20  # records read between two releases: the resident pages a reader leaves at most
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)


class MappedShard(Protocol):
    @property
    def mapping(self) -> mmap.mmap | None: ...


def release_pages(mapping: mmap.mmap | None) -> None:
    """Drop this process's resident pages of a read-only file mapping; the data stays (in the page cache)."""
    if mapping is not None and _DONTNEED is not None:
        with contextlib.suppress(OSError, ValueError):  # a mapping closed meanwhile, a platform that refuses
            mapping.madvise(_DONTNEED)


class ResidentPages:
    """Counts the bytes of records read, and drops the shards' mapped pages after every ``limit`` of them."""

    def __init__(self, limit: int | None = None) -> None:
        self.limit = RELEASE_BYTES if limit is None else limit
        self.read = 0

    def add(self, read_bytes: int) -> None:
        self.read += read_bytes

    def settle(self, shards: Iterable[MappedShard]) -> None:
        """Drop the mapped pages of ``shards`` (the reader's open ones) once ``limit`` bytes were read since last."""
        if self.read >= self.limit:
            self.read = 0
            for shard in shards:
                release_pages(shard.mapping)
