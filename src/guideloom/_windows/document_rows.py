"""Reading document-aware rows from a token storage: stream windows with their pieces, and packed rows.

Both read the document boundaries from the offsets stored in each shard's
index, never from the tokens themselves.
"""

from __future__ import annotations

from collections import OrderedDict
from itertools import pairwise
from typing import Any

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._shards.reader import TokenReader
from guideloom._windows.boundaries import PieceRows, flat_indices, pieces_at_cuts
from guideloom._windows.labels import fill_piece_masks
from guideloom._windows.packing import ShardPacking
from guideloom._windows.packing_cache import load_or_build, load_or_count_rows, row_counts_directory


def stream_rows(reader: TokenReader, windows: np.ndarray, window_starts: np.ndarray) -> PieceRows:
    """Stream windows (rows of ``windows``, starting at ``window_starts``) with their pieces; no padding."""
    length = windows.shape[1]
    counts, lengths = pieces_at_cuts(document_cuts(reader, window_starts, length), len(windows), length)
    return PieceRows(windows, lengths, counts, np.zeros(len(windows), np.int64))


def document_cuts(reader: TokenReader, window_starts: np.ndarray, length: int) -> np.ndarray:
    """Where non-empty documents begin inside the windows ``[s, s + length)``, as flat positions of their rows
    (``row * length + column``; unsorted, a row's own start and a start found twice may be among them).

    Read from the mapped offsets of the shards the windows touch, by bisection: nothing per document
    is copied, whatever the storage's size. This runs for every group of batches, so the work per shard
    is one search and one gather; the rest is a few whole-array operations over all windows.
    """
    window_starts = np.asarray(window_starts, np.int64)
    if not len(window_starts):
        return np.empty(0, np.int64)
    token_starts = reader.token_starts
    first = token_starts.searchsorted(window_starts, side="right") - 1
    last = token_starts.searchsorted(window_starts + (length - 1), side="right") - 1
    shifts = np.arange(0, len(window_starts) * length, length, dtype=np.int64) - window_starts
    if (first == last).all():  # no window crosses a shard's end: one span of each shard per window
        positions, bases = first, token_starts[first]
        begins = window_starts - bases
        ends = begins + length
    else:
        spans = last - first + 1  # the shards each window touches
        positions = flat_indices(first, spans)
        bases = token_starts[positions]
        begins = np.maximum(np.repeat(window_starts, spans), bases) - bases
        ends = np.minimum(np.repeat(window_starts + length, spans), token_starts[positions + 1]) - bases
        shifts = shifts.repeat(spans)
    by_shard = positions.argsort(kind="stable")
    positions = positions[by_shard]
    queries = np.empty((2, len(positions)), np.uint64)
    queries[0], queries[1] = begins[by_shard], ends[by_shard]
    bounds = np.empty(queries.shape, np.int64)  # each span's first and end document in its shard's offsets
    cuts = [0, *((positions[1:] != positions[:-1]).nonzero()[0] + 1).tolist(), len(positions)]
    shard_offsets = []
    for start, stop in pairwise(cuts):
        offsets = reader.shard(int(positions[start])).offsets  # mapped uint64: searched in place, never converted
        bounds[:, start:stop] = offsets.searchsorted(queries[:, start:stop], side="left")
        shard_offsets.append(offsets)
    # A position in the offsets below the span's end starts a non-empty document (empty ones share it).
    counts = bounds[1] - bounds[0]
    found = flat_indices(bounds[0], counts)
    found_cuts = counts.cumsum()[np.array(cuts[1:], np.int64) - 1].tolist()
    flat = np.empty(len(found), np.int64)
    for offsets, (start, stop) in zip(shard_offsets, pairwise([0, *found_cuts]), strict=True):
        flat[start:stop] = offsets[found[start:stop]]
    flat += (bases + shifts)[by_shard].repeat(counts)
    return flat


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
        copies each piece, a slice of its shard's mapped tokens, into place (`copy_pieces`).
        """
        length = self.sequence_length
        if len(indices) == 0:
            empty = np.empty(0, np.int64)
            return PieceRows(np.empty((0, length), dtype), empty, empty, empty)
        # Rows grouped by shard (stable): one search into each shard's packing for all its rows.
        positions = self.row_bases.searchsorted(indices, side="right") - 1
        by_shard = positions.argsort(kind="stable")
        positions = positions[by_shard]
        local_rows = indices[by_shard] - self.row_bases[positions]
        row_cuts = [0, *((positions[1:] != positions[:-1]).nonzero()[0] + 1).tolist(), len(positions)]
        used = positions[row_cuts[:-1]].tolist()
        packings = [self.packing(reader, position) for position in used]
        firsts = np.empty(len(indices), np.int64)
        counts = np.empty(len(indices), np.int64)
        for packing, (start, stop) in zip(packings, pairwise(row_cuts), strict=True):
            chosen = local_rows[start:stop]
            firsts[start:stop] = packing.row_starts[chosen]
            counts[start:stop] = packing.row_starts[chosen + 1]
        counts -= firsts
        pieces = flat_indices(firsts, counts)  # each row's pieces in its shard's packing, rows grouped by shard
        ends = counts.cumsum()
        piece_cuts = [0, *ends[np.array(row_cuts[1:], np.int64) - 1].tolist()]
        starts = np.empty(len(pieces), np.int64)
        lengths = np.empty(len(pieces), np.int64)
        for packing, (start, stop) in zip(packings, pairwise(piece_cuts), strict=True):
            chosen = pieces[start:stop]
            starts[start:stop] = packing.piece_starts[chosen]
            lengths[start:stop] = packing.piece_lengths[chosen]
        # Where each piece goes: its row (the row's place in ``indices``), after the row's earlier pieces.
        piece_ends = lengths.cumsum()
        row_ends = piece_ends[ends - 1]
        fills = row_ends.copy()
        fills[1:] -= row_ends[:-1]
        destinations = piece_ends - lengths + (by_shard * length - (row_ends - fills)).repeat(counts)
        out = np.empty((len(indices), length), dtype)
        flat = out.reshape(-1)
        copy_pieces(reader, used, piece_cuts, starts, starts + lengths, destinations, flat)
        row_fills = np.empty_like(fills)
        row_fills[by_shard] = fills
        flat[flat_indices(np.arange(len(indices), dtype=np.int64) * length + row_fills, length - row_fills)] = pad_id
        mask = None
        if masked:
            mask = np.zeros(out.shape, np.bool_)
            shards = np.repeat(used, np.diff(piece_cuts)).tolist()
            stops = (starts + lengths).tolist()
            fill_piece_masks(mask.reshape(-1), reader, shards, starts.tolist(), stops, destinations.tolist())
        row_counts = np.empty_like(counts)
        row_counts[by_shard] = counts
        if len(used) > 1:  # pieces back to the rows' order in ``indices``
            lengths = lengths[flat_indices((ends - counts)[by_shard.argsort()], row_counts)]
        return PieceRows(out, lengths, row_counts, length - row_fills, mask)


def copy_pieces(
    reader: TokenReader,
    shards: list[int],
    piece_cuts: list[int],
    starts: np.ndarray,
    stops: np.ndarray,
    destinations: np.ndarray,
    out: np.ndarray,
) -> None:
    """Tokens ``starts[i]:stops[i]`` of the reader's shard ``shards[k]`` (for the pieces ``i`` from
    ``piece_cuts[k]`` to ``piece_cuts[k + 1]``) copied to ``out[destinations[i]:]`` (flat), cast to its dtype.

    A group of batches holds a few hundred pieces, and a NumPy slice assignment per piece cost more than
    its tokens: each piece is copied as bytes (memoryview slices, a fraction of the cost) into an array
    of the stored dtype, which is cast to ``out``'s dtype in one pass.
    """
    size = reader.dtype.itemsize
    stored = out if out.dtype == reader.dtype else np.empty(out.shape, reader.dtype)
    target = stored.data.cast("B")
    byte_starts, byte_stops = (starts * size).tolist(), (stops * size).tolist()
    byte_destinations = (destinations * size).tolist()
    for position, (first, last) in zip(shards, pairwise(piece_cuts), strict=True):
        tokens = reader.shard_tokens(position).data.cast("B")
        for start, stop, destination in zip(
            byte_starts[first:last], byte_stops[first:last], byte_destinations[first:last], strict=True
        ):
            target[destination : destination + stop - start] = tokens[start:stop]
    if stored is not out:
        np.copyto(out, stored, casting="unsafe")
