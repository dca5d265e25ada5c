"""Pieces of rows -> position_ids, labels, cu_seqlens, max_seqlen, against token-by-token recomputation."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._windows.boundaries import (
    PieceRows,
    count_up_by_rows,
    count_up_by_steps,
    flat_indices,
    split_batch,
    window_pieces,
)


def expected_arrays(rows: list[list[int]], pads: list[int], tokens: np.ndarray) -> dict[str, object]:
    """position_ids, labels, cu_seqlens, max_seqlen token by token from each row's piece lengths and padding."""
    positions, labels, cu_seqlens, longest = [], [], [0], 0
    flat_tokens = tokens.reshape(-1).tolist()
    for pieces, pad in zip(rows, pads, strict=True):
        for length, is_padding in [(piece, False) for piece in pieces] + ([(pad, True)] if pad else []):
            for position in range(length):
                token = flat_tokens[len(positions)]
                positions.append(0 if is_padding else position)
                labels.append(-100 if is_padding or position == 0 else token)
            cu_seqlens.append(cu_seqlens[-1] + length)
            longest = max(longest, length)
    return {"position_ids": positions, "labels": labels, "cu_seqlens": cu_seqlens, "max_seqlen": longest}


def rows_of(tokens: np.ndarray, rows: list[list[int]], pads: list[int]) -> PieceRows:
    """``tokens`` as rows made of these pieces (per row) followed by this much padding."""
    return PieceRows(
        tokens,
        np.array([piece for pieces in rows for piece in pieces], np.int64),
        np.array([len(pieces) for pieces in rows], np.int64),
        np.array(pads, np.int64),
    )


@st.composite
def piece_rows(draw: st.DrawFn) -> tuple[int, list[list[int]], list[int]]:
    length = draw(st.integers(1, 12))
    rows, pads = [], []
    for _ in range(draw(st.integers(1, 6))):
        pieces, free = [], length
        while free and draw(st.booleans()):
            pieces.append(draw(st.integers(1, free)))
            free -= pieces[-1]
        if not pieces:
            pieces.append(draw(st.integers(1, length)))
            free = length - pieces[0]
        rows.append(pieces)
        pads.append(free)
    return length, rows, pads


@settings(max_examples=300, deadline=None)
@given(piece_rows())
def test_batch_arrays_match_a_token_by_token_recomputation(case: tuple[int, list[list[int]], list[int]]) -> None:
    length, rows, pads = case
    tokens = np.arange(1, len(rows) * length + 1, dtype=np.int64).reshape(len(rows), length)
    batch = rows_of(tokens, rows, pads).batch()
    expected = expected_arrays(rows, pads, tokens)
    assert batch["position_ids"].reshape(-1).tolist() == expected["position_ids"]
    assert batch["labels"].reshape(-1).tolist() == expected["labels"]
    assert batch["cu_seqlens"].tolist() == expected["cu_seqlens"]
    assert batch["max_seqlen"] == expected["max_seqlen"]
    assert batch["input_ids"].tolist() == tokens.tolist()


@settings(max_examples=200, deadline=None)
@given(piece_rows())
def test_both_ways_of_counting_positions_agree_with_a_recomputation(
    case: tuple[int, list[list[int]], list[int]],
) -> None:
    # Long pieces take one copy each, short ones a running sum; padding is blanked afterwards by both.
    length, rows, pads = case
    lengths = [piece for pieces, pad in zip(rows, pads, strict=True) for piece in [*pieces, *([pad] if pad else [])]]
    expected = [position for piece in lengths for position in range(piece)]
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    inside = starts % length != 0
    by_rows = np.empty((len(rows), length), np.int64)
    count_up_by_rows(by_rows, starts[inside], np.array(lengths, np.int64)[inside])
    by_steps = np.empty(len(rows) * length, np.int64)
    count_up_by_steps(by_steps, starts, np.array(lengths, np.int64))
    assert by_rows.reshape(-1).tolist() == expected
    assert by_steps.tolist() == expected


def test_long_and_short_documents_give_the_same_batch_arrays_as_a_recomputation() -> None:
    rng = np.random.default_rng(3)
    for low, high in ((1, 40), (900, 5000)):  # many short documents per row, and a few long ones
        rows, pads = [], []
        for _ in range(6):
            pieces, free = [], 2048
            while free > 0:
                pieces.append(min(free, int(rng.integers(low, high))))
                free -= pieces[-1]
            pad = int(rng.integers(0, pieces[-1])) if len(pieces) > 1 else 0
            pieces[-1] -= pad
            rows.append([piece for piece in pieces if piece])
            pads.append(pad)
        tokens = rng.integers(0, 1000, (6, 2048))
        batch = rows_of(tokens, rows, pads).batch()
        expected = expected_arrays(rows, pads, tokens)
        assert batch["position_ids"].reshape(-1).tolist() == expected["position_ids"]
        assert batch["labels"].reshape(-1).tolist() == expected["labels"]


def test_flat_indices_lists_every_index_of_the_runs() -> None:
    assert flat_indices(np.array([3, 10, 20]), np.array([2, 0, 3])).tolist() == [3, 4, 20, 21, 22]
    assert flat_indices(np.array([], np.int64), np.array([], np.int64)).tolist() == []


def test_batch_dtypes_and_shapes() -> None:
    tokens = np.arange(8, dtype=np.int32).reshape(2, 4)
    batch = PieceRows(tokens, np.array([4, 1, 2]), np.array([1, 2]), np.array([0, 1])).batch()
    assert [(key, value.dtype, tuple(value.shape)) for key, value in batch.items() if key != "max_seqlen"] == [
        ("input_ids", torch.int32, (2, 4)),
        ("position_ids", torch.int64, (2, 4)),
        ("labels", torch.int64, (2, 4)),
        ("cu_seqlens", torch.int32, (5,)),
    ]
    assert batch["max_seqlen"] == 4 and type(batch["max_seqlen"]) is int


def test_split_and_concatenate_give_back_the_same_rows() -> None:
    rows = PieceRows(np.arange(12).reshape(3, 4), np.array([4, 1, 3, 2, 1]), np.array([1, 2, 2]), np.array([0, 0, 1]))
    parts = rows.split([1, 0, 2])
    assert [len(part) for part in parts] == [1, 0, 2]
    assert parts[2].piece_lengths.tolist() == [1, 3, 2, 1]
    joined = PieceRows.concatenate(parts)
    for name in ("input_ids", "piece_lengths", "piece_counts", "padding"):
        assert np.array_equal(getattr(joined, name), getattr(rows, name)), name


def document_of_each_token(lengths: list[int]) -> list[int]:
    return [document for document, length in enumerate(lengths) for _ in range(length)]


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 10), st.lists(st.integers(0, 15), min_size=1), st.data())
def test_window_pieces_match_the_stored_document_lengths(length: int, lengths: list[int], data: st.DataObject) -> None:
    owner = document_of_each_token(lengths)
    windows = len(owner) // length
    if windows == 0:
        return
    picked = data.draw(st.lists(st.integers(0, windows - 1), min_size=1, max_size=6))
    offsets = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
    starts = offsets[:-1][np.diff(offsets) > 0]  # where non-empty documents begin
    counts, piece_lengths = window_pieces(np.array(picked, np.int64) * length, length, starts)
    expected_counts, expected_lengths = [], []
    for window in picked:
        run_owners = owner[window * length : (window + 1) * length]
        runs = [1]
        for before, after in itertools.pairwise(run_owners):
            if before == after:
                runs[-1] += 1
            else:
                runs.append(1)
        expected_counts.append(len(runs))
        expected_lengths.extend(runs)
    assert counts.tolist() == expected_counts
    assert piece_lengths.tolist() == expected_lengths


def three_rows() -> PieceRows:
    return PieceRows(np.arange(12).reshape(3, 4), np.array([4, 1, 3, 2, 1]), np.array([1, 2, 2]), np.array([0, 0, 1]))


def test_take_picks_rows_with_their_pieces() -> None:
    taken = three_rows().take(np.array([2, 0, 2]))
    assert taken.input_ids.tolist() == [[8, 9, 10, 11], [0, 1, 2, 3], [8, 9, 10, 11]]
    assert (taken.piece_lengths.tolist(), taken.piece_counts.tolist(), taken.padding.tolist()) == (
        [2, 1, 4, 2, 1],
        [2, 1, 2],
        [1, 0, 1],
    )


def test_a_row_alone_is_a_one_row_batch_without_its_batch_dimension() -> None:
    row = three_rows()[2]
    assert row["input_ids"].tolist() == [8, 9, 10, 11]
    assert row["position_ids"].tolist() == [0, 1, 0, 0]
    assert row["labels"].tolist() == [-100, 9, -100, -100]
    assert (row["cu_seqlens"].tolist(), row["max_seqlen"]) == ([0, 2, 3, 4], 2)
    assert [sample["input_ids"].tolist() for sample in three_rows()] == np.arange(12).reshape(3, 4).tolist()


@settings(max_examples=200, deadline=None)
@given(piece_rows(), st.data())
def test_a_split_batch_equals_the_batches_of_its_parts(
    case: tuple[int, list[list[int]], list[int]], data: st.DataObject
) -> None:
    length, rows, pads = case
    cuts = sorted(data.draw(st.lists(st.integers(0, len(rows)), max_size=3)))
    sizes = [stop - start for start, stop in itertools.pairwise([0, *cuts, len(rows)])]
    whole = rows_of(np.arange(len(rows) * length).reshape(len(rows), length), rows, pads)
    for found, part in zip(split_batch(whole.batch(), sizes), whole.split(sizes), strict=True):
        expected = part.batch()
        assert list(found) == list(expected)
        for key, value in expected.items():
            assert (found[key].tolist() if key != "max_seqlen" else found[key]) == (
                value.tolist() if key != "max_seqlen" else value
            ), key


# The loader with document_boundaries=True, against the stored document lengths.

DOCUMENTS = {0: [5, 0, 12, 3], 1: [1, 30], 4: [9, 0, 9, 9, 4, 15, 2, 2]}


def write_documents(path: Path) -> TokenStorage:
    storage = TokenStorage(path)
    rng = np.random.default_rng(0)
    with storage.sync_writer() as writer:
        for shard, lengths in DOCUMENTS.items():
            for length in lengths:
                writer.append(shard, rng.integers(0, 1000, length))
    return storage


def boundary_loader(storage: TokenStorage, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=3, sequence_length=7, **options)


@pytest.mark.parametrize("shuffle", [False, True])
def test_boundary_windows_are_the_plain_windows(tmp_path: Path, shuffle: bool) -> None:
    storage = write_documents(tmp_path / "tokens")
    with boundary_loader(storage, shuffle=shuffle, seed=5) as loader:
        plain = [batch.tolist() for batch in loader]
    with boundary_loader(storage, shuffle=shuffle, seed=5, document_boundaries=True) as loader:
        assert [batch["input_ids"].tolist() for batch in loader] == plain


def test_boundary_batch_keys_match_the_stored_document_lengths(tmp_path: Path) -> None:
    storage = write_documents(tmp_path / "tokens")
    owner = document_of_each_token([length for lengths in DOCUMENTS.values() for length in lengths])
    with storage.sync_reader() as reader:
        stream = reader.read_tokens(0, reader.token_count).tolist()
    with boundary_loader(storage, document_boundaries=True) as loader:
        batches = list(loader)
    windows = [range(window * 7, window * 7 + 7) for window in range(len(stream) // 7)]
    for batch, rows in zip(batches, [windows[first : first + 3] for first in range(0, len(windows), 3)], strict=True):
        positions, cuts = [], []
        for row in rows:
            for at, token in enumerate(row):
                starts_piece = at == 0 or owner[token] != owner[token - 1]
                positions.append(0 if starts_piece else positions[-1] + 1)
                if starts_piece:
                    cuts.append(len(positions) - 1)
        flat = [stream[token] for row in rows for token in row]
        assert batch["input_ids"].reshape(-1).tolist() == flat
        assert batch["position_ids"].reshape(-1).tolist() == positions
        assert batch["labels"].reshape(-1).tolist() == [
            -100 if position == 0 else token for token, position in zip(flat, positions, strict=True)
        ]
        assert batch["cu_seqlens"].tolist() == [*cuts, len(flat)]
        assert batch["max_seqlen"] == max(b - a for a, b in itertools.pairwise([*cuts, len(flat)]))
