"""document_boundaries=True and pack_documents=True in the loader: resume, workers, states, arguments, training."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from torch import nn
from torch.nn import functional as F

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, StateMismatchError, TokenStorage
from tests.helpers.batches import assert_resumes_exactly, comparable, take

MODES: dict[str, dict[str, Any]] = {
    "boundaries": {"document_boundaries": True},
    "packed": {"pack_documents": True, "pad_id": 3},
}


def write_tokens(path: Path, seed: int = 0) -> TokenStorage:
    """Three shards of documents of 0-40 tokens (ids 4 and up, so pad id 3 is never a token)."""
    rng = np.random.default_rng(seed)
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard, count in ((0, 9), (1, 4), (3, 11)):
            for _ in range(count):
                writer.append(shard, rng.integers(4, 50_000, int(rng.integers(0, 40))))
    return storage


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_resume_after_every_step_is_exact(tmp_path: Path, mode: str, shuffle: bool) -> None:
    storage = write_tokens(tmp_path / "tokens")

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=3, sequence_length=16, shuffle=shuffle, seed=4, **MODES[mode]
        )

    with open_loader() as loader:
        total = 2 * len(loader) + 1  # across an epoch boundary
    assert_resumes_exactly(open_loader, total, list(range(total)))


@pytest.mark.parametrize("mode", sorted(MODES))
def test_workers_and_prefetch_do_not_change_the_batches(tmp_path: Path, mode: str) -> None:
    storage = write_tokens(tmp_path / "tokens")

    def open_loader(workers: int, prefetch: int = 2) -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=3,
            sequence_length=16,
            shuffle=True,
            seed=1,
            num_workers=workers,
            prefetch_factor=prefetch,
            **MODES[mode],
        )

    with open_loader(0) as loader:
        total = 2 * len(loader) + 1
        expected = take(loader, total, comparable)
    with open_loader(2, prefetch=1) as loader:
        assert take(loader, total, comparable) == expected
    with open_loader(2) as loader:
        first = take(loader, 3, comparable)
        state = loader.state_dict()
    with open_loader(2) as resumed:
        resumed.load_state_dict(state)
        assert first + take(resumed, total - 3, comparable) == expected


@pytest.mark.parametrize("mode", sorted(MODES))
def test_a_user_collate_gets_one_dict_per_row_in_worker_processes(tmp_path: Path, mode: str) -> None:
    storage = write_tokens(tmp_path / "tokens")
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 3, "sequence_length": 16, **MODES[mode]}
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        expected = [batch["position_ids"].tolist() for batch in loader]
    with StatefulDataLoader.from_storage(storage, stack_positions, num_workers=2, **options) as loader:
        assert [batch.tolist() for batch in loader] == expected


def stack_positions(rows: Any) -> torch.Tensor:
    assert all(set(row) == {"input_ids", "position_ids", "labels", "cu_seqlens", "max_seqlen"} for row in rows)
    return torch.stack([row["position_ids"] for row in rows])


@pytest.mark.parametrize(
    ("taken", "given", "names"),
    [
        ({}, MODES["boundaries"], "kind"),
        (MODES["boundaries"], MODES["packed"], "kind"),
        (MODES["packed"], {}, "kind"),
        (MODES["packed"], {"pack_documents": True, "pad_id": 0}, "pad_id"),
    ],
)
def test_a_state_of_another_window_mode_is_refused(
    tmp_path: Path, taken: dict[str, Any], given: dict[str, Any], names: str
) -> None:
    storage = write_tokens(tmp_path / "tokens")
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 16}
    with StatefulDataLoader.from_storage(storage, **options, **taken) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(storage, **options, **given) as other:
        with pytest.raises(StateMismatchError, match="pad_id" if names == "pad_id" else "packed|boundaries|windows"):
            other.load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"document_boundaries": True, "pack_documents": True}, ValueError, "exclusive"),
        ({"document_boundaries": 1}, TypeError, "document_boundaries must be a bool"),
        ({"pack_documents": True, "pad_id": 1.0}, TypeError, "pad_id must be an int"),
        ({"pack_documents": True, "pad_id": -1}, ValueError, "pad_id must be in"),
        ({"pack_documents": True, "pad_id": 2**31, "window_dtype": torch.int32}, ValueError, "pad_id must be in"),
        ({"document_boundaries": True, "pad_id": 5}, ValueError, "pad_id applies only with pack_documents"),
    ],
)
def test_window_mode_arguments_are_checked(
    tmp_path: Path, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    storage = write_tokens(tmp_path / "tokens")
    with pytest.raises(error, match=message):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=16, **options)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_ids_beyond_int32_are_refused_at_their_batch_with_int32_windows(tmp_path: Path, mode: str) -> None:
    storage = TokenStorage(tmp_path / "tokens", dtype="uint32")
    with storage.sync_writer() as writer:
        writer.append(0, list(range(4, 20)))
        writer.append(0, [5, 2**31, *range(6, 20)])  # the second row or window
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=1, sequence_length=16, window_dtype=torch.int32, **MODES[mode]
    ) as loader:
        batches = iter(loader)
        assert next(batches)["input_ids"].dtype == torch.int32
        with pytest.raises(ValueError, match="do not fit the loader's int32 batches"):
            next(batches)


def test_document_boundaries_are_refused_for_a_document_storage(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "documents", DocumentJsonFormat())
    with storage.sync_writer() as writer:
        writer.append(0, {"text": "a"})
    with pytest.raises(ValueError, match="document_boundaries=True applies to a TokenStorage"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, **MODES["boundaries"])
    # pack_documents=True packs a document storage's records (tests/documents), but pads nothing
    with pytest.raises(ValueError, match="pad_id applies to packed token rows"):
        StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=8, **MODES["packed"])


# A training step: a tiny causal language model that attends only within pieces (a block-diagonal mask
# built from cu_seqlens) and embeds position_ids, run on a packed batch and on its documents one by one.


class TinyCausalModel(nn.Module):
    def __init__(self, vocabulary: int = 64, dim: int = 16, context: int = 32) -> None:
        super().__init__()
        self.tokens = nn.Embedding(vocabulary, dim)
        self.positions = nn.Embedding(context, dim)
        self.attention = nn.MultiheadAttention(dim, 2, batch_first=True)
        self.head = nn.Linear(dim, vocabulary)

    def forward(self, input_ids: torch.Tensor, position_ids: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        x = self.tokens(input_ids) + self.positions(position_ids)
        attended, _ = self.attention(x, x, x, attn_mask=~allowed.repeat_interleave(2, dim=0), need_weights=False)
        return self.head(x + attended)


def block_diagonal_causal_mask(cu_seqlens: torch.Tensor, rows: int, length: int) -> torch.Tensor:
    """(rows, length, length): True where a token may attend: earlier tokens of its own piece."""
    flat = torch.arange(rows * length)
    piece = torch.searchsorted(cu_seqlens.long(), flat, right=True).view(rows, length)
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    return (piece[:, :, None] == piece[:, None, :]) & causal


def summed_loss(
    model: TinyCausalModel,
    input_ids: torch.Tensor,
    position_ids: torch.Tensor,
    labels: torch.Tensor,
    allowed: torch.Tensor,
) -> torch.Tensor:
    """The Hugging Face convention: logits at t predict labels at t + 1; -100 is ignored."""
    logits = model(input_ids.long(), position_ids, allowed)
    return F.cross_entropy(
        logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100, reduction="sum"
    )


def test_a_packed_batch_loses_what_its_documents_lose_one_by_one(tmp_path: Path) -> None:
    torch.manual_seed(0)
    rng = np.random.default_rng(2)
    documents = [rng.integers(1, 64, length) for length in (5, 16, 9, 1, 0, 12, 14, 3, 8)]
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        for document in documents:
            writer.append(0, document)
    model = TinyCausalModel().double()
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=8, sequence_length=16, pack_documents=True, shuffle=True
    ) as loader:
        [batch] = list(loader)  # the whole epoch
    rows, length = batch["input_ids"].shape
    allowed = block_diagonal_causal_mask(batch["cu_seqlens"], rows, length)
    packed = summed_loss(model, batch["input_ids"], batch["position_ids"], batch["labels"], allowed)
    packed.backward()  # a training step's backward pass goes through the mask
    assert model.tokens.weight.grad is not None and bool(model.tokens.weight.grad.abs().sum() > 0)
    one_by_one = torch.zeros((), dtype=torch.float64)
    with torch.no_grad():
        for document in filter(len, documents):  # the empty document adds nothing to either
            ids = torch.from_numpy(document.astype(np.int64))[None]
            labels = ids.clone()
            labels[:, 0] = -100
            alone = torch.ones(ids.shape[1], ids.shape[1], dtype=torch.bool).tril()[None]
            one_by_one += summed_loss(model, ids, torch.arange(ids.shape[1])[None], labels, alone)
    assert torch.allclose(packed.detach(), one_by_one)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_elastic_resume_from_two_ranks_to_three_serves_each_row_once(tmp_path: Path, mode: str) -> None:
    storage = write_tokens(tmp_path / "tokens")
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 16, "shuffle": True}

    def rows_of(batch: dict[str, Any]) -> list[tuple[int, ...]]:
        return [tuple(row) for row in batch["input_ids"].tolist()]

    with StatefulDataLoader.from_storage(storage, **options, **MODES[mode]) as whole:
        epoch = [row for batch in whole for row in rows_of(batch)]
    served, state = [], None
    for rank in range(2):
        with StatefulDataLoader.from_storage(storage, rank=rank, world_size=2, **options, **MODES[mode]) as loader:
            batches = iter(loader)
            for _ in range(2):
                served.extend(rows_of(next(batches)))
            state = loader.state_dict()
    for rank in range(3):
        with StatefulDataLoader.from_storage(storage, rank=rank, world_size=3, **options, **MODES[mode]) as loader:
            loader.load_state_dict(state)
            served.extend(row for batch in loader for row in rows_of(batch))
    assert len(set(epoch)) == len(epoch)  # rows are told apart by their tokens
    assert set(served) == set(epoch)
    wrapped = (-(len(epoch) - 8)) % 3  # three ranks pad the rest of the epoch to a multiple of 3 by wrapping
    assert len(served) == len(epoch) + wrapped
