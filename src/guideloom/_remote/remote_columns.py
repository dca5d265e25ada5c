"""Some field columns of a remote shard, without the shard: two ranged reads, cached for every process of a machine.

A shard of a storage whose header names field columns ends with its columns, their table and its footer
(docs/format.md, "Field columns"), and the listing says how large the shard is. So a reader of column fields
alone reads the table and the footer (one ranged GET of the object's last bytes: their size follows from the
header) and then the columns it wants (one ranged GET each), not the records, their offsets or their lengths.
The footer is checked against the listing (a replaced shard is never read as the listed one), the table
against its checksum and the shard's size, each column against its own checksum.

What was read is cached as one file of its own, ``<id>.<data crc>.<size>.c<columns>.shard`` (the columns a bit
each, in hex): the table and footer, then the columns, back to back. It is an entry of the shard cache like a
whole shard or a part of one: downloaded under the cache's lock (one process of the machine fetches, the others
wait and read it), counted in ``cache_limit_bytes`` at its size, evicted least recently used, and its downloads
left alone by ``clean`` while they run. A reader reads it into memory and lets it go.
"""

from __future__ import annotations

from pathlib import Path

from guideloom._core.errors import CorruptStorageError
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.remote_lengths import listed_footer_problem
from guideloom._remote.shard_cache import CacheEntry, ShardCache
from guideloom._shards.field_columns import ShardColumns, columns_size, parse_table, table_size
from guideloom._shards.footer import FOOTER, decode_footer
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import SHARDS_DIR, ShardInfo, shard_file_name
from guideloom._shards.sections import ShardSections

__all__ = ["RemoteColumns"]


class RemoteColumns:
    """The field columns of one remote storage's shards, read by range and kept in its shard cache."""

    def __init__(self, store: ObjectStore, header: StorageHeader, cache: ShardCache) -> None:
        self.store = store
        self.header = header
        self.cache = cache
        self.names = header.field_columns
        self.ranged = header.compression is None and bool(self.names)

    def entry(self, info: ShardInfo, fields: frozenset[str]) -> CacheEntry:
        """The cache entry of these columns of the shard; the room its download makes is a bound: every column, their
        table and the footer."""
        mask = sum(1 << number for number, name in enumerate(self.names) if name in fields)
        name = f"{info.id:012d}.{info.data_crc:08x}.{info.size}.c{mask:x}.shard"
        return CacheEntry(name, info.size - self._sections(info).columns_start, info.id)

    def open(self, info: ShardInfo, fields: frozenset[str]) -> ShardColumns:
        """The columns of ``fields`` (named by the header) of the shard, from the cache, downloaded first if needed."""
        entry = self.entry(info, fields)
        object_name = f"{SHARDS_DIR}/{shard_file_name(info.id)}"
        where = f"columns of {self.store.name_of(object_name)}"

        def download(path: Path) -> None:
            path.write_bytes(self._download(info, fields, object_name))

        def check(path: Path) -> str | None:
            found = self.parse(path.read_bytes(), info, fields, where)
            return found if isinstance(found, str) else found.problem()

        lease = self.cache.acquire(entry, download, check)
        try:
            raw = lease.path.read_bytes()
        finally:
            lease.release()
        found = self.parse(raw, info, fields, where)
        if isinstance(found, str):
            raise CorruptStorageError(f"shard {info.id}: {where} in the cache is damaged: {found}")
        return found

    def _sections(self, info: ShardInfo) -> ShardSections:
        sections = ShardSections.of_file(
            info.record_count, info.element_count * self.header.element_size, self.header, info.size
        )
        if sections is None:
            raise CorruptStorageError(
                f"shard {info.id} is listed with {info.size} bytes, which cannot hold its records and field columns"
            )
        return sections

    def _download(self, info: ShardInfo, fields: frozenset[str], object_name: str) -> bytes:
        """The table and footer, then the columns wanted (whatever they hold: the check judges them)."""
        sections = self._sections(info)
        tail_start = sections.footer_start - table_size(len(self.names))
        tail = self._read(object_name, info, tail_start, info.size)
        entries = parse_table(tail[: -FOOTER.size], self.names, info.record_count, sections.columns_start)
        if isinstance(entries, str):
            return tail  # the check names the damage
        pieces = [tail]
        for name, entry in zip(self.names, entries, strict=True):
            if name in fields and entry.start + entry.size <= tail_start:
                pieces.append(self._read(object_name, info, entry.start, entry.start + entry.size))
        return b"".join(pieces)

    def _read(self, object_name: str, info: ShardInfo, start: int, stop: int) -> bytes:
        raw = self.store.read(object_name, start, stop) if stop > start else b""
        if raw is None:
            raise CorruptStorageError(
                f"shard {info.id} vanished: {self.store.name_of(object_name)} was deleted from the store after this "
                "reader listed it"
            )
        return raw

    def parse(self, raw: bytes, info: ShardInfo, fields: frozenset[str], where: str) -> ShardColumns | str:
        """The columns in a cached file's bytes ``raw``, or what is wrong with them (the columns' own checksums are
        checked when each is read, or by `ShardColumns.problem`)."""
        sections = self._sections(info)
        tail_size = table_size(len(self.names)) + FOOTER.size
        if len(raw) < tail_size:
            return f"shard {info.id}: its column table and footer were read short ({len(raw)} bytes)"
        problem = listed_footer_problem(decode_footer(raw[tail_size - FOOTER.size : tail_size]), info, self.header)
        if problem is not None:
            return f"shard {info.id}: {problem}"
        entries = parse_table(raw[: tail_size - FOOTER.size], self.names, info.record_count, sections.columns_start)
        if isinstance(entries, str):
            return f"shard {info.id}: {entries}"
        if columns_size(entries) + FOOTER.size != info.size - sections.columns_start:
            return f"shard {info.id}: its column table does not fit its size"
        view = memoryview(raw)
        held, offset = {}, tail_size
        for name, entry in zip(self.names, entries, strict=True):
            if name in fields:
                held[name] = (view[offset : offset + entry.size], entry)
                offset += entry.size
        if offset != len(raw):
            return f"shard {info.id}: the columns read are {len(raw) - tail_size} bytes, not {offset - tail_size}"
        return ShardColumns(info.id, where, held)
