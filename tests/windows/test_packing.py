"""Packing documents into rows: pieces, best-fit decreasing against a plain reference, and the on-disk cache."""

from __future__ import annotations

import itertools
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._loading.make_source import make_source
from guideloom._sources.window_modes import PackedDocuments
from guideloom._windows.packing import best_fit_decreasing, document_pieces, pack_shard
from guideloom._windows.packing_cache import load_or_build


def reference_pieces(lengths: list[int], capacity: int) -> list[tuple[int, int]]:
    """(start, length) of every piece, document after document, cut with plain loops."""
    pieces, start = [], 0
    for length in lengths:
        for offset in range(0, length, capacity):
            pieces.append((start + offset, min(capacity, length - offset)))
        start += length
    return pieces


def reference_best_fit_decreasing(lengths: list[int], capacity: int) -> list[list[int]]:
    """The rows (piece indices in placement order) by the rule as written: a scan of every row per piece."""
    order = sorted(range(len(lengths)), key=lambda piece: (-lengths[piece], piece))
    rows: list[list[int]] = []
    free: list[int] = []
    for piece in order:
        best = None
        for row in range(len(rows)):
            if free[row] >= lengths[piece] and (best is None or free[row] < free[best]):
                best = row
        if best is None:
            rows.append([])
            free.append(capacity)
            best = len(rows) - 1
        rows[best].append(piece)
        free[best] -= lengths[piece]
    return rows


def as_rows(row_starts: np.ndarray, order: np.ndarray) -> list[list[int]]:
    return [order[start:stop].tolist() for start, stop in itertools.pairwise(row_starts)]


def offsets_of(lengths: list[int]) -> np.ndarray:
    return np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.uint64)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 40).flatmap(lambda capacity: st.tuples(st.just(capacity), st.lists(st.integers(1, capacity)))))
def test_best_fit_decreasing_matches_the_reference(case: tuple[int, list[int]]) -> None:
    capacity, lengths = case
    row_starts, order = best_fit_decreasing(np.array(lengths, np.int64), capacity)
    assert as_rows(row_starts, order) == reference_best_fit_decreasing(lengths, capacity)


def test_best_fit_decreasing_matches_the_reference_on_many_ties() -> None:
    lengths = np.random.default_rng(3).integers(1, 9, 3000).tolist()  # few distinct lengths: ties everywhere
    row_starts, order = best_fit_decreasing(np.array(lengths), 16)
    assert as_rows(row_starts, order) == reference_best_fit_decreasing(lengths, 16)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(0, 100)))
def test_pieces_cut_documents_into_rows_of_capacity(capacity: int, lengths: list[int]) -> None:
    starts, piece_lengths = document_pieces(offsets_of(lengths), capacity)
    assert list(zip(starts.tolist(), piece_lengths.tolist(), strict=True)) == reference_pieces(lengths, capacity)


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 30), st.lists(st.integers(0, 100)))
def test_a_packed_shard_holds_every_token_once_within_its_rows(capacity: int, lengths: list[int]) -> None:
    packing = pack_shard(offsets_of(lengths), capacity)
    served = np.zeros(sum(lengths), np.int64)
    for row in range(packing.row_count):
        pieces = slice(packing.row_starts[row], packing.row_starts[row + 1])
        assert 0 < packing.piece_lengths[pieces].sum() <= capacity
        for start, length in zip(packing.piece_starts[pieces], packing.piece_lengths[pieces], strict=True):
            served[start : start + length] += 1
    assert served.tolist() == [1] * sum(lengths)


def test_pieces_follow_their_documents_rows_in_placement_order() -> None:
    packing = pack_shard(offsets_of([5, 0, 12, 3, 7]), 8)  # pieces: 5, 8, 4, 3, 7
    rows = [
        list(zip(packing.piece_starts[a:b].tolist(), packing.piece_lengths[a:b].tolist(), strict=True))
        for a, b in zip(packing.row_starts[:-1], packing.row_starts[1:], strict=True)
    ]
    assert rows == [[(5, 8)], [(20, 7)], [(0, 5), (17, 3)], [(13, 4)]]


def cached_files(cache_dir: Path) -> list[Path]:
    return sorted((cache_dir / "packing").glob("*.pack"))


def assert_same_packing(found: object, expected: object) -> None:
    for name in ("row_starts", "piece_starts", "piece_lengths"):
        assert np.array_equal(getattr(found, name), getattr(expected, name)), name


def test_the_cache_is_written_once_and_then_read(cache_dir: Path) -> None:
    offsets = offsets_of(np.random.default_rng(0).integers(0, 300, 500).tolist())
    first = load_or_build(offsets, 128)
    [file] = cached_files(cache_dir)
    written = file.stat().st_mtime_ns
    second = load_or_build(offsets, 128)
    assert file.stat().st_mtime_ns == written
    assert_same_packing(second, pack_shard(offsets, 128))
    assert_same_packing(first, second)
    assert not second.row_starts.flags.writeable  # mapped from the file


def test_each_row_length_has_its_own_cache_file(cache_dir: Path) -> None:
    offsets = offsets_of([10, 20, 30])
    load_or_build(offsets, 16)
    load_or_build(offsets, 32)
    assert len(cached_files(cache_dir)) == 2


@pytest.mark.parametrize("damage", ["flip", "truncate", "empty"])
def test_a_damaged_cache_file_is_rebuilt(cache_dir: Path, damage: str) -> None:
    offsets = offsets_of(np.random.default_rng(1).integers(0, 300, 200).tolist())
    load_or_build(offsets, 64)
    [file] = cached_files(cache_dir)
    data = bytearray(file.read_bytes())
    if damage == "flip":
        data[-3] ^= 0x10
    file.write_bytes(bytes(data[: len(data) // 2] if damage == "truncate" else b"" if damage == "empty" else data))
    assert_same_packing(load_or_build(offsets, 64), pack_shard(offsets, 64))
    assert load_or_build(offsets, 64).row_starts.flags.writeable is False  # the rebuilt file is sound again


def test_no_temporary_file_is_left_behind(cache_dir: Path) -> None:
    load_or_build(offsets_of([3, 4, 5]), 8)
    assert [path.name.startswith(".") for path in (cache_dir / "packing").iterdir()] == [False]


def test_an_unwritable_cache_warns_and_packs_in_memory(cache_dir: Path) -> None:
    cache_dir.write_bytes(b"a file where the cache directory should be")
    with pytest.warns(RuntimeWarning, match="GUIDELOOM_CACHE_DIR"):
        packing = load_or_build(offsets_of([3, 4, 5]), 8)
    assert_same_packing(packing, pack_shard(offsets_of([3, 4, 5]), 8))


# The loader with pack_documents=True, against the reference above on the stored document lengths.

SHARD_DOCUMENTS = {0: [5, 0, 12, 3, 7, 16], 2: [1, 30, 2], 3: [0, 0], 5: [9, 9, 9, 4, 0, 15, 2, 2]}


def write_numbered(path: Path, shard_documents: dict[int, list[int]]) -> TokenStorage:
    """Documents whose tokens are their stream positions + 1 (never the pad id 0)."""
    storage = TokenStorage(path)
    position = 1
    with storage.sync_writer() as writer:
        for shard, lengths in shard_documents.items():
            for length in lengths:
                writer.append(shard, np.arange(position, position + length))
                position += length
    return storage


def reference_rows(
    shard_documents: dict[int, list[int]],
    capacity: int,
    cut: Callable[[list[int], int], list[tuple[int, int]]] = reference_pieces,
) -> list[list[int]]:
    """Every packed row's tokens (unpadded), shards in ascending id, by the reference packing of the pieces
    that ``cut`` makes of each shard's documents."""
    rows, position = [], 1
    for shard in sorted(shard_documents):
        lengths = shard_documents[shard]
        pieces = cut(lengths, capacity)
        for row in reference_best_fit_decreasing([length for _, length in pieces], capacity):
            rows.append([position + pieces[piece][0] + offset for piece in row for offset in range(pieces[piece][1])])
        position += sum(lengths)
    return rows


def packed_loader(storage: TokenStorage, capacity: int, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=options.pop("batch", 3),
        sequence_length=capacity,
        pack_documents=True,
        **options,
    )


@pytest.mark.parametrize("capacity", [4, 8, 13])
def test_packed_rows_are_the_reference_packing_in_storage_order(tmp_path: Path, cache_dir: Path, capacity: int) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with packed_loader(storage, capacity, pad_id=0) as loader:
        served = [row for batch in loader for row in batch["input_ids"].tolist()]
    expected = reference_rows(SHARD_DOCUMENTS, capacity)
    assert served == [row + [0] * (capacity - len(row)) for row in expected]


def test_a_shuffled_packed_epoch_serves_every_token_once(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with packed_loader(storage, 8, shuffle=True, seed=3, pad_id=0) as loader:
        tokens = np.concatenate([batch["input_ids"].reshape(-1).numpy() for batch in loader])
    total = sum(map(sum, SHARD_DOCUMENTS.values()))
    assert sorted(tokens[tokens != 0].tolist()) == list(range(1, total + 1))
    assert int((tokens == 0).sum()) == len(tokens) - total


def test_packed_batches_pad_with_pad_id_in_window_dtype(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", {0: [3, 2]})
    with packed_loader(storage, 8, pad_id=7, window_dtype=torch.int32) as loader:
        [batch] = list(loader)
    assert batch["input_ids"].dtype == torch.int32
    assert batch["input_ids"].tolist() == [[1, 2, 3, 4, 5, 7, 7, 7]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 0, 1, 0, 0, 0]]
    assert batch["labels"].tolist() == [[-100, 2, 3, -100, 5, -100, -100, -100]]
    assert (batch["cu_seqlens"].tolist(), batch["max_seqlen"]) == ([0, 3, 5, 8], 3)


def test_packed_batch_keys_match_the_stored_document_lengths(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    starts = {}  # token -> (its document's first token, the piece start it belongs to)
    position = 1
    for lengths in SHARD_DOCUMENTS.values():
        for length in lengths:
            for offset in range(length):
                starts[position + offset] = position + offset - offset % 8
            position += length
    with packed_loader(storage, 8, batch=4, shuffle=True) as loader:
        for batch in loader:
            flat = batch["input_ids"].reshape(-1).tolist()
            positions = [0 if token == 0 else token - starts[token] for token in flat]
            assert batch["position_ids"].reshape(-1).tolist() == positions
            labels = [-100 if position == 0 else token for token, position in zip(flat, positions, strict=True)]
            assert batch["labels"].reshape(-1).tolist() == labels
            cuts = [
                index
                for index in range(len(flat))
                if index % 8 == 0 or (positions[index] == 0 and (flat[index] != 0 or flat[index - 1] != 0))
            ]
            assert batch["cu_seqlens"].tolist() == [*cuts, len(flat)]
            assert batch["max_seqlen"] == max(b - a for a, b in itertools.pairwise([*cuts, len(flat)]))


def test_the_packing_is_cached_and_used_again(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with packed_loader(storage, 8) as loader:
        first = [batch["input_ids"].tolist() for batch in loader]
    files = {path: path.stat().st_mtime_ns for path in cached_files(cache_dir)}
    assert len(files) == 3  # one per shard read (shard 3, of empty documents only, has no rows to read)
    with packed_loader(storage, 8) as loader:
        assert [batch["input_ids"].tolist() for batch in loader] == first
    assert {path: path.stat().st_mtime_ns for path in cached_files(cache_dir)} == files


def test_no_rows_asked_gives_no_rows(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    source = make_source(storage, PackedDocuments(), sequence_length=8)
    batch = source.default_collate(source.fetch(np.empty(0, np.int64), 0))
    source.close()
    assert tuple(batch["input_ids"].shape) == (0, 8) and batch["cu_seqlens"].tolist() == [0]
