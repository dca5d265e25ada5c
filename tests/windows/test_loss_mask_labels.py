"""Loaders over masked token storages: labels -100 wherever the mask is 0, in every window mode and mixture.

Tokens are numbered (token = stream position + 1 per storage, 0 never a token), so the mask of any
token a batch holds is looked up by its value, whatever the order, mode or mixture.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import Mixture, StatefulDataLoader, TokenStorage
from tests.helpers.batches import assert_resumes_exactly, comparable, take

MODES: dict[str, dict[str, Any]] = {
    "plain": {},
    "boundaries": {"document_boundaries": True},
    "packed": {"pack_documents": True},
}
SHARDS = {0: [5, 0, 12, 3, 7, 16], 2: [1, 30, 2], 5: [9, 9, 4, 15, 2]}


pytestmark = pytest.mark.usefixtures("cache_dir")  # each test packs into its own cache


def write_numbered(
    path: Path, shards: dict[int, list[int]], mask: np.ndarray | None, first: int = 1, dtype: str = "uint32"
) -> TokenStorage:
    """Documents of the given lengths whose tokens are ``first`` + their stream position; masked by ``mask``
    (one value per stream position), or an unmasked storage when ``mask`` is None."""
    storage = TokenStorage(path, dtype, loss_mask=mask is not None)
    position = 0
    with storage.sync_writer() as writer:
        for shard, lengths in shards.items():
            for length in lengths:
                tokens = np.arange(first + position, first + position + length)
                if mask is None:
                    writer.append(shard, tokens)
                else:
                    writer.append(shard, tokens, loss_mask=mask[position : position + length])
                position += length
    return storage


def runs_mask(total: int, seed: int) -> np.ndarray:
    """Runs of 1 to 5 tokens that count or not, as the turns of conversations are."""
    rng = np.random.default_rng(seed)
    values = np.zeros(total, bool)
    position = 0
    while position < total:
        run = int(rng.integers(1, 6))
        values[position : position + run] = bool(rng.integers(0, 2))
        position += run
    return values


def open_loader(storage: Any, mode: str, **options: Any) -> StatefulDataLoader:
    settings_ = {"device": "cpu", "local_batch_size": 3, "sequence_length": 8, **MODES[mode], **options}
    return StatefulDataLoader.from_storage(storage, **settings_)


def expected_labels(input_ids: torch.Tensor, plain_labels: torch.Tensor, mask: np.ndarray, first: int = 1) -> list[Any]:
    """Token by token: the label of an unmasked storage's batch, or -100 where the token's mask is 0."""
    expected = []
    for ids, labels in zip(input_ids.tolist(), plain_labels.tolist(), strict=True):
        row = []
        for token, label in zip(ids, labels, strict=True):
            counted = token >= first and bool(mask[token - first])
            row.append(label if counted else -100)
        expected.append(row)
    return expected


def both_ways(tmp_path: Path, mode: str, shards: dict[int, list[int]], mask: np.ndarray, **options: Any) -> Any:
    """Every batch of an epoch over the masked storage, and over the same tokens unmasked."""
    masked = write_numbered(tmp_path / "masked", shards, mask)
    plain = write_numbered(tmp_path / "plain", shards, None)
    with open_loader(masked, mode, **options) as loader:
        masked_batches = list(loader)
    with open_loader(plain, mode, **options) as loader:
        plain_batches = list(loader)
    return masked_batches, plain_batches


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_labels_are_minus_100_wherever_the_mask_is_0(tmp_path: Path, mode: str, shuffle: bool) -> None:
    mask = runs_mask(sum(map(sum, SHARDS.values())), seed=1)
    masked_batches, plain_batches = both_ways(tmp_path, mode, SHARDS, mask, shuffle=shuffle, seed=2)
    assert len(masked_batches) == len(plain_batches)
    for masked, plain in zip(masked_batches, plain_batches, strict=True):
        if mode == "plain":
            assert sorted(masked) == ["input_ids", "labels"]
            plain = {"input_ids": plain, "labels": plain.to(torch.int64)}  # plain windows: every token counts
        assert sorted(masked) == sorted(plain)
        for key in plain:  # everything but the labels is the unmasked storage's batch
            if key != "labels":
                assert comparable(masked)[key] == comparable(plain)[key], key
        assert masked["labels"].dtype == torch.int64
        assert masked["labels"].tolist() == expected_labels(masked["input_ids"], plain["labels"], mask)


def test_plain_windows_label_each_token_by_its_mask(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", "uint16", loss_mask=True)
    with storage.sync_writer() as writer:
        writer.append(0, [11, 12, 13], loss_mask=[0, 1, 1])
        writer.append(0, [14, 15, 16, 17, 18], loss_mask=[0, 0, 1, 1, 0])
    with open_loader(storage, "plain", sequence_length=4, local_batch_size=2) as loader:
        [batch] = list(loader)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14], [15, 16, 17, 18]]
    assert batch["labels"].tolist() == [[-100, 12, 13, -100], [-100, 16, 17, -100]]


def test_packed_rows_label_by_mask_and_by_piece(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "sft", "uint16", loss_mask=True)
    with storage.sync_writer() as writer:
        writer.append(0, [11, 12, 13], loss_mask=[0, 1, 1])
        writer.append(0, [14, 15], loss_mask=[1, 1])
    with open_loader(storage, "packed", sequence_length=6, local_batch_size=1, pad_id=9) as loader:
        [batch] = list(loader)
    assert batch["input_ids"].tolist() == [[11, 12, 13, 14, 15, 9]]
    assert batch["labels"].tolist() == [[-100, 12, 13, -100, 15, -100]]  # 14 starts a piece: no label
    assert batch["cu_seqlens"].tolist() == [0, 3, 5, 6]


@settings(max_examples=25, deadline=None)
@given(
    st.lists(st.lists(st.integers(0, 20), min_size=1, max_size=6), min_size=1, max_size=3),
    st.sampled_from(sorted(MODES)),
    st.integers(2, 9),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_labels_match_the_token_by_token_reference(
    lengths: list[list[int]], mode: str, length: int, shuffle: bool, seed: int
) -> None:
    shards = dict(enumerate(lengths))
    total = sum(map(sum, lengths))
    if (mode != "packed" and total < length) or total == 0:
        return  # no sample to load: refused at construction, tested elsewhere
    with tempfile.TemporaryDirectory() as directory:
        mask = runs_mask(total, seed)
        masked_batches, plain_batches = both_ways(
            Path(directory), mode, shards, mask, sequence_length=length, shuffle=shuffle, seed=seed
        )
    for masked, plain in zip(masked_batches, plain_batches, strict=True):
        plain_labels = plain.to(torch.int64) if mode == "plain" else plain["labels"]
        assert masked["labels"].tolist() == expected_labels(masked["input_ids"], plain_labels, mask)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_mixture_of_masked_and_unmasked_storages_labels_both(tmp_path: Path, mode: str) -> None:
    """The unmasked component's tokens all count; every batch of the mixture is a dict with labels."""
    total = sum(map(sum, SHARDS.values()))
    mask = runs_mask(total, seed=5)
    masked = write_numbered(tmp_path / "masked", SHARDS, mask)
    plain = write_numbered(tmp_path / "plain", SHARDS, None, first=100_000)
    twin = write_numbered(tmp_path / "twin", SHARDS, None)  # the masked one's tokens, unmasked
    mixture = Mixture({"plain": plain, "masked": masked}, weights={"plain": 0.5, "masked": 0.5}, block_size=4)
    twins = Mixture({"plain": plain, "masked": twin}, weights={"plain": 0.5, "masked": 0.5}, block_size=4)
    with open_loader(mixture, mode, shuffle=True, seed=3) as loader:
        batches = list(loader)
    with open_loader(twins, mode, shuffle=True, seed=3) as loader:
        twin_batches = list(loader)
    counted = np.concatenate([mask, np.ones(100_000, bool)])  # tokens from 1 (masked) and from 100_000 (plain)
    seen_plain = seen_masked = False
    for batch, unmasked in zip(batches, twin_batches, strict=True):
        assert isinstance(batch, dict) and "labels" in batch
        unmasked_labels = unmasked.to(torch.int64) if mode == "plain" else unmasked["labels"]
        assert batch["input_ids"].tolist() == (unmasked if mode == "plain" else unmasked["input_ids"]).tolist()
        assert batch["labels"].tolist() == expected_labels(batch["input_ids"], unmasked_labels, counted)
        seen_plain |= bool((batch["input_ids"] >= 100_000).any())
        seen_masked |= bool(((batch["input_ids"] > 0) & (batch["input_ids"] < 100_000)).any())
    assert seen_plain and seen_masked


@pytest.mark.parametrize("mode", sorted(MODES))
def test_resume_after_every_step_is_exact_with_workers(tmp_path: Path, mode: str) -> None:
    storage = write_numbered(tmp_path / "masked", SHARDS, runs_mask(sum(map(sum, SHARDS.values())), seed=7))

    def reopen() -> StatefulDataLoader:
        return open_loader(storage, mode, shuffle=True, seed=11, num_workers=2, local_batch_size=2)

    with reopen() as loader:
        total = len(loader) + 2  # into the next epoch
    assert_resumes_exactly(reopen, total, list(range(total)))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_workers_and_threads_give_the_inline_batches(tmp_path: Path, mode: str) -> None:
    storage = write_numbered(tmp_path / "masked", SHARDS, runs_mask(sum(map(sum, SHARDS.values())), seed=8))
    sequences = []
    for workers in (0, 1, 2):
        with open_loader(storage, mode, shuffle=True, seed=1, num_workers=workers) as loader:
            sequences.append([comparable(batch) for batch in take(loader, 2 * len(loader))])
    assert sequences[0] == sequences[1] == sequences[2]


def test_a_user_collate_gets_one_dict_per_window(tmp_path: Path) -> None:
    storage = write_numbered(tmp_path / "masked", SHARDS, runs_mask(sum(map(sum, SHARDS.values())), seed=9))
    with open_loader(storage, "plain") as loader:
        expected = next(iter(loader))
    with open_loader(storage, "plain", collate=lambda rows: rows) as loader:
        rows = next(iter(loader))
    assert [sorted(row) for row in rows] == [["input_ids", "labels"]] * 3
    assert [row["labels"].tolist() for row in rows] == expected["labels"].tolist()


def test_int32_windows_keep_int64_labels(tmp_path: Path) -> None:
    mask = runs_mask(sum(map(sum, SHARDS.values())), seed=4)
    storage = write_numbered(tmp_path / "masked", SHARDS, mask)
    with open_loader(storage, "plain", window_dtype=torch.int32) as loader:
        batch = next(iter(loader))
    assert batch["input_ids"].dtype == torch.int32 and batch["labels"].dtype == torch.int64
    assert batch["labels"].tolist() == expected_labels(batch["input_ids"], batch["input_ids"].long(), mask)


def test_elastic_resume_from_two_ranks_to_three_serves_each_window_once(tmp_path: Path) -> None:
    storage = write_numbered(tmp_path / "masked", SHARDS, runs_mask(sum(map(sum, SHARDS.values())), seed=6))
    options = {"shuffle": True, "local_batch_size": 2}
    with open_loader(storage, "plain", **options) as whole:
        epoch = [tuple(row) for batch in whole for row in batch["labels"].tolist()]
    served, state = [], None
    for rank in range(2):
        with open_loader(storage, "plain", rank=rank, world_size=2, **options) as loader:
            batches = iter(loader)
            served += [tuple(row) for row in next(batches)["labels"].tolist()]
            state = loader.state_dict()
    for rank in range(3):
        with open_loader(storage, "plain", rank=rank, world_size=3, **options) as loader:
            loader.load_state_dict(state)
            served += [tuple(row) for batch in loader for row in batch["labels"].tolist()]
    assert set(served) == set(epoch) and len(served) == len(epoch) + (-(len(epoch) - 4)) % 3


def test_a_grown_masked_storage_finishes_the_epoch_on_the_checkpoints_shards(tmp_path: Path) -> None:
    mask = runs_mask(200, seed=2)
    storage = write_numbered(tmp_path / "masked", {0: [10, 20], 1: [15, 5]}, mask)
    with open_loader(storage, "packed", shuffle=True) as loader:
        batches = iter(loader)
        next(batches)
        state = json.loads(json.dumps(loader.state_dict()))
        rest = [comparable(batch) for batch in batches]
    with storage.sync_writer() as writer:
        writer.append(7, np.arange(1000, 1012), loss_mask=np.arange(12) % 2 == 0)
    with open_loader(storage, "packed", shuffle=True) as loader:
        loader.load_state_dict(state)
        assert [comparable(batch) for batch in loader] == rest
        next_epoch = [comparable(batch) for batch in loader]
    labels = [label for batch in next_epoch for row in batch["labels"] for label in row]
    # rows of 8: pieces 1000-1007 and 1008-1011, whose starts have no label; odd tokens are masked
    assert {1002, 1004, 1006, 1010} <= set(labels) and not {1000, 1001, 1003, 1008} & set(labels)


@pytest.mark.parametrize("mode", ["plain", "packed"])
def test_a_mixed_masked_and_unmasked_loader_resumes_exactly_with_workers(tmp_path: Path, mode: str) -> None:
    total_tokens = sum(map(sum, SHARDS.values()))
    masked = write_numbered(tmp_path / "masked", SHARDS, runs_mask(total_tokens, seed=12))
    plain = write_numbered(tmp_path / "plain", SHARDS, None, first=100_000)
    mixture = Mixture({"masked": masked, "plain": plain}, weights={"masked": 2, "plain": 1}, block_size=3)

    def reopen() -> StatefulDataLoader:
        return open_loader(mixture, mode, shuffle=True, seed=5, num_workers=2, local_batch_size=2)

    with reopen() as loader:
        total = len(loader) + 2
    assert_resumes_exactly(reopen, total, list(range(0, total, 3)))
