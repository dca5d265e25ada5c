"""What samples are made of: the records, shards and token offsets behind sample indices, from indexes only.

Every function here reads record counts, token counts and the document offsets stored in each
shard's index, never a token or a record's bytes, and costs O(samples + pieces) whatever the size
of the storage. `SamplePieces` holds the answer as flat arrays and turns it into the dicts
`StatefulDataLoader.explain` returns. The ``*_keys`` functions identify samples for a state's digest
from what needs no shard opened (shard ids, counts, a packing), so taking a state downloads nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from itertools import pairwise
from typing import Any

import numpy as np

__all__ = [
    "SamplePieces",
    "packed_keys",
    "packed_pieces",
    "record_keys",
    "record_pieces",
    "window_keys",
    "window_pieces",
]

WHOLE_RECORD = -1  # a stop that means "to the record's end": a document storage's records are whole samples
NO_COMPONENT = -1


@dataclass(frozen=True)
class SamplePieces:
    """The pieces of ``n`` samples, sample after sample: sample ``i`` has ``piece_counts[i]`` of them.

    A piece is tokens ``starts:stops`` of record ``records`` (its index within its shard) of the shard
    with id ``shards``; ``indices`` is the same record's global index, the one ``reader.read()`` takes;
    a stop of -1 is the whole record. ``components`` is each sample's mixture component (its index; -1
    outside a mixture). All arrays are int64.
    """

    piece_counts: np.ndarray
    shards: np.ndarray
    records: np.ndarray
    indices: np.ndarray
    starts: np.ndarray
    stops: np.ndarray
    components: np.ndarray
    names: tuple[str, ...] | None = None  # of a mixture's components, which ``components`` index
    sources: np.ndarray | None = None  # per piece, an imported record's ``{"file", "row"}`` (or None); see with_sources

    @classmethod
    def of(
        cls,
        piece_counts: Any,
        shards: Any,
        records: Any,
        starts: Any,
        stops: Any,
        components: Any = None,
        *,
        indices: Any,
    ) -> SamplePieces:
        """From anything NumPy takes as int64 arrays; ``components`` None: outside a mixture."""
        counts = np.asarray(piece_counts, np.int64)
        if components is None:
            components = np.full(len(counts), NO_COMPONENT, np.int64)
        shards, records, indices, starts, stops, components = (
            np.asarray(array, np.int64) for array in (shards, records, indices, starts, stops, components)
        )
        return cls(counts, shards, records, indices, starts, stops, components)

    def __len__(self) -> int:
        return len(self.piece_counts)

    def in_component(self, component: int) -> SamplePieces:
        """These samples as samples of a mixture's component ``component``."""
        return replace(self, components=np.full(len(self), component, np.int64))

    def named(self, names: tuple[str, ...]) -> SamplePieces:
        """The same samples, their components called by these names."""
        return replace(self, names=names)

    def with_sources(self, source: Callable[[int, int], dict[str, Any] | None]) -> SamplePieces:
        """The same samples, each piece with ``source(shard, record)``: where an imported record came from."""
        found = np.empty(len(self.shards), object)
        found[:] = [
            source(shard, record) for shard, record in zip(self.shards.tolist(), self.records.tolist(), strict=True)
        ]
        return replace(self, sources=found)

    def piece_sources(self) -> np.ndarray:
        """Each piece's source (None where it is not recorded), as an object array."""
        if self.sources is not None:
            return self.sources
        return np.full(len(self.shards), None, object)

    def piece_columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """The arrays with one entry per piece: shards, records, indices, starts, stops."""
        return self.shards, self.records, self.indices, self.starts, self.stops

    def split(self, sizes: list[int]) -> list[SamplePieces]:
        """Consecutive groups of ``sizes`` samples."""
        sample_bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        piece_bounds = np.concatenate([[0], np.cumsum(self.piece_counts)]).astype(np.int64)[sample_bounds]
        parts = []
        for (start, stop), (first, last) in zip(
            pairwise(sample_bounds.tolist()), pairwise(piece_bounds.tolist()), strict=True
        ):
            shards, records, indices, starts, stops = (array[first:last] for array in self.piece_columns())
            counts, components = self.piece_counts[start:stop], self.components[start:stop]
            sources = None if self.sources is None else self.sources[first:last]
            parts.append(SamplePieces(counts, shards, records, indices, starts, stops, components, sources=sources))
        return parts

    @staticmethod
    def concatenate(parts: list[SamplePieces]) -> SamplePieces:
        """The samples of ``parts``, one after another."""
        shards, records, indices, starts, stops = (
            np.concatenate(column) for column in zip(*(part.piece_columns() for part in parts), strict=True)
        )
        counts = np.concatenate([part.piece_counts for part in parts])
        components = np.concatenate([part.components for part in parts])
        sources = None
        if any(part.sources is not None for part in parts):
            sources = np.concatenate([part.piece_sources() for part in parts])
        return SamplePieces(counts, shards, records, indices, starts, stops, components, sources=sources)

    def samples(self) -> list[dict[str, Any]]:
        """One dict per sample: ``{"component", "pieces": [{"shard", "record", "index", "start", "stop"}, ...]}``."""
        stops = [None if stop == WHOLE_RECORD else stop for stop in self.stops.tolist()]
        columns = (self.shards.tolist(), self.records.tolist(), self.indices.tolist(), self.starts.tolist(), stops)
        pieces = [
            {"shard": shard, "record": record, "index": index, "start": start, "stop": stop}
            for shard, record, index, start, stop in zip(*columns, strict=True)
        ]
        if self.sources is not None:  # imported records: where each came from
            for piece, source in zip(pieces, self.sources.tolist(), strict=True):
                if source is not None:
                    piece["source"] = source
        bounds = np.concatenate([[0], np.cumsum(self.piece_counts)]).tolist()
        return [
            {
                "component": None if self.names is None or k == NO_COMPONENT else self.names[k],
                "pieces": pieces[first:last],
            }
            for k, (first, last) in zip(self.components.tolist(), pairwise(bounds), strict=True)
        ]


def record_pieces(reader: Any, indices: np.ndarray) -> SamplePieces:
    """Records at these global indices of ``reader``, each a whole sample (a document storage's samples)."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(reader.record_starts, indices, side="right") - 1
    shards = [reader.infos[position].id for position in positions.tolist()]
    records = indices - reader.record_starts[positions]
    count = len(indices)
    whole = np.full(count, WHOLE_RECORD)
    return SamplePieces.of(np.ones(count), shards, records, np.zeros(count), whole, indices=indices)


def window_pieces(reader: Any, window_starts: np.ndarray, length: int) -> SamplePieces:
    """The records each window ``stream[s:s + length]`` of ``reader``'s token stream overlaps, in order.

    A window may cross into the next shards; empty documents overlap nothing and are left out.
    """
    token_starts, record_starts = reader.token_starts, reader.record_starts
    counts: list[int] = []
    columns: list[list[np.ndarray]] = [[], [], [], [], []]
    for start in np.asarray(window_starts, np.int64).tolist():
        stop = start + length
        first = int(np.searchsorted(token_starts, start, side="right")) - 1
        last = int(np.searchsorted(token_starts, stop, side="left")) - 1
        pieces = 0
        for position in range(first, last + 1):
            base = int(token_starts[position])
            low, high = max(start, base) - base, min(stop, int(token_starts[position + 1])) - base
            records, starts, stops = _overlapped(reader.shard(position).offsets, low, high)
            shard = np.full(len(records), reader.infos[position].id)
            values = (shard, records, starts, stops, records + record_starts[position])
            for column, value in zip(columns, values, strict=True):
                column.append(value)
            pieces += len(records)
        counts.append(pieces)
    return _pieces_of(counts, columns)


def _overlapped(offsets: np.ndarray, low: int, high: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The non-empty records of a shard (bounded by its token ``offsets``) that tokens ``low:high`` overlap, and
    the part of each they overlap, in offsets within the record."""
    first = int(np.searchsorted(offsets, low, side="right")) - 1
    stop = int(np.searchsorted(offsets, high, side="left"))
    records = np.arange(first, stop, dtype=np.int64)
    begins = offsets[first:stop].astype(np.int64)
    ends = offsets[first + 1 : stop + 1].astype(np.int64)
    keep = ends > begins
    records, begins, ends = records[keep], begins[keep], ends[keep]
    return records, np.maximum(begins, low) - begins, np.minimum(ends, high) - begins


def _joined(parts: list[np.ndarray]) -> np.ndarray:
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def _pieces_of(counts: list[int], columns: list[list[np.ndarray]]) -> SamplePieces:
    """Pieces gathered as columns of shard ids, records, starts, stops and global indices."""
    shards, records, starts, stops, indices = (_joined(column) for column in columns)
    return SamplePieces.of(counts, shards, records, starts, stops, indices=indices)


def packed_pieces(packed: Any, reader: Any, indices: np.ndarray) -> SamplePieces:
    """The pieces of packed rows ``indices`` (see `PackedShards`), in placement order, as records and offsets."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(packed.row_bases, indices, side="right") - 1
    local_rows = (indices - packed.row_bases[positions]).tolist()
    counts: list[int] = []
    columns: list[list[np.ndarray]] = [[], [], [], [], []]
    for position, row in zip(positions.tolist(), local_rows, strict=True):
        packing = packed.packing(reader, position)
        first, last = int(packing.row_starts[row]), int(packing.row_starts[row + 1])
        starts = np.asarray(packing.piece_starts[first:last], np.int64)
        offsets = reader.shard(position).offsets
        records = np.searchsorted(offsets, starts, side="right").astype(np.int64) - 1
        within = starts - offsets[records].astype(np.int64)
        lengths = np.asarray(packing.piece_lengths[first:last], np.int64)
        shard = np.full(len(records), reader.infos[position].id)
        values = (shard, records, within, within + lengths, records + reader.record_starts[position])
        for column, value in zip(columns, values, strict=True):
            column.append(value)
        counts.append(last - first)
    return _pieces_of(counts, columns)


# --- keys: what a state's next-batch digest hashes, from what a source knows without opening a shard ---------


def record_keys(reader: Any, indices: np.ndarray) -> np.ndarray:
    """``(shard id, record)`` of each record at these global indices, flat."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(reader.record_starts, indices, side="right") - 1
    shards = [reader.infos[position].id for position in positions.tolist()]
    return np.stack([np.asarray(shards, np.int64), indices - reader.record_starts[positions]], 1).reshape(-1)


def window_keys(reader: Any, window_starts: np.ndarray) -> np.ndarray:
    """``(shard id, token offset in it)`` where each window starts, flat."""
    starts = np.asarray(window_starts, np.int64)
    positions = np.searchsorted(reader.token_starts, starts, side="right") - 1
    shards = [reader.infos[position].id for position in positions.tolist()]
    return np.stack([np.asarray(shards, np.int64), starts - reader.token_starts[positions]], 1).reshape(-1)


def packed_keys(packed: Any, reader: Any, indices: np.ndarray) -> np.ndarray:
    """Each packed row's shard id, piece count, and its pieces' token offsets and lengths in the shard, flat."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(packed.row_bases, indices, side="right") - 1
    keys: list[np.ndarray] = []
    for position, row in zip(positions.tolist(), (indices - packed.row_bases[positions]).tolist(), strict=True):
        packing = packed.packing(reader, position)
        first, last = int(packing.row_starts[row]), int(packing.row_starts[row + 1])
        keys.append(np.array([reader.infos[position].id, last - first], np.int64))
        keys += [
            np.asarray(packing.piece_starts[first:last], np.int64),
            np.asarray(packing.piece_lengths[first:last], np.int64),
        ]
    return _joined(keys)
