"""Field columns: a shard's small fields again, one field to a section, so that they can be read without the records.

A shard of a storage whose header names ``field_columns`` (the non-media fields of a `RecordSchema` that has media
fields; footer flag 8) holds, after its other sections and before its footer, one *column* per named field and a
*column table* (docs/format.md, "Field columns")::

    column     the field's bytes of every record, back to back (exactly the bytes the record holds)
               record_count sizes, little-endian, each 1, 2 or 4 bytes wide (the narrowest that holds the largest)
               with absent values only: ceil(record_count / 8) presence bytes, bit k % 8 of byte k // 8 for record k
               zero bytes up to a multiple of 8
    table      one entry of 16 bytes per column, in the header's order:
                 u64 values size   u32 CRC-32 of the column (values, sizes, presence)   u8 size width   u8 presence
                 2x
               u32 CRC-32 of the entries   4x

The table's size follows from the header, so a reader finds it from the end of the shard, and each column from
the table; each column is checked alone against its CRC-32. Sizes, not ends: a caption of 50 bytes costs one
byte more (2%), where a uint32 end would cost four (8%).
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from guideloom._core.errors import CorruptStorageError

FIELD_COLUMNS_FLAG = 8  # the footer flag of a shard that holds field columns
ENTRY = struct.Struct("<QIBB2x")
TABLE_END = struct.Struct("<I4x")
WIDTHS = {1: "<u1", 2: "<u2", 4: "<u4"}

# Splits a record's bytes into the bytes of each column's field (None: the field is absent from the record).
ColumnSplitter = Callable[[memoryview], Sequence["memoryview | bytes | None"]]


def padded(size: int) -> int:
    return (size + 7) // 8 * 8


def table_size(columns: int) -> int:
    """Bytes of the column table of a shard with ``columns`` field columns (0: none)."""
    return columns * ENTRY.size + TABLE_END.size if columns else 0


@dataclass(frozen=True)
class ColumnEntry:
    """One column's entry in the table, and where the column lies in the shard (``start``)."""

    values_size: int
    crc: int
    width: int
    has_presence: bool
    start: int
    record_count: int

    @property
    def size(self) -> int:
        """The column's bytes (values, sizes, presence), without its padding."""
        presence = (self.record_count + 7) // 8 if self.has_presence else 0
        return self.values_size + self.width * self.record_count + presence


def parse_table(
    raw: bytes | memoryview, names: Sequence[str], record_count: int, columns_start: int
) -> list[ColumnEntry] | str:
    """The entries of the column table ``raw`` (its ``table_size(len(names))`` bytes), placing the first column at
    ``columns_start``; or what is wrong with it."""
    count = len(names)
    entries_size = count * ENTRY.size
    if len(raw) != table_size(count):
        return f"its column table is {len(raw)} bytes, not {table_size(count)}"
    (crc,) = TABLE_END.unpack_from(raw, entries_size)
    if zlib.crc32(raw[:entries_size]) != crc or any(raw[entries_size + 4 :]):
        return "its column table is damaged (checksum)"
    entries, start = [], columns_start
    for number, name in enumerate(names):
        values_size, column_crc, width, has_presence = ENTRY.unpack_from(raw, number * ENTRY.size)
        if (
            width not in WIDTHS
            or has_presence not in (0, 1)
            or any(raw[number * ENTRY.size + 14 : (number + 1) * ENTRY.size])
        ):
            return f"the column table's entry of field {name!r} is not valid"
        entry = ColumnEntry(values_size, column_crc, width, bool(has_presence), start, record_count)
        entries.append(entry)
        start += padded(entry.size)
    return entries


def columns_size(entries: Sequence[ColumnEntry]) -> int:
    """Bytes of the columns and their table in a shard: what they add to its size."""
    return sum(padded(entry.size) for entry in entries) + table_size(len(entries))


class Column:
    """One field's column of one shard, checked: the value of each record as a view of the column's bytes."""

    def __init__(self, values: memoryview, ends: np.ndarray, presence: np.ndarray | None) -> None:
        self.values = values
        self.ends = ends.tolist()  # Python ints: indexing them is faster than NumPy scalars
        self.presence = presence

    def value(self, record: int) -> memoryview | None:
        """Record ``record``'s bytes of the field, or None where the record has no value of it."""
        presence = self.presence
        if presence is not None and not presence[record >> 3] >> (record & 7) & 1:
            return None
        return self.values[self.ends[record] : self.ends[record + 1]]


def open_column(section: memoryview, entry: ColumnEntry) -> Column | str:
    """The column in ``section`` (its ``entry.size`` bytes), checked against its entry, or what is wrong with it."""
    if len(section) != entry.size:
        return f"it is {len(section)} bytes, not {entry.size}"
    if zlib.crc32(section) != entry.crc:
        return "its checksum does not match"
    count = entry.record_count
    sizes = np.frombuffer(section, WIDTHS[entry.width], count, entry.values_size)
    ends = np.zeros(count + 1, np.int64)
    np.cumsum(sizes, out=ends[1:])
    if int(ends[-1]) != entry.values_size:
        return f"its sizes add up to {int(ends[-1])} bytes, not its {entry.values_size} bytes of values"
    presence = None
    if entry.has_presence:
        presence = np.frombuffer(section, np.uint8, (count + 7) // 8, entry.values_size + entry.width * count)
    return Column(section[: entry.values_size], ends, presence)


class ColumnsInProgress:
    """The field columns of a shard being written: each record's small fields copied here as it is written (they
    are small), written out after the other sections when the shard is finished."""

    def __init__(self, split: ColumnSplitter, count: int) -> None:
        self.split = split
        self.values = [bytearray() for _ in range(count)]
        self.sizes: list[list[int]] = [[] for _ in range(count)]
        self.absent: list[list[int]] = [[] for _ in range(count)]  # the records without a value, per column

    def add(self, record: memoryview) -> None:
        """Copy the fields of ``record`` (a record's bytes, as the shard stores it) into the columns."""
        pieces = self.split(record)
        if len(pieces) != len(self.values):
            raise ValueError(f"the record gave {len(pieces)} column values, not {len(self.values)}")
        for number, piece in enumerate(pieces):
            sizes = self.sizes[number]
            if piece is None:
                self.absent[number].append(len(sizes))
                sizes.append(0)
            else:
                self.values[number] += piece
                sizes.append(len(piece))

    def finish(self) -> bytes:
        """The columns and their table, as the shard holds them before its footer."""
        sections: list[bytes] = []
        entries = b""
        for values, sizes, absent in zip(self.values, self.sizes, self.absent, strict=True):
            largest = max(sizes, default=0)
            width = 1 if largest < 1 << 8 else 2 if largest < 1 << 16 else 4
            section = bytes(values) + np.asarray(sizes, WIDTHS[width]).tobytes()
            if absent:
                presence = np.ones(len(sizes), bool)
                presence[absent] = False
                section += np.packbits(presence, bitorder="little").tobytes()
            entries += ENTRY.pack(len(values), zlib.crc32(section), width, 1 if absent else 0)
            sections.append(section + bytes(padded(len(section)) - len(section)))
        return b"".join(sections) + entries + TABLE_END.pack(zlib.crc32(entries))


def splitter_for(names: Sequence[str], split: ColumnSplitter | None) -> tuple[ColumnSplitter, int] | None:
    """What a shard in progress needs to write the field columns ``names`` (a header's): ``split`` and their count;
    None where the header names none. A writer of such a storage without ``split`` is refused: its shards would lack
    the columns their header promises."""
    if not names:
        return None
    if split is None:
        raise ValueError(
            f"this storage's shards hold field columns ({', '.join(names)}): write it through its DocumentStorage "
            "with its RecordSchema"
        )
    return split, len(names)


class ShardColumns:
    """Some field columns of one shard, held alone (downloaded without the shard): each checked when first read."""

    def __init__(self, shard: int, where: str, sections: dict[str, tuple[memoryview, ColumnEntry]]) -> None:
        self.id = shard
        self.where = where  # names the copy in errors
        self.fields = frozenset(sections)
        self._sections = sections
        self._columns: dict[str, Column] = {}

    def column(self, field: str) -> Column:
        column = self._columns.get(field)
        if column is None:
            section, entry = self._sections[field]
            found = open_column(section, entry)
            if isinstance(found, str):
                raise CorruptStorageError(
                    f"shard {self.id}: its column of field {field!r} is damaged ({self.where}): {found}"
                )
            column = self._columns[field] = found
        return column

    def problem(self) -> str | None:
        """The first damaged column held, named by shard and field, or None."""
        for field, (section, entry) in self._sections.items():
            found = open_column(section, entry)
            if isinstance(found, str):
                return f"shard {self.id}: its column of field {field!r} is damaged: {found}"
        return None
