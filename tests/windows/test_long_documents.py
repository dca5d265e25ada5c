"""pack_documents=True with long_documents="split", "truncate" or "drop": documents longer than a row."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import Mixture, StatefulDataLoader, StateMismatchError, TokenStorage
from guideloom._windows.packing import document_pieces, pack_shard
from tests.helpers.batches import assert_resumes_exactly
from tests.windows.test_packing import SHARD_DOCUMENTS, packed_loader, reference_pieces, write_numbered
from tests.windows.test_packing import reference_rows as packing_reference_rows

pytestmark = pytest.mark.usefixtures("cache_dir")  # each test packs into its own cache


def reference_long_pieces(lengths: list[int], capacity: int, long_documents: str) -> list[tuple[int, int]]:
    """(start, length) of every piece, document after document, by the rule as written."""
    if long_documents == "split":
        return reference_pieces(lengths, capacity)
    pieces, start = [], 0
    for length in lengths:
        if 0 < length <= capacity:
            pieces.append((start, length))
        elif length > capacity and long_documents == "truncate":
            pieces.append((start, capacity))
        start += length
    return pieces


def reference_rows(shards: dict[int, list[int]], capacity: int, long_documents: str) -> list[list[int]]:
    """Every packed row's tokens (unpadded; tokens are stream positions + 1), shards in ascending id."""
    return packing_reference_rows(
        shards, capacity, lambda lengths, capacity: reference_long_pieces(lengths, capacity, long_documents)
    )


def open_packed(storage: Any, capacity: int, long_documents: str | None, **options: Any) -> StatefulDataLoader:
    """``packed_loader`` with ``long_documents`` (None: left to its default)."""
    chosen = {} if long_documents is None else {"long_documents": long_documents}
    return packed_loader(storage, capacity, batch=options.pop("local_batch_size", 3), **chosen, **options)


def served_rows(loader: StatefulDataLoader) -> list[list[int]]:
    return [[token for token in row if token] for batch in loader for row in batch["input_ids"].tolist()]


@pytest.mark.parametrize("long_documents", ["split", "truncate", "drop"])
@pytest.mark.parametrize("capacity", [4, 8, 13])
def test_rows_are_the_reference_packing(tmp_path: Path, long_documents: str, capacity: int) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with open_packed(storage, capacity, long_documents) as loader:
        assert served_rows(loader) == reference_rows(SHARD_DOCUMENTS, capacity, long_documents)


def test_split_is_the_default(tmp_path: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with open_packed(storage, 8, None) as default, open_packed(storage, 8, "split") as split:
        assert served_rows(default) == served_rows(split)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(0, 30), max_size=25), st.integers(1, 12), st.sampled_from(["split", "truncate", "drop"]))
def test_pieces_keep_every_kept_token_once(lengths: list[int], capacity: int, long_documents: str) -> None:
    offsets = np.concatenate([[0], np.cumsum(lengths, dtype=np.int64)]).astype(np.uint64)
    starts, piece_lengths = document_pieces(offsets, capacity, long_documents)
    assert list(zip(starts.tolist(), piece_lengths.tolist(), strict=True)) == reference_long_pieces(
        lengths, capacity, long_documents
    )
    packing = pack_shard(offsets, capacity, long_documents)
    kept = sorted(
        token
        for start, length in zip(packing.piece_starts.tolist(), packing.piece_lengths.tolist(), strict=True)
        for token in range(start, start + length)
    )
    assert kept == [token for start, length in reference_long_pieces(lengths, capacity, long_documents)
                    for token in range(start, start + length)]  # fmt: skip


@pytest.mark.parametrize("long_documents", ["truncate", "drop"])
def test_a_shuffled_epoch_serves_every_kept_token_once_and_counts_what_is_left_out(
    tmp_path: Path, long_documents: str
) -> None:
    capacity = 8
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with open_packed(storage, capacity, long_documents, shuffle=True, seed=5) as loader:
        tokens = sorted(token for row in served_rows(loader) for token in row)
    lengths = [length for shard in sorted(SHARD_DOCUMENTS) for length in SHARD_DOCUMENTS[shard]]
    starts = np.concatenate([[0], np.cumsum(lengths)]).tolist()
    long = [index for index, length in enumerate(lengths) if length > capacity]
    assert len(long) == 7  # of 12, 16, 30, 9, 9, 9 and 15 tokens
    kept: list[int] = []
    for index, length in enumerate(lengths):
        kept += range(starts[index] + 1, starts[index] + 1 + (length if index not in long else 0))
        if index in long and long_documents == "truncate":
            kept += range(starts[index] + 1, starts[index] + 1 + capacity)
    assert tokens == sorted(kept)
    dropped = sum(lengths[index] for index in long) if long_documents == "drop" else 0
    truncated = sum(lengths[index] - capacity for index in long) if long_documents == "truncate" else 0
    assert len(tokens) == sum(lengths) - dropped - truncated


def test_the_packing_cache_keeps_each_mode_apart(tmp_path: Path, cache_dir: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    results = {}
    for long_documents in ("split", "truncate", "drop", "split", "truncate", "drop"):
        with open_packed(storage, 8, long_documents) as loader:
            rows = served_rows(loader)
        assert results.setdefault(long_documents, rows) == rows
    assert len({json.dumps(rows) for rows in results.values()}) == 3
    assert len(list((cache_dir / "packing").iterdir())) == 3 * len(SHARD_DOCUMENTS)


def test_a_state_of_another_mode_is_refused(tmp_path: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with open_packed(storage, 8, "split") as loader:
        next(iter(loader))
        state = loader.state_dict()
    with open_packed(storage, 8, "drop") as loader, pytest.raises(StateMismatchError, match="long_documents"):
        loader.load_state_dict(state)


@pytest.mark.parametrize("long_documents", ["truncate", "drop"])
def test_resume_after_every_step_is_exact_with_workers(tmp_path: Path, long_documents: str) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)

    def reopen() -> StatefulDataLoader:
        return open_packed(storage, 8, long_documents, shuffle=True, seed=2, num_workers=2, local_batch_size=2)

    with reopen() as loader:
        total = len(loader) + 2
    assert_resumes_exactly(reopen, total, list(range(total)))


def test_a_mixture_applies_the_mode_to_every_component(tmp_path: Path) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    other = write_numbered(tmp_path / "other", {0: [3, 20, 4]})
    with open_packed(other, 8, "drop") as loader:
        assert served_rows(loader) == [[24, 25, 26, 27, 1, 2, 3]]  # the 20-token document left out
    alone = set()
    for member in (storage, other):
        with open_packed(member, 8, "drop") as loader:
            alone |= {tuple(row) for row in served_rows(loader)}
    mixture = Mixture({"a": storage, "b": other}, weights={"a": 1, "b": 1}, block_size=2)
    with open_packed(mixture, 8, "drop") as loader:
        assert {tuple(row) for row in served_rows(loader)} == alone


@pytest.mark.parametrize("options", [{}, {"document_boundaries": True}])
def test_long_documents_without_pack_documents_is_refused(tmp_path: Path, options: dict[str, Any]) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with pytest.raises(ValueError, match=r"long_documents.*pack_documents=True"):
        StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=2, sequence_length=8, long_documents="split", **options
        )


@pytest.mark.parametrize("value, error", [("cut", ValueError), (1, TypeError)])
def test_an_unknown_long_documents_is_refused(tmp_path: Path, value: object, error: type) -> None:
    storage = write_numbered(tmp_path / "tokens", SHARD_DOCUMENTS)
    with pytest.raises(error, match="long_documents"):
        open_packed(storage, 8, value)  # type: ignore[arg-type]


def test_dropping_every_document_leaves_no_sample(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        writer.append(0, np.arange(1, 30))
    with pytest.raises(ValueError, match="no samples"):
        open_packed(storage, 8, "drop")
