"""The on-disk layout of a storage (see docs/format.md).

A storage is a directory::

    guideloom.json            header: layout version, kind, format, dtype
    shards/<12-digit id>.shard  one immutable file per committed shard
    incomplete/               writers' files in progress (ignored by readers)

A shard file is ``data | padding to 8 bytes | offsets | footer``: the records'
bytes (or tokens) back to back, ``record_count + 1`` little-endian uint64
offsets in elements of the data, and a fixed 64-byte footer with counts and
CRC-32 checksums; before the footer, the storage's header may call for record
lengths, a loss mask, checkpoints and field columns (in that order). Shards appear only by an
atomic hard link of a fully written and fsynced file, so a reader never sees a
partial shard.
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import stat
import sys
import zlib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from guideloom._core.checksums import crc32
from guideloom._core.errors import CorruptStorageError, FormatMismatchError, StorageNotFoundError
from guideloom._shards.checkpoints import (
    CHECKPOINTS_FLAG,
    checkpoint_count,
    checkpoints_section,
    closing_checkpoints,
    piece_range,
    running_checkpoints,
)
from guideloom._shards.field_columns import (
    FIELD_COLUMNS_FLAG,
    Column,
    ColumnEntry,
    columns_size,
    open_column,
    parse_table,
    table_size,
)
from guideloom._shards.footer import FOOTER as FOOTER  # also imported from here
from guideloom._shards.footer import decode_footer, shard_footer
from guideloom._shards.header import HEADER_NAME, LAYOUT_VERSION, why_not_a_directory
from guideloom._shards.header import StorageHeader as StorageHeader  # also imported from here (snapshots, upkeep)
from guideloom._shards.index_check import index_problem
from guideloom._shards.limits import RESOURCE_ERRNOS, out_of_resources
from guideloom._shards.loss_masks import LOSS_MASK_FLAG, mask_size
from guideloom._shards.mapped_shards import track, untrack
from guideloom._shards.record_lengths import RECORD_LENGTHS_FLAG, lengths_problem, sizes_as_lengths
from guideloom._shards.sections import ShardSections
from guideloom._shards.sections import padded as padded  # also imported from here
from guideloom._shards.shard_names import MAX_SHARD_ID as MAX_SHARD_ID  # also imported from here
from guideloom._shards.shard_names import check_shard_id as check_shard_id
from guideloom._shards.shard_names import shard_file_name as shard_file_name
from guideloom._shards.shard_names import shard_id_of

INDEX_NAME = "shards.index"  # the record of commits (see _shards.index)
SHARDS_DIR = "shards"
INCOMPLETE_DIR = "incomplete"

KNOWN_FLAGS = LOSS_MASK_FLAG | RECORD_LENGTHS_FLAG | CHECKPOINTS_FLAG | FIELD_COLUMNS_FLAG


@dataclass(frozen=True)
class ShardInfo:
    """What a reader needs to index a shard without opening it: its counts, data checksum and file size."""

    id: int
    record_count: int
    element_count: int
    data_crc: int
    size: int


def shard_size(record_count: int, data_size: int, header: StorageHeader | None = None, columns_size: int = 0) -> int:
    """Bytes of a shard file with these counts (data, padding, offsets, the record lengths, loss mask and checkpoints
    that ``header``'s shards hold, ``columns_size`` bytes of field columns, footer: see `ShardSections`)."""
    return ShardSections.of(record_count, data_size, header, columns_size).size


def fsync_directory(path: Path) -> None:
    descriptor = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)


def publish(temporary: Path, final: Path) -> bool:
    """Atomically make ``temporary`` visible as ``final`` unless it exists; True if we won."""
    try:
        os.link(temporary, final)
    except FileExistsError:
        return False
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
    fsync_directory(final.parent)
    return True


def incomplete_dir(path: Path) -> Path:
    """The directory of a local storage where writers build shards before committing them."""
    return path / INCOMPLETE_DIR


def shard_file_size(path: Path, shard: int) -> int:
    """The size of a committed shard's file, 0 if it vanished (only to size progress reports)."""
    try:
        return (path / SHARDS_DIR / shard_file_name(shard)).lstat().st_size
    except OSError:
        return 0


def holds_storage(path: Path) -> bool:
    """Whether ``path`` holds a storage's header (a storage was created there)."""
    return (path / HEADER_NAME).exists()


def is_unfinished_storage(path: Path) -> bool:
    """What a writer killed before it published the header leaves: an empty ``shards/`` and ``incomplete/``, and
    perhaps the empty index."""
    names = set(os.listdir(path))
    if not names or not names <= {SHARDS_DIR, INCOMPLETE_DIR, INDEX_NAME}:
        return False
    if any((path / name).is_symlink() or (path / name).is_dir() != (name != INDEX_NAME) for name in names):
        return False
    return SHARDS_DIR not in names or not any((path / SHARDS_DIR).iterdir())


def committed_shard_ids(path: Path) -> list[int]:
    """Ids of the committed shards, ascending; names that are not shard names are ignored."""
    try:
        names = os.listdir(path / SHARDS_DIR)
    except FileNotFoundError:
        return []
    except NotADirectoryError:
        if not path.is_dir():
            raise StorageNotFoundError(f"no storage at {path}: {why_not_a_directory(path)}") from None
        raise CorruptStorageError(f"{path / SHARDS_DIR} cannot be listed: it is not a directory") from None
    except OSError as error:  # a symlink loop, no permission, ...
        raise CorruptStorageError(f"{path / SHARDS_DIR} cannot be listed: {error.strerror or error}") from None
    return sorted(shard for name in names if (shard := shard_id_of(name)) is not None)


def shard_trailer(
    shard: int,
    offsets: list[int],
    data_size: int,
    data_crc: int,
    header: StorageHeader,
    loss_mask: bytes = b"",
    lengths: bytes = b"",
    checkpoints: Sequence[int] | np.ndarray = (),
    columns: bytes = b"",
) -> bytes:
    """What a writer appends after a shard's data: padding to 8 bytes, the record offsets, the record lengths
    of a storage that records them, the packed loss mask of a masked storage (padded to 8 bytes), the data's
    checkpoints where the header gives ``checkpoint_bytes`` (padded to 8 bytes), the field ``columns`` and their
    table where the header names field columns (``ColumnsInProgress.finish``), the footer.

    ``ShardFile`` reads it back; ``offsets`` are the ``record_count + 1`` element offsets of the records;
    ``data_crc`` covers the data and then ``lengths`` and ``loss_mask``. A wrong count of checkpoints is a
    ValueError: the file would be refused as truncated.
    """
    expected = 0 if header.checkpoint_bytes is None else checkpoint_count(data_size, header.checkpoint_bytes)
    if len(checkpoints) != expected:
        raise ValueError(f"shard {shard} needs {expected} checkpoints for {data_size} bytes, got {len(checkpoints)}")
    index = np.asarray(offsets, dtype="<u8").tobytes()
    footer = shard_footer(shard, len(offsets) - 1, data_size, data_crc, zlib.crc32(index), header)
    mask = loss_mask + bytes(padded(len(loss_mask)) - len(loss_mask))
    section = checkpoints_section(checkpoints) if header.checkpoint_bytes is not None else b""
    if bool(columns) != bool(header.field_columns):
        raise ValueError(f"shard {shard}: field columns are written where the header names them, and only there")
    return bytes(padded(data_size) - data_size) + index + lengths + mask + section + columns + footer


def verify_shards(
    shards: Iterable[ShardFile], progress: Callable[[int], None] | None, problems: list[str]
) -> list[str]:
    """``problems`` with those found by recomputing each shard's checksums; ``progress`` gets the bytes checked."""
    for shard in shards:
        problem = shard.verify()
        if problem is not None:
            problems.append(problem)
        if progress is not None:
            progress(shard.data_size)
    return problems


class ShardFile:
    """One committed shard, mapped read-only; validated structurally on open."""

    def __init__(self, storage_path: Path, shard: int, header: StorageHeader, file: Path | None = None) -> None:
        """Open shard ``shard`` of the storage at ``storage_path``, or the shard's copy at ``file``."""
        self.id = shard
        self.path = storage_path / SHARDS_DIR / shard_file_name(shard) if file is None else file
        try:
            # O_NONBLOCK: a FIFO planted under a shard's name must not block the open (it is refused below)
            descriptor = os.open(self.path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        except FileNotFoundError:
            raise CorruptStorageError(
                f"shard {shard} vanished: its file {self.path} was deleted or renamed while the storage was read (a "
                "reader keeps only the shards it has mapped, at most max_open_shards; delete or move a storage's "
                "files only when no loader reads it)"
            ) from None
        except OSError as error:
            if error.errno in RESOURCE_ERRNOS:
                raise out_of_resources(error, shard, self.path) from None
            if error.errno == errno.ELOOP and os.path.islink(self.path):  # refused, not followed: see docs/format.md
                raise CorruptStorageError(
                    f"shard {shard} is a symbolic link ({self.path} -> {os.readlink(self.path)}), not a shard file: "
                    "guideloom writes no links, so it follows none; put the shard file itself in its place"
                ) from None
            raise CorruptStorageError(f"shard {shard} cannot be opened ({self.path}): {error}") from None
        try:
            status = os.fstat(descriptor)
            size = status.st_size
            if not stat.S_ISREG(status.st_mode):
                raise CorruptStorageError(f"shard {shard} is not a regular file: {self.path}")
            if size < FOOTER.size:
                raise CorruptStorageError(f"shard {shard} is truncated: {self.path} has only {size} bytes")
            try:
                self._mapping: mmap.mmap | None = mmap.mmap(descriptor, size, access=mmap.ACCESS_READ)
            except OSError as error:
                if error.errno in RESOURCE_ERRNOS:
                    raise out_of_resources(error, shard, self.path) from None
                raise CorruptStorageError(f"shard {shard} cannot be mapped ({self.path}): {error}") from None
            except ValueError:  # mmap reads the size again: the file shrank since fstat (truncated meanwhile)
                raise CorruptStorageError(
                    f"shard {shard} is truncated: {self.path} shrank below its {size} bytes while it was opened"
                ) from None
        finally:
            os.close(descriptor)
        footer = self._mapping[size - FOOTER.size :]
        decoded = decode_footer(footer)
        if decoded is None:
            self.close()
            raise CorruptStorageError(f"shard {shard} has a damaged footer ({self.path}); is it truncated?")
        version, flags, footer_shard, record_count, data_size, data_crc, index_crc, header_crc = decoded
        if version != LAYOUT_VERSION:
            self.close()
            raise FormatMismatchError(f"shard {shard} has layout version {version}, expected {LAYOUT_VERSION}")
        if flags & ~KNOWN_FLAGS:
            self.close()
            raise FormatMismatchError(f"shard {shard} uses footer flags {flags:#x} this guideloom does not know")
        if flags != header.footer_flags:
            self.close()
            raise FormatMismatchError(
                f"shard {shard} {_flags_differ(flags, header)}, unlike its storage's header ({self.path})"
            )
        if header_crc != header.checksum:
            self.close()
            raise FormatMismatchError(f"shard {shard} was written for another storage header ({self.path})")
        found = ShardSections.of_file(record_count, data_size, header, size)
        if footer_shard != shard or found is None or data_size % header.element_size:
            self.close()
            raise CorruptStorageError(f"shard {shard} has inconsistent sizes ({self.path}): file truncated?")
        sections = found
        # The field columns' entries (where the header names field columns), each column checked when first read.
        self.header_columns = header.field_columns
        self.column_entries: list[ColumnEntry] = []
        self._columns: dict[str, Column] = {}
        if header.field_columns:
            table_start = sections.footer_start - table_size(len(header.field_columns))
            entries = parse_table(
                self._mapping[table_start : sections.footer_start],
                header.field_columns,
                record_count,
                sections.columns_start,
            )
            if isinstance(entries, str) or columns_size(entries) != sections.footer_start - sections.columns_start:
                self.close()
                damage = entries if isinstance(entries, str) else "its column table does not fit its file's size"
                raise CorruptStorageError(f"shard {shard} has damaged field columns ({self.path}): {damage}")
            self.column_entries = entries
        self.record_count = int(record_count)
        self.data_size = int(data_size)
        self.data_crc = int(data_crc)
        self.index_crc = int(index_crc)
        self.element_size = header.element_size
        self.element_count = self.data_size // header.element_size
        self.view = memoryview(self._mapping)
        # The data elements the mapping holds (``low .. high - 1``): all of them; a part of a shard (`ShardPart`)
        # holds fewer.
        self.held = (0, self.element_count)
        self.sections = sections
        self.offsets = np.frombuffer(self._mapping, "<u8", self.record_count + 1, sections.index_start)
        # The stored record lengths (int64, mapped) of a storage that records them, else None.
        self.lengths: np.ndarray | None = None
        if header.record_lengths:
            self.lengths = np.frombuffer(self._mapping, "<i8", self.record_count, sections.lengths_start)
            problem = lengths_problem(self.lengths)
            if problem is not None:
                self.close()
                raise CorruptStorageError(f"shard {shard} has damaged record lengths ({self.path}): {problem}")
        # The packed loss mask of a masked storage's shard (uint8, little bit order), else None.
        self.mask_bits: np.ndarray | None = (
            np.frombuffer(self._mapping, np.uint8, mask_size(self.element_count), sections.mask_start)
            if header.loss_mask
            else None
        )
        # The running CRC-32 of the data at the end of each piece (uint32, mapped) where the header gives
        # checkpoint_bytes, else None: the last section before the footer.
        self.checkpoint_bytes = header.checkpoint_bytes
        self.checkpoints: np.ndarray | None = None
        if self.checkpoint_bytes is not None:
            count = checkpoint_count(self.data_size, self.checkpoint_bytes)
            self.checkpoints = np.frombuffer(self._mapping, "<u4", count, sections.checkpoints_start)
        # Indexing a memoryview gives Python ints several times faster than NumPy scalars do.
        index_bytes = self.view[sections.index_start : sections.lengths_start]
        problem = index_problem(index_bytes, self.offsets, self.index_crc, self.element_count)
        if problem is not None:
            index_bytes.release()
            self.close()
            raise CorruptStorageError(f"shard {shard} has a damaged record index ({self.path}): {problem}")
        self._record_offsets = (
            index_bytes.cast("Q")
            if sys.byteorder == "little"
            else memoryview(self.offsets.astype("=u8").tobytes()).cast("Q")
        )
        track(shard, self.path, self._mapping)  # a truncation under this reader can then be named

    def column(self, field: str) -> Column:
        """The column of ``field`` (one the header names), checked against its checksum when first read."""
        column = self._columns.get(field)
        if column is None:
            entry = self.column_entries[self.header_columns.index(field)]
            found = open_column(self.view[entry.start : entry.start + entry.size], entry)
            if isinstance(found, str):
                raise CorruptStorageError(
                    f"shard {self.id}: its column of field {field!r} is damaged ({self.path}): {found}"
                )
            column = self._columns[field] = found
        return column

    @property
    def info(self) -> ShardInfo:
        return ShardInfo(self.id, self.record_count, self.element_count, self.data_crc, len(self.view))

    @property
    def mapping(self) -> mmap.mmap | None:
        """The shard's read-only mapping (None once closed)."""
        return self._mapping

    def record_lengths(self) -> np.ndarray:
        """Every record's length (int64, read-only): stored ones mapped, else each record's size in elements."""
        return self.lengths if self.lengths is not None else sizes_as_lengths(self.offsets)

    def record_length(self, record: int) -> int:
        """Record ``record``'s length: the stored one, else its size in elements (bytes or tokens)."""
        if self.lengths is not None:
            return int(self.lengths[record])
        start, stop = self.record_bounds(record)
        return stop - start

    @property
    def record_offsets(self) -> memoryview:
        """Where each record starts (in elements), then where the last ends: indexing gives Python ints."""
        return self._record_offsets

    def covers(self, start: int, stop: int) -> bool:
        """Whether data elements ``start .. stop - 1`` are in the mapping: all of a whole shard's are, a part's
        only those it holds (``held``)."""
        low, high = self.held
        return low <= start and stop <= high

    def record_bounds(self, record: int) -> tuple[int, int]:
        """Element offsets of a record, checked so a damaged index can never read out of bounds."""
        start = self._record_offsets[record]
        stop = self._record_offsets[record + 1]
        if not start <= stop <= self.element_count:
            raise CorruptStorageError(
                f"shard {self.id} has a damaged index at record {record} ({self.path}): run verify"
            )
        return start, stop

    def verify(self) -> str | None:
        """Recompute the checksums and checkpoints; the problem found, or None."""
        sections = self.sections
        computed: list[int] = []  # the checkpoints the data gives
        if self.checkpoint_bytes is None:
            data_crc = crc32(self.view[: self.data_size])
        else:
            computed, data_crc = running_checkpoints(self.view[: self.data_size], self.checkpoint_bytes)
            computed += closing_checkpoints(self.data_size, self.checkpoint_bytes, data_crc)
            if any(self.view[sections.checkpoints_start + 4 * len(computed) : sections.columns_start]):
                return f"shard {self.id}: padding after the checkpoints is not zero ({self.path})"
        if self.lengths is not None:  # the data checksum goes on over the record lengths
            data_crc = zlib.crc32(self.view[sections.lengths_start : sections.mask_start], data_crc)
        if self.mask_bits is not None:  # the data checksum goes on over the packed mask
            mask_end = sections.mask_start + len(self.mask_bits)
            data_crc = zlib.crc32(self.view[sections.mask_start : mask_end], data_crc)
            if any(self.view[mask_end : sections.checkpoints_start]):
                return f"shard {self.id}: padding after the loss mask is not zero ({self.path})"
        if self.checkpoints is not None and self.checkpoint_bytes is not None:
            stored = self.checkpoints.tolist()
            bad = next((piece for piece, crc in enumerate(computed) if crc != stored[piece]), None)
            if bad is not None:
                where = piece_range(bad, self.checkpoint_bytes, self.data_size)
                if data_crc == self.data_crc:  # the data is sound: the checkpoint is what changed
                    return f"shard {self.id}: the checkpoint of {where} is damaged ({self.path})"
                return f"shard {self.id}: {where} do not match their checkpoint ({self.path})"
        if data_crc != self.data_crc:
            what = "data or loss mask checksum" if self.mask_bits is not None else "data checksum"
            what = "data or record lengths checksum" if self.lengths is not None else what
            return f"shard {self.id}: {what} mismatch ({self.path})"
        if any(self.view[self.data_size : sections.index_start]):
            return f"shard {self.id}: padding after the data is not zero ({self.path})"
        if zlib.crc32(self.view[sections.index_start : sections.lengths_start]) != self.index_crc:
            return f"shard {self.id}: index checksum mismatch ({self.path})"
        offsets = self.offsets
        if offsets[0] != 0 or offsets[-1] != self.element_count or bool(np.any(offsets[1:] < offsets[:-1])):
            return f"shard {self.id}: index offsets are not consistent ({self.path})"
        return self._columns_problem()

    def _columns_problem(self) -> str | None:
        """The first damaged field column, named by its field, or None."""
        for field, entry in zip(self.header_columns, self.column_entries, strict=True):
            found = open_column(self.view[entry.start : entry.start + entry.size], entry)
            if isinstance(found, str):
                return f"shard {self.id}: its column of field {field!r} is damaged: {found} ({self.path})"
            found.values.release()
            if any(self.view[entry.start + entry.size : entry.start + padded(entry.size)]):
                return f"shard {self.id}: padding after the column of field {field!r} is not zero ({self.path})"
        return None

    def close(self) -> None:
        """Release the mapping; if the user still holds views into it, it goes when they do."""
        self.offsets = np.empty(0, "<u8")
        self.mask_bits = None
        self.lengths = None
        self.checkpoints = None
        self._columns = {}
        record_offsets, self._record_offsets = getattr(self, "_record_offsets", None), memoryview(b"").cast("Q")
        if record_offsets is not None:
            record_offsets.release()
        view, self.view = getattr(self, "view", None), memoryview(b"")
        mapping, self._mapping = self._mapping, None
        if view is not None:
            with contextlib.suppress(BufferError):
                view.release()
        if mapping is not None:
            untrack(mapping)
            with contextlib.suppress(BufferError):
                mapping.close()


def _flags_differ(flags: int, header: StorageHeader) -> str:
    """How a shard's footer flags contradict its header's, in words."""
    if (flags ^ header.footer_flags) & LOSS_MASK_FLAG:
        return "holds a loss mask" if flags & LOSS_MASK_FLAG else "holds no loss mask"
    if (flags ^ header.footer_flags) & RECORD_LENGTHS_FLAG:
        return "holds record lengths" if flags & RECORD_LENGTHS_FLAG else "holds no record lengths"
    if (flags ^ header.footer_flags) & CHECKPOINTS_FLAG:
        return "holds checkpoints" if flags & CHECKPOINTS_FLAG else "holds no checkpoints"
    return "holds field columns" if flags & FIELD_COLUMNS_FLAG else "holds no field columns"
