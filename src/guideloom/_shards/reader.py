"""Readers: a snapshot of the committed shards, mapped, with global record indices.

Global index ``i`` runs over shards in ascending id, records in append order.
Reads are zero-copy: documents get a read-only ``memoryview`` into the mapped
file, tokens a read-only NumPy view.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from types import TracebackType
from typing import Any, Generic, TypeVar

import numpy as np

from guideloom._core.checks import check_int, check_sequence_length
from guideloom._shards.field_columns import ShardColumns
from guideloom._shards.fingerprints import earlier_fingerprint, snapshot_fingerprint
from guideloom._shards.formats import DocumentStorageFormat, FieldFormat
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardFile, verify_shards
from guideloom._shards.loss_masks import unpack_bits
from guideloom._shards.resident_pages import ResidentPages
from guideloom._shards.shard_access import ShardSet, first_positions
from guideloom._shards.shard_table import ShardTable

Out = TypeVar("Out")
R = TypeVar("R", bound="StorageReader[Any]")


def check_index(index: object, length: int, what: str = "index") -> int:
    """Validate a global index: an int in [0, length)."""
    index = check_int(what, index)
    if not 0 <= index < length:
        raise IndexError(f"{what} {index} is out of range for a storage of {length} records")
    return index


def _starts(counts: np.ndarray) -> np.ndarray:
    """0, then the running sums of ``counts`` (int64): where each shard's records or tokens begin."""
    starts = np.empty(len(counts) + 1, np.int64)
    starts[0], starts[1:] = 0, counts  # a column of the table: summed in place once contiguous, twice as fast
    np.cumsum(starts[1:], out=starts[1:])
    return starts


class StorageReader(Generic[Out]):
    """The shards committed when the reader was opened, and their record counts.

    Shards are opened through the reader's :class:`ShardSet` when first read (a remote storage's are
    downloaded then), and at most its ``max_open`` stay open: the least recently used is closed when
    another is opened. Views into a closed shard stay valid (its mapping goes when the last one does).
    """

    def __init__(self, shard_set: ShardSet, header: StorageHeader) -> None:
        self.shard_set = shard_set
        self.location = self.shard_set.location
        self.header = header
        self.infos: ShardTable = self.shard_set.infos
        self._opened: OrderedDict[int, ShardFile] = OrderedDict()  # least recently used first
        self._closed = False

    @functools.cached_property
    def record_starts(self) -> np.ndarray:
        """Where each shard's records begin in the storage's numbering, and their total last (int64)."""
        return _starts(self.infos.rows["record_count"])

    @property
    def shards(self) -> list[ShardFile]:
        """Every shard, opened and kept open together (a remote storage downloads them all; beyond its
        ``max_open`` this holds a descriptor per shard: for small storages and tests, not for loaders).

        Opening a shard later closes the surplus, least recently used first.
        """
        return [self.whole_shard(position, keep_open=True) for position in range(len(self.infos))]

    def shard(self, position: int, keep_open: bool = False) -> ShardFile:
        """The shard at ``position`` (in ascending id order), opened if it is not yet.

        Opening one closes the least recently used beyond the shard set's ``max_open``, unless ``keep_open``.
        """
        opened = self._opened
        shard = opened.get(position)
        if shard is not None:
            opened.move_to_end(position)
            return shard
        self.check_open()
        if not 0 <= position < len(self.infos):
            raise IndexError(f"shard position {position} is out of range for {len(self.infos)} shards")
        shard = opened[position] = self.shard_set.open(position)
        while not keep_open and len(opened) > self.shard_set.max_open:
            self._forget(next(iter(opened)))
        return shard

    def whole_shard(self, position: int, keep_open: bool = False) -> ShardFile:
        """The shard at ``position`` with all its data: a part of it open (a remote shard's `ShardPart`) is closed
        and the whole shard opened instead."""
        shard = self.shard(position, keep_open)
        if shard.covers(0, shard.element_count):
            return shard
        self._forget(position)
        shard = self._opened[position] = self.shard_set.open(position, whole=True)
        return shard

    def shard_covering(self, position: int, start: int, stop: int) -> ShardFile:
        """The shard at ``position`` as open, if it covers data elements ``start .. stop - 1``; else the whole shard
        (what is open is a part of it that does not hold them)."""
        shard = self.shard(position)
        return shard if shard.covers(start, stop) else self.whole_shard(position)

    def _forget(self, position: int) -> None:
        """Close the shard at ``position`` (views into it stay valid); it reopens when read again."""
        shard = self._opened.pop(position, None)
        if shard is not None:
            self.shard_set.release(position, shard)

    def prefetch_records(self, indices: np.ndarray) -> None:
        """A hint: the records at these global indices are read soon, in this order."""
        if not self.shard_set.mapped_in_place:  # those are read where they lie: nothing to fetch ahead
            positions = np.searchsorted(self.record_starts, indices, side="right") - 1
            self.shard_set.prefetch(first_positions(positions, len(self.infos)))

    def __len__(self) -> int:
        if "record_starts" in self.__dict__:
            return int(self.record_starts[-1])
        return int(self.infos.rows["record_count"].sum())

    def locate(self, index: int) -> tuple[int, int]:
        """Position (in ``shards``) of the shard holding global record ``index``, and the record in it."""
        index = check_index(index, len(self))
        position = int(np.searchsorted(self.record_starts, index, side="right")) - 1
        return position, index - int(self.record_starts[position])

    def read(self, index: int) -> Out:
        raise NotImplementedError

    def length(self, index: int) -> int:
        """Record ``index``'s length, without decoding it: the one its format recorded (see ``shard_lengths``).
        From an object store, a shard not open yet gives it from its tail, without its data."""
        self.check_open()
        position, record = self.locate(index)
        lengths = self._lengths_from_tail(position)
        return self.shard(position).record_length(record) if lengths is None else int(lengths[record])

    def shard_lengths(self, position: int) -> np.ndarray:
        """The lengths of the records of the reader's shard at ``position`` (in ascending id order), in order:
        int64, read-only, nothing decoded.

        The lengths a format's ``length(data)`` gave when they were written (mapped from the shard, or from an
        object store's shard's tail), or, where the storage records none (a format without ``length``, storages
        of guideloom 0.3, token storages), each record's size: bytes for documents, tokens for token storages.
        """
        self.check_open()
        lengths = self._lengths_from_tail(position)
        return self.shard(position).record_lengths() if lengths is None else lengths

    def _lengths_from_tail(self, position: int) -> np.ndarray | None:
        """A remote shard not open here: its record lengths from its object's tail, without its data; else None
        (the open or local shard gives them)."""
        return None if position in self._opened else self.shard_set.record_lengths(position)

    @property
    def fingerprint(self) -> str:
        """Identifies the exact contents: shard ids, counts and checksums (from the snapshot's facts)."""
        return snapshot_fingerprint(self.header, self.infos)

    @property
    def earlier_fingerprint(self) -> str:
        """The fingerprint states of guideloom 0.2 and the first 0.3 builds recorded for these contents."""
        return earlier_fingerprint(self.header, self.infos)

    def verify(self, progress: Callable[[int], None] | None = None) -> list[str]:
        """Check every shard's checksums; the problems found, each naming its shard."""
        shards = (self.shard(position) for position in range(len(self.infos)))
        return verify_shards(shards, progress, [])

    def __iter__(self) -> Iterator[Out]:
        for index in range(len(self)):
            yield self.read(index)

    def close(self) -> None:
        """Release every mapping (a mapping a decoded view still uses goes when the view does). The shard set is
        closed first: a shard let go while its prefetches still ran would make room for one more download, evicting
        the shards a run resumed from this cache reads first."""
        self.shard_set.close()
        while self._opened:
            self._forget(next(iter(self._opened)))
        self._closed = True

    def __enter__(self: R) -> R:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()

    def check_open(self) -> None:
        """Refuse to read through a closed reader (a ValueError, as for a closed file)."""
        if self._closed:
            raise ValueError("this reader is closed")


class DocumentReader(StorageReader[Out]):
    """Decoded records of a DocumentStorage."""

    def __init__(
        self,
        shard_set: ShardSet,
        header: StorageHeader,
        document_format: DocumentStorageFormat[Any, Out],
    ) -> None:
        super().__init__(shard_set, header)
        self._format = document_format
        # A format of named fields (a RecordSchema): it reads some fields alone and names each record's place.
        self._fields_format = document_format if isinstance(document_format, FieldFormat) else None
        # Whether the fields read where none are named are all in the shards' field columns: read from there.
        self._reads_columns = self._fields_format is not None and self._in_columns(self._fields_format.read_fields)
        self._held_columns: OrderedDict[int, ShardColumns] = OrderedDict()  # columns held without their shards
        self._pages = ResidentPages()  # the records' mapped pages, dropped as they add up (see resident_pages)
        # An open shard's bytes, offsets, and the bytes it holds (``ShardFile.held``: a part of a shard holds some).
        self._spans: dict[int, tuple[memoryview, memoryview, int, int]] = {}

    def read_encoded(self, index: int) -> tuple[memoryview, int]:
        """The record's bytes (a read-only view into the mapping) and its shard id."""
        self.check_open()
        self._pages.settle(self._opened.values())
        position, record = self.locate(index)
        start, stop = self.shard(position).record_bounds(record)
        shard = self.shard_covering(position, start, stop)
        self._pages.add(stop - start)
        return shard.view[start:stop], shard.id

    def read(self, index: int, fields: tuple[str, ...] | None = None) -> Out:
        """Decode record ``index``; ``fields`` (names of a ``RecordSchema``'s fields): only those, nothing else read."""
        fielded = self._fields_format
        if fielded is None:
            if fields is not None:
                raise TypeError(f"fields= reads records of a RecordSchema, not of {type(self._format).__name__}")
            encoded, shard = self.read_encoded(index)
            return self._format.unpack(encoded, shard)
        if fields is not None:
            fields = fielded.check_fields(fields)
        names = fielded.read_fields if fields is None else fields
        if self._in_columns(names):
            position, number = self.locate(index)
            return self._from_columns([position], [number], names)[0]
        encoded, shard = self.read_encoded(index)
        record: Out = fielded.unpack_fields(encoded, shard, self.locate(index)[1], fields)
        return record

    def read_many(self, indices: np.ndarray) -> list[Out]:
        """Decode the records at ``indices`` (int64, each checked), locating them all at once."""
        self.check_open()
        self._pages.settle(self._opened.values())
        starts = self.record_starts
        positions = starts.searchsorted(indices, "right") - 1
        position_list = positions.tolist()
        records = (indices - starts[positions]).tolist()
        if self._reads_columns and self._fields_format is not None:
            return self._from_columns(position_list, records, self._fields_format.read_fields)
        encoded = self._record_views(position_list, records)
        self._pages.add(sum(map(len, encoded)), len(encoded))
        shard_ids = list(map(self._shard_ids.__getitem__, position_list))
        if self._fields_format is not None:
            fields_decoded: list[Out] = self._fields_format.unpack_fields_many(encoded, shard_ids, records, None)
            return fields_decoded
        decoded = self._format.unpack_many(encoded, shard_ids)
        if not isinstance(decoded, list) or len(decoded) != len(encoded):
            got = f"{len(decoded)} records" if isinstance(decoded, list) else f"a {type(decoded).__name__}"
            raise TypeError(
                f"{type(self._format).__name__}.unpack_many must return a list of {len(encoded)} records, got {got}"
            )
        return decoded

    def _in_columns(self, fields: tuple[str, ...]) -> bool:
        """Whether ``fields`` are all in the shards' field columns (docs/format.md, "Field columns")."""
        columns = self.header.field_columns
        return bool(columns) and all(name in columns for name in fields)

    def _from_columns(self, positions: list[int], records: list[int], fields: tuple[str, ...]) -> list[Out]:
        """The records ``records[i]`` of the shards at ``positions[i]``, of ``fields`` alone, read from the shards'
        field columns: on an object store without downloading the shards."""
        self.check_open()
        fielded = self._fields_format
        assert fielded is not None
        wanted, shard_ids, out = frozenset(fields), self._shard_ids, []
        source: ShardFile | ShardColumns | None = None
        last = -1
        for position, record in zip(positions, records, strict=True):
            if position != last or source is None:
                source, last = self._columns_of(position, record, wanted), position
            values = {name: source.column(name).value(record) for name in fields}
            out.append(fielded.unpack_column_values(values, shard_ids[position], record, fields))
        return out

    def _columns_of(self, position: int, record: int, fields: frozenset[str]) -> ShardFile | ShardColumns:
        """What holds the columns of ``fields`` of the shard at ``position``: the shard where it is open (or mapped in
        place), else those columns alone (an object store's ranged reads)."""
        if not 0 <= position < len(self.infos):
            check_index(record + int(self.record_starts[position]), len(self))
        opened = self._opened.get(position)
        if opened is not None:
            self._opened.move_to_end(position)
            return opened
        held = self._held_columns.get(position)
        if held is not None and fields <= held.fields:
            self._held_columns.move_to_end(position)
            return held
        found = self.shard_set.open_columns(position, fields)
        if found is None:
            return self.shard(position)
        self._held_columns[position] = found
        while len(self._held_columns) > self.shard_set.max_open:
            self._held_columns.popitem(last=False)
        return found

    def _record_views(self, positions: list[int], records: list[int]) -> list[memoryview]:
        """The bytes of record ``records[i]`` of the shard at ``positions[i]``, for each ``i``: views of the mappings.

        This runs for every record a loader reads, so each open shard's view, offsets and size are kept at hand.
        """
        views: list[memoryview] = []
        span_of, append, opened, last = self._spans.get, views.append, self._opened, -1
        for position, record in zip(positions, records, strict=True):
            span = span_of(position)
            if span is None:
                span = self._span(position, record)
            elif position != last:  # most recently used: the shard closed for room is the one left longest ago
                opened.move_to_end(position)
            view, offsets, low, high = span
            last = position
            start, stop = offsets[record], offsets[record + 1]
            if start < low or stop > high or start > stop:  # a damaged index, or a record outside a part
                append(self._record_outside(position, record))
                continue
            append(view[start:stop])
        return views

    def _record_outside(self, position: int, record: int) -> memoryview:
        """A record that its shard's span does not hold: checked (a damaged index is named), from the whole shard
        where the span is a part of it."""
        start, stop = self.shard(position).record_bounds(record)
        shard = self.shard_covering(position, start, stop)
        if position not in self._spans:  # the whole shard opened instead of a part: its span anew
            self._span(position, record)
        return shard.view[start:stop]

    @functools.cached_property
    def _shard_ids(self) -> list[int]:
        return self.infos.ids.tolist()  # type: ignore[no-any-return]

    def _span(self, position: int, record: int) -> tuple[memoryview, memoryview, int, int]:
        """The view, record offsets and the data it holds (``low .. high - 1``: all of it, or a part's) of the shard
        at ``position``, opened now; an IndexError naming the global index if ``position`` is before the first shard
        or after the last (``record`` counted from there)."""
        if not 0 <= position < len(self.infos):
            check_index(record + int(self.record_starts[position]), len(self))
        shard = self.shard(position)
        span = self._spans[position] = (shard.view, shard.record_offsets, *shard.held)
        return span

    def _forget(self, position: int) -> None:
        self._spans.pop(position, None)
        super()._forget(position)

    def prefetch_records(self, indices: np.ndarray) -> None:
        if not self._reads_columns:  # columns are read alone, when needed: no shard to fetch ahead
            super().prefetch_records(indices)

    def close(self) -> None:
        self._held_columns.clear()
        super().close()


class TokenReader(StorageReader[np.ndarray]):
    """Documents of a TokenStorage and the concatenated token stream."""

    def __init__(self, shard_set: ShardSet, header: StorageHeader) -> None:
        super().__init__(shard_set, header)
        assert header.dtype is not None
        self.dtype = np.dtype(header.dtype).newbyteorder("<")
        self._tokens: dict[int, np.ndarray] = {}  # the token views of the open shards
        self._part_tokens: dict[int, tuple[np.ndarray, ShardFile]] = {}  # the token views of the open parts
        self.token_starts = _starts(self.infos.rows["element_count"])

    @property
    def token_count(self) -> int:
        """Tokens in the whole stream."""
        return int(self.token_starts[-1])

    def window_count(self, sequence_length: int) -> int:
        """Whole windows of ``sequence_length`` tokens in the stream (the shorter tail is not served)."""
        return self.token_count // check_sequence_length(sequence_length)

    def read_windows(
        self, indices: np.ndarray, sequence_length: int, out: np.ndarray, rows: np.ndarray | None = None
    ) -> np.ndarray:
        """Windows ``stream[k*S:(k+1)*S]`` for each ``k`` in ``indices`` (int64), copied into the rows of ``out``.

        ``out`` has ``sequence_length`` columns and its dtype may differ (ids are cast); window ``i`` goes to
        row ``rows[i]`` (a mixture interleaves several readers' windows in one array), else to row ``i``.
        """
        self.check_open()
        length = sequence_length
        starts = np.asarray(indices, np.int64) * length
        positions = np.searchsorted(self.token_starts, starts, side="right") - 1
        offsets = (starts - self.token_starts[positions]).tolist()
        targets = range(len(starts)) if rows is None else rows.tolist()
        token_arrays, opened = self._tokens, self._opened
        for number, (row, position, offset) in enumerate(zip(targets, positions.tolist(), offsets, strict=True)):
            tokens = token_arrays.get(position)
            if tokens is None:
                tokens = self._tokens_holding(position, offset, offset + length)
            else:  # most recently used: the shard closed for room is the one the order left longest ago
                opened.move_to_end(position)
            if offset + length <= len(tokens):
                out[row] = tokens[offset : offset + length]
            else:  # the window crosses into the next shard(s)
                start = int(starts[number])
                self.read_tokens(start, start + length, out=out[row])
        return out

    def _forget(self, position: int) -> None:
        self._tokens.pop(position, None)
        self._part_tokens.pop(position, None)
        super()._forget(position)

    def shard_tokens(self, position: int) -> np.ndarray:
        """All tokens of the reader's shard at ``position`` (in ``shards``): a read-only view into its mapping."""
        self.check_open()
        tokens = self._tokens.get(position)
        if tokens is None:
            shard = self.whole_shard(position)
            tokens = self._tokens[position] = np.frombuffer(shard.view, self.dtype, shard.element_count)
        else:
            self._opened.move_to_end(position)
        return tokens

    def _tokens_holding(self, position: int, start: int, stop: int) -> np.ndarray:
        """The tokens of the shard at ``position`` (a view as `shard_tokens` gives), of which ``start .. stop - 1``
        are read: a part of the shard open there serves them if it holds them, else the whole shard."""
        part = self._part_tokens.get(position)
        if part is None and position not in self._tokens:
            shard = self.shard(position)
            if not shard.covers(0, shard.element_count):  # a part of the shard is open
                part = self._part_tokens[position] = (np.frombuffer(shard.view, self.dtype, shard.element_count), shard)
        if part is not None:
            tokens, shard = part
            if shard.covers(start, min(stop, len(tokens))):
                self._opened.move_to_end(position)
                return tokens
        return self.shard_tokens(position)

    def prefetch_tokens(self, starts: np.ndarray) -> None:
        """A hint: the tokens at these stream positions are read soon, in this order."""
        if not self.shard_set.mapped_in_place:
            positions = np.searchsorted(self.token_starts, starts, side="right") - 1
            self.shard_set.prefetch(first_positions(positions, len(self.infos)))

    def read(self, index: int) -> np.ndarray:
        """Document ``index``'s tokens: a read-only view into the mapping."""
        self.check_open()
        position, record = self.locate(index)
        start, stop = self.shard(position).record_bounds(record)
        return self._tokens_holding(position, start, stop)[start:stop]

    def loss_mask(self, index: int) -> np.ndarray:
        """Document ``index``'s loss mask: a bool array as long as its tokens (unpacked from the stored bits)."""
        self.check_open()
        if not self.header.loss_mask:
            raise ValueError(
                f"loss_mask: the storage at {self.location} has no loss mask (it was created without loss_mask=True)"
            )
        position, record = self.locate(index)
        start, stop = self.shard(position).record_bounds(record)
        return unpack_bits(self.shard_mask_bits(position), start, stop)

    def shard_mask_bits(self, position: int) -> np.ndarray:
        """The packed loss mask of the reader's shard at ``position`` (uint8, little bit order; mapped)."""
        bits = self.shard(position).mask_bits
        if bits is None:
            raise ValueError(f"loss_mask: the storage at {self.location} has no loss mask")
        return bits

    def read_tokens(self, start: int, stop: int, out: np.ndarray | None = None) -> np.ndarray:
        """Tokens ``stream[start:stop]``, copied into ``out`` (cast to its dtype) or a new array."""
        self.check_open()
        if not 0 <= start <= stop <= self.token_count:
            raise IndexError(f"token range [{start}, {stop}) is outside a stream of {self.token_count} tokens")
        if out is None:
            out = np.empty(stop - start, self.dtype)
        position = int(np.searchsorted(self.token_starts, start, side="right")) - 1
        written = 0
        while start + written < stop:
            shard_start = int(self.token_starts[position])
            begin = start + written - shard_start
            take = min(stop - start - written, int(self.token_starts[position + 1]) - shard_start - begin)
            out[written : written + take] = self._tokens_holding(position, begin, begin + take)[begin : begin + take]
            written += take
            position += 1
        return out

    def document_starts(self, start: int, stop: int) -> np.ndarray:
        """Stream positions in [start, stop) where a document begins (int64), from the shards there."""
        first = max(0, int(np.searchsorted(self.token_starts, start, side="right")) - 1)
        last = int(np.searchsorted(self.token_starts, stop, side="left"))
        found = []
        for position in range(first, min(last, len(self.infos))):
            base = int(self.token_starts[position])
            offsets = self.shard(position).offsets[:-1].astype(np.int64) + base
            found.append(offsets[(offsets >= start) & (offsets < stop)])
        return np.concatenate(found) if found else np.empty(0, np.int64)

    def close(self) -> None:
        super().close()
        self._tokens, self._part_tokens = {}, {}
