"""Reading document-aware rows from a token storage: stream windows with their pieces, and packed rows.

Both read the document boundaries from the offsets stored in each shard's
index, never from the tokens themselves.
"""

from __future__ import annotations

from collections import OrderedDict
from typing import Any

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.reader import TokenReader
from guideloom._windows.boundaries import PieceRows, flat_indices, window_pieces
from guideloom._windows.labels import fill_piece_masks
from guideloom._windows.packing import ShardPacking
from guideloom._windows.packing_cache import load_or_build, load_or_count_rows, row_counts_directory


def document_starts_near(reader: TokenReader, window_starts: np.ndarray, length: int) -> np.ndarray:
    """Stream positions where non-empty documents begin inside the windows ``[s, s + length)`` (sorted, unique).

    Read from the mapped offsets of the shards the windows touch, by bisection: nothing per document
    is copied, whatever the storage's size.
    """
    window_starts = np.asarray(window_starts, np.int64)
    if not len(window_starts):
        return np.empty(0, np.int64)
    token_starts = reader.token_starts
    first = np.searchsorted(token_starts, window_starts, side="right") - 1
    last = np.searchsorted(token_starts, window_starts + length - 1, side="right") - 1
    spans = last - first + 1  # the shards each window touches (one, unless it crosses a shard's end)
    positions = flat_indices(first, spans)
    bases = token_starts[positions]
    begins = np.maximum(np.repeat(window_starts, spans), bases) - bases
    ends = np.minimum(np.repeat(window_starts + length, spans), token_starts[positions + 1]) - bases
    found = []
    for position in np.unique(positions).tolist():
        chosen = positions == position
        offsets = reader.shard(position).offsets  # mapped uint64: searched in place, never converted
        low = np.searchsorted(offsets, begins[chosen].astype(np.uint64), side="left")
        high = np.searchsorted(offsets, ends[chosen].astype(np.uint64), side="left")
        # A position in the offsets below the shard's end starts a non-empty document (empty ones share it).
        found.append(offsets[flat_indices(low, high - low)].astype(np.int64) + int(token_starts[position]))
    return np.unique(np.concatenate(found))


def boundary_rows(windows: np.ndarray, window_starts: np.ndarray, document_starts: np.ndarray) -> PieceRows:
    """Stream windows (rows of ``windows``, starting at ``window_starts``) with their pieces; no padding.

    ``document_starts`` must hold every non-empty document start inside the windows (more is fine).
    """
    counts, lengths = window_pieces(window_starts, windows.shape[1], document_starts)
    return PieceRows(windows, lengths, counts, np.zeros(len(windows), np.int64))


class PackedShards:
    """The packed rows of a reader's shards: sample ``k`` is row ``k``, shards in ascending id.

    Each shard's row count is known up front (from the cache of the snapshot's row counts, else
    computed once and cached); a shard's packing is loaded (mapped from the packing cache, or built)
    when its rows are first read, and at most ``max_open`` packings stay mapped, least recently used
    closed first.
    """

    def __init__(self, reader: TokenReader, sequence_length: int, max_open: int, long_documents: str = "split") -> None:
        self.sequence_length = sequence_length
        self.long_documents = long_documents
        self.row_counts = load_or_count_rows(reader, sequence_length, long_documents)
        self.row_bases = np.zeros(len(self.row_counts) + 1, np.int64)
        np.cumsum(self.row_counts, out=self.row_bases[1:])
        self.max_open = max_open
        self._packings: OrderedDict[int, ShardPacking] = OrderedDict()

    def packing(self, reader: TokenReader, position: int) -> ShardPacking:
        """The packing of the shard at ``position``, loaded or built on first use."""
        packing = self._packings.get(position)
        if packing is not None:
            self._packings.move_to_end(position)
            return packing
        packing = load_or_build(reader.shard(position).offsets, self.sequence_length, self.long_documents)
        if packing.row_count != self.row_counts[position]:
            raise CorruptStorageError(
                f"shard {reader.infos[position].id} of {reader.location} packs into {packing.row_count} rows, but the "
                f"cached row counts say {int(self.row_counts[position])}: the shard was rewritten in place; delete "
                f"{row_counts_directory()} to rebuild the cache"
            )
        self._packings[position] = packing
        while len(self._packings) > self.max_open:
            self._packings.popitem(last=False)  # its mapping goes with its arrays
        return packing

    def close(self) -> None:
        """Release every packing's mapping."""
        self._packings.clear()

    @property
    def row_count(self) -> int:
        return int(self.row_bases[-1])

    def rows(
        self, reader: TokenReader, indices: np.ndarray, pad_id: int, dtype: np.dtype[Any], masked: bool = False
    ) -> PieceRows:
        """Rows ``indices`` (int64, in range): their tokens, padded with ``pad_id``, and their pieces (and, if
        ``masked``, their loss masks, False on padding).

        The pieces of all rows are located with whole-array operations, shard by shard; then one loop
        copies each piece, a slice of its shard's mapped tokens, into place.
        """
        length = self.sequence_length
        if len(indices) == 0:
            empty = np.empty(0, np.int64)
            return PieceRows(np.empty((0, length), dtype), empty, empty, empty)
        positions = np.searchsorted(self.row_bases, indices, side="right") - 1
        local_rows = indices - self.row_bases[positions]
        piece_counts = np.empty(len(indices), np.int64)
        piece_rows, piece_starts, piece_lengths, piece_shards = [], [], [], []
        used = np.unique(positions).tolist()
        for position in used:
            packing = self.packing(reader, position)
            rows = np.flatnonzero(positions == position)
            first = packing.row_starts[local_rows[rows]]
            counts = packing.row_starts[local_rows[rows] + 1] - first
            piece_counts[rows] = counts
            pieces = flat_indices(first, counts)
            piece_rows.append(np.repeat(rows, counts))
            piece_starts.append(packing.piece_starts[pieces])
            piece_lengths.append(packing.piece_lengths[pieces])
            piece_shards.append(np.full(len(pieces), position))
        # Back to row order: pieces of one row stay in placement order (a stable sort by row).
        by_row = np.argsort(np.concatenate(piece_rows), kind="stable")
        rows_of_pieces = np.concatenate(piece_rows)[by_row]
        starts = np.concatenate(piece_starts)[by_row]
        lengths = np.concatenate(piece_lengths)[by_row]
        shards = np.concatenate(piece_shards)[by_row]
        ends = np.cumsum(lengths)
        row_ends = ends[np.cumsum(piece_counts) - 1]
        row_starts = np.concatenate([[0], row_ends[:-1]])
        destinations = ends - lengths - np.repeat(row_starts, piece_counts) + rows_of_pieces * length
        out = np.empty((len(indices), length), dtype)
        flat = out.reshape(-1)
        tokens = {position: reader.shard_tokens(position) for position in used}
        for shard, start, stop, destination in zip(
            shards.tolist(), starts.tolist(), (starts + lengths).tolist(), destinations.tolist(), strict=True
        ):
            flat[destination : destination + stop - start] = tokens[shard][start:stop]
        fills = row_ends - row_starts
        flat[flat_indices(np.arange(len(indices), dtype=np.int64) * length + fills, length - fills)] = pad_id
        mask = None
        if masked:
            mask = np.zeros(out.shape, np.bool_)
            stops = (starts + lengths).tolist()
            fill_piece_masks(mask.reshape(-1), reader, shards.tolist(), starts.tolist(), stops, destinations.tolist())
        return PieceRows(out, lengths, piece_counts, length - fills, mask)
