"""Rows of tokens with the pieces they are made of, and the batch dict that says where pieces start.

A piece is a run of one document within one row; a row's padding is one more
piece. From the pieces of a batch's rows come ``position_ids`` (0 at the first
token of every piece, +1 after; 0 on padding), ``labels`` (the tokens, -100
where ``position_ids`` is 0 and on padding), ``cu_seqlens`` (0 and the
cumulative piece lengths of the flattened batch) and ``max_seqlen``. All of it
is computed with whole-array operations, never per token; the one loop is a copy
per document that starts inside a row, when documents are long enough for a copy
to beat a pass over every token.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from itertools import accumulate, pairwise
from typing import Any

import numpy as np
import torch

IGNORE_INDEX = -100
LONG_PIECES = 1024  # tokens per document starting inside a row, on average, from which each gets its own copy


class RowDicts:
    """Rows as a sequence of one-row batch dicts, what a user ``collate`` receives: a subclass gives
    ``input_ids``, ``take(rows)`` and ``batch()``."""

    input_ids: np.ndarray

    def __len__(self) -> int:
        return len(self.input_ids)

    def __getitem__(self, row: int) -> dict[str, Any]:
        """Row ``row`` alone, as the batch dict of one row without its batch dimension (what a user collate sees)."""
        if not -len(self) <= row < len(self):
            raise IndexError(f"row {row} is out of range for {len(self)} rows")
        batch = self.take(np.array([row % len(self)], np.int64)).batch()
        return {
            key: value[0] if key in ("input_ids", "position_ids", "labels") else value for key, value in batch.items()
        }

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for row in range(len(self)):
            yield self[row]

    def take(self, rows: np.ndarray) -> Any:
        raise NotImplementedError

    def batch(self) -> dict[str, Any]:
        raise NotImplementedError


@dataclass(frozen=True)
class PieceRows(RowDicts):
    """``n`` rows of ``S`` tokens and their pieces.

    Row ``r`` holds ``piece_counts[r]`` document pieces (their lengths, row after row, in
    ``piece_lengths``), followed by ``padding[r]`` padding tokens. ``loss_mask`` (bool, shaped like
    ``input_ids``) marks the tokens that count toward the loss in rows of a masked storage; None: all do.
    """

    input_ids: np.ndarray
    piece_lengths: np.ndarray
    piece_counts: np.ndarray
    padding: np.ndarray
    loss_mask: np.ndarray | None = None

    def take(self, rows: np.ndarray) -> PieceRows:
        """The rows at these positions (int64), in that order."""
        piece_bounds = np.concatenate([[0], np.cumsum(self.piece_counts)]).astype(np.int64)
        counts = self.piece_counts[rows]
        first = piece_bounds[rows]
        pieces = flat_indices(first, counts)
        mask = None if self.loss_mask is None else self.loss_mask[rows]
        return PieceRows(self.input_ids[rows], self.piece_lengths[pieces], counts, self.padding[rows], mask)

    def split(self, sizes: list[int]) -> list[PieceRows]:
        """Consecutive groups of ``sizes`` rows."""
        row_bounds = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        piece_bounds = np.concatenate([[0], np.cumsum(self.piece_counts)]).astype(np.int64)[row_bounds].tolist()
        return [
            PieceRows(
                self.input_ids[start:stop],
                self.piece_lengths[piece_start:piece_stop],
                self.piece_counts[start:stop],
                self.padding[start:stop],
                None if self.loss_mask is None else self.loss_mask[start:stop],
            )
            for (start, stop), (piece_start, piece_stop) in zip(
                pairwise(row_bounds.tolist()), pairwise(piece_bounds), strict=True
            )
        ]

    @staticmethod
    def concatenate(parts: list[PieceRows]) -> PieceRows:
        """The rows of ``parts``, one after another."""
        return PieceRows(
            np.concatenate([part.input_ids for part in parts]),
            np.concatenate([part.piece_lengths for part in parts]),
            np.concatenate([part.piece_counts for part in parts]),
            np.concatenate([part.padding for part in parts]),
            concatenate_masks(parts),
        )

    def batch(self) -> dict[str, Any]:
        """The batch dict: ``input_ids``, ``position_ids``, ``labels``, ``cu_seqlens``, ``max_seqlen``."""
        lengths, is_padding = self._all_piece_lengths()
        position_ids, labels, cu_seqlens = piece_arrays(self.input_ids, lengths, is_padding)
        if self.loss_mask is not None:
            np.putmask(labels, ~self.loss_mask, IGNORE_INDEX)
        return {
            "input_ids": torch.from_numpy(self.input_ids),
            "position_ids": torch.from_numpy(position_ids),
            "labels": torch.from_numpy(labels),
            "cu_seqlens": torch.from_numpy(cu_seqlens),
            "max_seqlen": int(lengths.max()) if len(lengths) else 0,
        }

    def _all_piece_lengths(self) -> tuple[np.ndarray, np.ndarray | None]:
        """Every piece's length, padding pieces included (row-major), and which pieces are padding (None: no
        row is padded, as in every batch of stream windows)."""
        padded = self.padding > 0
        if not padded.any():
            return self.piece_lengths, None
        counts = self.piece_counts + padded
        padding_pieces = (counts.cumsum() - 1)[padded]
        is_padding = np.zeros(int(counts.sum()), bool)
        is_padding[padding_pieces] = True
        lengths = np.empty(len(is_padding), np.int64)
        lengths[~is_padding] = self.piece_lengths
        lengths[padding_pieces] = self.padding[padded]
        return lengths, is_padding


def concatenate_masks(parts: list[Any]) -> np.ndarray | None:
    """The loss masks of the rows of ``parts`` (each with ``input_ids`` and ``loss_mask``), one after another:
    None when no part has one, all True for the rows of a part without."""
    if all(part.loss_mask is None for part in parts):
        return None
    return np.concatenate(
        [np.ones(part.input_ids.shape, np.bool_) if part.loss_mask is None else part.loss_mask for part in parts]
    )


def piece_arrays(
    input_ids: np.ndarray, lengths: np.ndarray, is_padding: np.ndarray | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``position_ids``, ``labels`` (both int64, shaped like ``input_ids``) and ``cu_seqlens`` (int32).

    ``is_padding`` says which pieces are padding; None: none is. This runs for every group of batches:
    its cost is mostly the number of array operations, so the unpadded case skips those of padding.
    """
    length = input_ids.shape[1]
    total = input_ids.size
    cu_seqlens = np.zeros(len(lengths) + 1, np.int64)
    lengths.cumsum(out=cu_seqlens[1:])
    if cu_seqlens[-1] != total:
        raise AssertionError(f"pieces cover {cu_seqlens[-1]} tokens of a batch of {total}")
    starts = cu_seqlens[:-1]
    if len(lengths) and int(lengths.min()) < 1:
        raise AssertionError("a piece of no tokens")
    # One block for both arrays: one allocation per batch (or group), which the allocator reuses.
    position_ids, labels = np.empty((2, *input_ids.shape), np.int64)
    np.copyto(labels, input_ids)
    inside = starts % length != 0  # documents starting inside a row
    if is_padding is not None:
        inside &= ~is_padding
    if int(np.count_nonzero(inside)) * LONG_PIECES <= total:
        count_up_by_rows(position_ids, starts[inside], lengths[inside])
    else:
        count_up_by_steps(position_ids.reshape(-1), starts, lengths)
    flat_labels = labels.reshape(-1)
    if is_padding is not None:
        padding = flat_indices(starts[is_padding], lengths[is_padding])
        position_ids.reshape(-1)[padding] = 0
        flat_labels[padding] = IGNORE_INDEX
    flat_labels[starts] = IGNORE_INDEX
    return position_ids, labels, cu_seqlens.astype(np.int32)


def count_up_by_rows(position_ids: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Positions when pieces are long: every row counts up from 0, then each piece starting inside a row
    (at flat ``starts``, ``lengths`` long) counts again from 0; a pass over the rows and a copy per such piece."""
    length = position_ids.shape[1]
    ramp = np.arange(length, dtype=np.int64)
    np.copyto(position_ids, ramp)
    flat, counting = position_ids.reshape(-1).data, ramp.data  # memoryviews: their slices copy faster than NumPy's
    for start, count in zip(starts.tolist(), lengths.tolist(), strict=True):
        flat[start : start + count] = counting[:count]


def count_up_by_steps(flat_positions: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
    """Positions when pieces are short: +1 per token and a step back to 0 at each piece start, summed in one
    pass (``starts``/``lengths``: every piece of the flat batch, in order)."""
    flat_positions.fill(1)
    flat_positions[:1] = 0
    flat_positions[starts[1:]] = 1 - lengths[:-1]
    np.cumsum(flat_positions, out=flat_positions)


def flat_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Every index of the runs ``[start, start + length)``, one run after another."""
    ends = lengths.cumsum()
    total = int(ends[-1]) if len(ends) else 0
    indices: np.ndarray = (starts - (ends - lengths)).repeat(lengths) + np.arange(total, dtype=np.int64)
    return indices


def window_pieces(window_starts: np.ndarray, length: int, document_starts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For windows ``stream[s:s + length]``: how many pieces each row has, and their lengths (row-major).

    ``document_starts`` are the stream positions where non-empty documents begin, strictly increasing;
    a window's own start always begins a piece.
    """
    window_starts = np.asarray(window_starts, np.int64)
    document_starts = np.asarray(document_starts, np.int64)
    first = document_starts.searchsorted(window_starts, side="right")
    inside = document_starts.searchsorted(window_starts + length, side="left") - first
    shift = np.arange(0, len(window_starts) * length, length, dtype=np.int64) - window_starts
    cuts = document_starts[flat_indices(first, inside)] + shift.repeat(inside)
    return pieces_at_cuts(cuts, len(window_starts), length)


def pieces_at_cuts(cuts: np.ndarray, rows: int, length: int) -> tuple[np.ndarray, np.ndarray]:
    """Pieces of ``rows`` rows of ``length`` tokens cut at ``cuts``: how many each row has, and their lengths.

    ``cuts`` are flat positions (``row * length + column``) where pieces begin, int64, in any order and
    possibly repeated; every row's own start begins a piece too.
    """
    points = np.empty(len(cuts) + rows + 1, np.int64)
    points[: len(cuts)] = cuts
    points[len(cuts) :] = np.arange(0, (rows + 1) * length, length, dtype=np.int64)
    points.sort()
    distinct = np.empty(len(points), np.bool_)  # the last of each run of equal points
    np.not_equal(points[:-1], points[1:], out=distinct[:-1])
    distinct[-1] = True
    points = points[distinct]
    return np.bincount(points[:-1] // length, minlength=rows), points[1:] - points[:-1]


def split_batch(batch: dict[str, Any], sizes: list[int]) -> list[dict[str, Any]]:
    """A batch dict of several batches' rows cut back into those batches (each row starts a piece).

    Every part's ``cu_seqlens`` and ``max_seqlen`` are computed for all parts at once: this runs for
    every group of batches, and per-part array calls would cost more than the parts' own rows.
    """
    cu_seqlens = batch["cu_seqlens"].numpy().astype(np.int64)
    row_ends = np.fromiter(accumulate(sizes, initial=0), np.int64, len(sizes) + 1)
    row_ends *= batch["input_ids"].shape[1]  # where each part starts in the flat batch, and the end
    cuts = cu_seqlens.searchsorted(row_ends)  # each part's first piece, and the end
    piece_counts = cuts[1:] - cuts[:-1]
    piece_lengths = cu_seqlens[1:] - cu_seqlens[:-1]
    if piece_counts.all():  # every part has rows, hence pieces
        longest = np.maximum.reduceat(piece_lengths, cuts[:-1])
    else:  # a part of no rows has no piece: its max_seqlen is 0
        longest = np.zeros(len(sizes), np.int64)
        if len(piece_lengths):
            longest[piece_counts > 0] = np.maximum.reduceat(piece_lengths, cuts[:-1][piece_counts > 0])
    # Part i's cu_seqlens: entries cuts[i] .. cuts[i + 1] (its end is the next part's start), less its start.
    counts = piece_counts + 1
    ends = counts.cumsum()
    entries = (cuts[:-1] - ends + counts).repeat(counts) + np.arange(ends[-1], dtype=np.int64)
    rebased = (cu_seqlens[entries] - row_ends[:-1].repeat(counts)).astype(np.int32)
    part_cu_seqlens = torch.from_numpy(rebased).split_with_sizes(counts.tolist())
    columns = [batch[key].split_with_sizes(sizes) for key in ("input_ids", "position_ids", "labels")]
    return [
        {"input_ids": ids, "position_ids": positions, "labels": labels, "cu_seqlens": cu, "max_seqlen": top}
        for ids, positions, labels, cu, top in zip(*columns, part_cu_seqlens, longest.tolist(), strict=True)
    ]
