"""loader.explain: the next batches' records, shards and token offsets, exactly what the loader then yields."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from tests.helpers.batches import take
from tests.helpers.provenance import (
    MODES,
    assert_explains,
    grown_after_one_batch,
    open_loader,
    readers_of,
    token,
)


def assert_next_batches_explained(loader: StatefulDataLoader, mode: str, path: Path, count: int) -> None:
    """``explain(count)`` takes nothing, and the next ``count`` batches read are the ones it described."""
    state = loader.state_dict()
    explained = loader.explain(count)
    assert loader.state_dict() == state
    assert json.loads(json.dumps(explained)) == explained
    batches = take(loader, count)
    readers = readers_of(mode, path)
    try:
        for description, batch in zip(explained, batches, strict=True):
            assert_explains(description, batch, readers)
    finally:
        for reader in readers.values():
            reader.close()


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("shuffle", [False, True])
def test_explain_describes_the_batches_then_read_across_epochs(tmp_path: Path, mode: str, shuffle: bool) -> None:
    with open_loader(mode, tmp_path, shuffle=shuffle) as loader:
        count = len(loader) + 3
        explained = loader.explain(count)
        assert_next_batches_explained(loader, mode, tmp_path, count)
    assert [(batch["epoch"], batch["batch"], batch["rank"]) for batch in explained] == [
        (0, b, 0) for b in range(count - 3)
    ] + [(1, b, 0) for b in range(3)]


@pytest.mark.parametrize("mode", ["packed", "mixture-windows", "documents"])
def test_explain_with_worker_processes(tmp_path: Path, mode: str) -> None:
    with open_loader(mode, tmp_path, num_workers=2) as loader:
        next(iter(loader))
        assert_next_batches_explained(loader, mode, tmp_path, 4)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_explain_after_resume(tmp_path: Path, mode: str) -> None:
    with open_loader(mode, tmp_path) as loader:
        take(loader, len(loader) - 1)
        state = json.loads(json.dumps(loader.state_dict()))
    with open_loader(mode, tmp_path) as resumed:
        resumed.load_state_dict(state)
        assert_next_batches_explained(resumed, mode, tmp_path, 3)


@pytest.mark.parametrize("mode", ["windows", "packed", "mixture-packed", "mixture-documents"])
def test_explain_after_elastic_resume_and_for_other_ranks(tmp_path: Path, mode: str) -> None:
    with open_loader(mode, tmp_path, rank=1, world_size=2, local_batch_size=3) as loader:
        take(loader, 2)
        state = loader.state_dict()
    for rank in range(3):
        with open_loader(mode, tmp_path, rank=0, world_size=3, local_batch_size=2) as first:
            first.load_state_dict(state)
            explained = first.explain(5, rank=rank)
        assert {batch["rank"] for batch in explained} == {rank}
        with open_loader(mode, tmp_path, rank=rank, world_size=3, local_batch_size=2) as loader:
            loader.load_state_dict(state)
            assert loader.explain(5) == explained
            assert_next_batches_explained(loader, mode, tmp_path, 5)


def test_the_batch_number_counts_the_epoch_s_batches_on_every_rank(tmp_path: Path) -> None:
    with open_loader("windows", tmp_path, rank=1, world_size=2, local_batch_size=2) as loader:
        take(loader, 3)
        explained = loader.explain(2)
    assert [(batch["epoch"], batch["batch"], batch["rank"]) for batch in explained] == [(0, 3, 1), (0, 4, 1)]


def test_explain_of_a_padded_last_batch_names_the_samples_the_ranks_repeat(tmp_path: Path) -> None:
    with open_loader("documents", tmp_path, shuffle=False, rank=2, world_size=4, local_batch_size=5) as loader:
        last = loader.explain(len(loader))[-1]
        assert [sample["pieces"] for sample in last["samples"]] == [
            [{"shard": 0, "record": 1, "index": 1, "start": 0, "stop": None}]
        ]  # 21 records: 20 fill the first global batch; the last one, padded to 4, gives rank 2 the 23rd: record 1


def test_a_window_lists_every_document_it_overlaps_and_none_empty(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        for record, length in enumerate([5, 0, 3, 0, 0, 12]):
            writer.append(7, token(7, record, np.arange(length)))
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=6) as loader:
        (batch,) = loader.explain()
    assert batch["samples"] == [
        {
            "component": None,
            "pieces": [
                {"shard": 7, "record": 0, "index": 0, "start": 0, "stop": 5},
                {"shard": 7, "record": 2, "index": 2, "start": 0, "stop": 1},
            ],
        },
        {
            "component": None,
            "pieces": [
                {"shard": 7, "record": 2, "index": 2, "start": 1, "stop": 3},
                {"shard": 7, "record": 5, "index": 5, "start": 0, "stop": 4},
            ],
        },
    ]


def test_a_window_across_shards_names_both(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens")
    with storage.sync_writer() as writer:
        writer.append(0, token(0, 0, np.arange(5)))
        writer.append(3, token(3, 0, np.arange(9)))
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=1, sequence_length=7) as loader:
        (batch,) = loader.explain()
    assert batch["samples"][0]["pieces"] == [
        {"shard": 0, "record": 0, "index": 0, "start": 0, "stop": 5},
        {"shard": 3, "record": 0, "index": 1, "start": 0, "stop": 2},
    ]


def test_mixture_samples_name_their_component(tmp_path: Path) -> None:
    with open_loader("mixture-windows", tmp_path, shuffle=False) as loader:
        (batch,) = loader.explain()
        names = [sample["component"] for sample in batch["samples"]]
    assert set(names) <= {"web", "code"} and len(names) == 3


def test_explain_continues_into_the_grown_storage_s_next_epoch(tmp_path: Path) -> None:
    open_grown, state, rest = grown_after_one_batch(tmp_path / "single")
    with open_grown() as resumed:
        resumed.load_state_dict(state)
        explained = resumed.explain(rest + 20)
        shards = [{piece["shard"] for sample in batch["samples"] for piece in sample["pieces"]} for batch in explained]
        assert 9 not in set().union(*shards[:rest]) and 9 in set().union(*shards[rest:])
        assert explained[rest - 1]["epoch"] == 0 and explained[rest]["epoch"] == 1
        assert_next_batches_explained(resumed, "windows", tmp_path, rest + 20)


@pytest.mark.parametrize(
    ("arguments", "error", "message"),
    [
        ({"batches": 0}, ValueError, "batches must be >= 1, got 0"),
        ({"batches": 1.5}, TypeError, "batches must be an int, got float"),
        ({"rank": 2}, ValueError, "rank must be < world_size (2), got 2"),
        ({"rank": -1}, ValueError, "rank must be >= 0, got -1"),
    ],
)
def test_explain_arguments_are_checked(tmp_path: Path, arguments: dict[str, Any], error: type, message: str) -> None:
    with open_loader("windows", tmp_path, rank=0, world_size=2) as loader:
        with pytest.raises(error) as caught:
            loader.explain(**arguments)
    assert str(caught.value) == message


@pytest.mark.parametrize("long_documents", ["truncate", "drop"])
def test_explain_follows_what_packing_keeps_of_long_documents(tmp_path: Path, long_documents: str) -> None:
    with open_loader("packed", tmp_path, long_documents=long_documents) as loader:
        explained = loader.explain(len(loader))
        assert all(piece["start"] == 0 for batch in explained for s in batch["samples"] for piece in s["pieces"])
        assert_next_batches_explained(loader, "packed", tmp_path, len(loader) + 1)
