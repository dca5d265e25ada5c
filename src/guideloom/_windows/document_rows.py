"""Reading document-aware rows from a token storage: stream windows with their pieces, and packed rows.

Both read the document boundaries from the offsets stored in each shard's
index, never from the tokens themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from guideloom._shards.reader import TokenReader
from guideloom._windows.boundaries import PieceRows, flat_indices, window_pieces
from guideloom._windows.labels import fill_piece_masks
from guideloom._windows.packing import ShardPacking
from guideloom._windows.packing_cache import load_or_build


def nonempty_document_starts(reader: TokenReader) -> np.ndarray:
    """Stream positions where the non-empty documents of the reader's shards begin (int64, increasing)."""
    starts = []
    for base, shard in zip(reader.token_starts[:-1].tolist(), reader.shards, strict=True):
        offsets = shard.offsets.astype(np.int64)
        starts.append(offsets[:-1][offsets[1:] > offsets[:-1]] + base)
    return np.concatenate(starts) if starts else np.empty(0, np.int64)


def boundary_rows(windows: np.ndarray, window_starts: np.ndarray, document_starts: np.ndarray) -> PieceRows:
    """Stream windows (rows of ``windows``, starting at ``window_starts``) with their pieces; no padding."""
    counts, lengths = window_pieces(window_starts, windows.shape[1], document_starts)
    return PieceRows(windows, lengths, counts, np.zeros(len(windows), np.int64))


class PackedShards:
    """The packed rows of a reader's shards: sample ``k`` is row ``k``, shards in ascending id."""

    def __init__(self, reader: TokenReader, sequence_length: int, long_documents: str = "split") -> None:
        self.packings: list[ShardPacking] = [
            load_or_build(shard.offsets, sequence_length, long_documents) for shard in reader.shards
        ]
        counts = [packing.row_count for packing in self.packings]
        self.row_bases = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.sequence_length = sequence_length

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
            packing = self.packings[position]
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
