"""Packing whole documents into rows: pieces, then best-fit decreasing within one shard.

A document longer than the row is cut into pieces of ``capacity`` tokens (the
last one shorter); empty documents give no piece. Pieces are placed longest
first (ties: storage order), each into the row with the least free space that
still fits it (ties: the earliest row), else into a new row. The placement is a
loop over pieces, but each step is a few C-level operations: rows wait in
buckets keyed by their free space (a heap of row numbers per bucket, so the
earliest row comes first), and a sorted list of the non-empty free spaces finds
the best fit by bisection. Pieces longer than half a row never share a row with
one another, so they open their rows all at once, without the loop.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class ShardPacking:
    """The rows of one shard: row ``r`` holds pieces ``row_starts[r]:row_starts[r + 1]`` in placement order.

    ``piece_starts`` are token offsets within the shard, ``piece_lengths`` their lengths (int64 both).
    """

    row_starts: np.ndarray
    piece_starts: np.ndarray
    piece_lengths: np.ndarray

    @property
    def row_count(self) -> int:
        return len(self.row_starts) - 1


LONG_DOCUMENTS = ("split", "truncate", "drop")  # what becomes of a document longer than a row


def document_pieces(offsets: np.ndarray, capacity: int, long_documents: str = "split") -> tuple[np.ndarray, np.ndarray]:
    """The pieces of the documents bounded by ``offsets`` (n + 1 token offsets), in storage order.

    Returns their starts and lengths (int64): document ``i`` gives ``ceil(length / capacity)`` pieces with
    ``long_documents="split"``; a document longer than ``capacity`` gives one piece of its first ``capacity``
    tokens with ``"truncate"``, none with ``"drop"``.
    """
    offsets = np.asarray(offsets).astype(np.int64)
    lengths = np.diff(offsets)
    counts = -(-lengths // capacity)
    if long_documents != "split":
        counts = np.minimum(counts, 1) if long_documents == "truncate" else np.where(lengths > capacity, 0, counts)
    document = np.repeat(np.arange(len(lengths), dtype=np.int64), counts)
    first_piece = np.cumsum(counts) - counts
    within = (np.arange(len(document), dtype=np.int64) - np.repeat(first_piece, counts)) * capacity
    starts = offsets[:-1][document] + within
    return starts, np.minimum(lengths[document] - within, capacity)


def best_fit_decreasing(lengths: np.ndarray, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """Place pieces of the given lengths (each in 1..capacity) into rows of ``capacity``.

    Returns ``(row_starts, order)``: the pieces of row ``r`` are ``order[row_starts[r]:row_starts[r + 1]]``
    (indices into ``lengths``), in the order they were placed.
    """
    lengths = np.asarray(lengths, np.int64)
    placed = np.argsort(-lengths, kind="stable")  # longest first, ties in storage order
    sorted_lengths = lengths[placed]
    alone = int(np.count_nonzero(2 * sorted_lengths > capacity))  # each opens its own row
    rows = np.empty(len(lengths), np.int64)
    rows[:alone] = np.arange(alone)
    rows[alone:] = _place_small(sorted_lengths[:alone].tolist(), sorted_lengths[alone:].tolist(), capacity)
    row_count = int(rows.max()) + 1 if len(rows) else 0
    order = placed[np.argsort(rows, kind="stable")]
    row_starts = np.zeros(row_count + 1, np.int64)
    np.cumsum(np.bincount(rows, minlength=row_count), out=row_starts[1:])
    return row_starts, order


def _place_small(opened: list[int], small: list[int], capacity: int) -> list[int]:
    """The rows of pieces ``small`` (each at most half a row, longest first), after rows opened by ``opened``."""
    buckets: list[list[int]] = [[] for _ in range(capacity + 1)]  # free space -> heap of row numbers
    for row, length in enumerate(opened):
        buckets[capacity - length].append(row)  # ascending row numbers: already a heap
    free_spaces = sorted(free for free in range(1, capacity + 1) if buckets[free])
    next_row = len(opened)
    rows = []
    heappop, heappush, bisect_left, insort = heapq.heappop, heapq.heappush, bisect.bisect_left, bisect.insort
    for length in small:
        found = bisect_left(free_spaces, length)
        if found == len(free_spaces):  # no row has room: open one
            row = next_row
            next_row += 1
            free = capacity - length
        else:
            fit = free_spaces[found]
            bucket = buckets[fit]
            row = heappop(bucket)
            if not bucket:
                del free_spaces[found]
            free = fit - length
        if free:
            bucket = buckets[free]
            if not bucket:
                insort(free_spaces, free)
            heappush(bucket, row)
        rows.append(row)
    return rows


def pack_shard(offsets: np.ndarray, capacity: int, long_documents: str = "split") -> ShardPacking:
    """The packing of one shard's documents (bounded by ``offsets``) into rows of ``capacity`` tokens."""
    starts, lengths = document_pieces(offsets, capacity, long_documents)
    row_starts, order = best_fit_decreasing(lengths, capacity)
    return ShardPacking(row_starts, starts[order], lengths[order])
