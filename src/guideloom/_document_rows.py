"""Reading document-aware rows from a token storage: stream windows with their pieces, and packed rows.

Both read the document boundaries from the offsets stored in each shard's
index, never from the tokens themselves.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from guideloom._boundaries import PieceRows, window_pieces
from guideloom._packing import ShardPacking
from guideloom._packing_cache import load_or_build
from guideloom._reader import TokenReader


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

    def __init__(self, reader: TokenReader, sequence_length: int) -> None:
        self.packings: list[ShardPacking] = [load_or_build(shard.offsets, sequence_length) for shard in reader.shards]
        counts = [packing.row_count for packing in self.packings]
        self.row_bases = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)]).astype(np.int64)
        self.sequence_length = sequence_length

    @property
    def row_count(self) -> int:
        return int(self.row_bases[-1])

    def rows(self, reader: TokenReader, indices: np.ndarray, pad_id: int, dtype: np.dtype[Any]) -> PieceRows:
        """Rows ``indices`` (int64, in range): their tokens, padded with ``pad_id``, and their pieces."""
        length = self.sequence_length
        out = np.full((len(indices), length), pad_id, dtype)
        flat = out.reshape(-1)
        positions = np.searchsorted(self.row_bases, indices, side="right") - 1
        local_rows = indices - self.row_bases[positions]
        piece_lengths: list[int] = []
        piece_counts = np.empty(len(indices), np.int64)
        fills = np.empty(len(indices), np.int64)
        for row, (position, local) in enumerate(zip(positions.tolist(), local_rows.tolist(), strict=True)):
            packing, tokens = self.packings[position], reader.shard_tokens(position)
            first, stop = int(packing.row_starts[local]), int(packing.row_starts[local + 1])
            starts = packing.piece_starts[first:stop].tolist()
            lengths = packing.piece_lengths[first:stop].tolist()
            at = row * length
            for start, count in zip(starts, lengths, strict=True):
                flat[at : at + count] = tokens[start : start + count]
                at += count
            piece_lengths.extend(lengths)
            piece_counts[row] = stop - first
            fills[row] = at - row * length
        return PieceRows(out, np.array(piece_lengths, np.int64), piece_counts, length - fills)
