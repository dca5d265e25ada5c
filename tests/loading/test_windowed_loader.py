"""The loader with shuffle_window: each machine's share in windows, exactly once, resumed exactly and elastically."""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, StateMismatchError
from guideloom._loading.reopen import loader_from_state
from tests.helpers.batches import assert_resumes_exactly
from tests.helpers.storages import make_token_storage as make_tokens


def make_documents(path: Path, shards: int = 12, per_shard: int = 10) -> DocumentStorage[Any, Any]:
    """``shards`` shards of ``per_shard`` records ``{"id": i}``, numbered in storage order."""
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(shards * per_shard):
            writer.append(index // per_shard, {"id": index})
    return storage


def loaders(storage: Any, world_size: int, **options: Any) -> list[StatefulDataLoader]:
    options = {"shuffle": True, "seed": 3, "shuffle_window": 3, "local_batch_size": 2, **options}
    return [
        StatefulDataLoader.from_storage(storage, device="cpu", rank=rank, world_size=world_size, **options)
        for rank in range(world_size)
    ]


def ids(batch: list[dict[str, int]]) -> list[int]:
    return [record["id"] for record in batch]


def read_in_lockstep(ranks: list[StatefulDataLoader], steps: int | None = None) -> list[list[list[int]]]:
    """Each rank's batches (as record ids), the ranks stepping together as a training loop's do."""
    iterators = [iter(loader) for loader in ranks]
    batches: list[list[list[int]]] = [[] for _ in ranks]
    for together in itertools.islice(zip(*iterators, strict=True), steps):
        for rank, batch in enumerate(together):
            batches[rank].append(ids(batch))
    return batches


def flat(batches: list[list[list[int]]]) -> list[int]:
    """The record ids in the order they were read: step by step, rank after rank (padding last)."""
    return [index for step in zip(*batches, strict=True) for batch in step for index in batch]


@pytest.mark.parametrize("drop_last", [False, True])
def test_every_record_is_read_once_and_every_rank_reads_as_many_batches(tmp_path: Path, drop_last: bool) -> None:
    storage = make_documents(tmp_path / "docs", shards=13, per_shard=7)
    ranks = loaders(storage, 4, local_world_size=2, drop_last=drop_last)
    batches = read_in_lockstep(ranks)
    assert len({len(rank) for rank in batches}) == 1 and len(batches[0]) == len(ranks[0])
    read = flat(batches)
    if drop_last:
        assert len(read) == len(set(read)) and len(read) > 91 - 4 * 2
    else:
        assert sorted(set(read)) == list(range(91)) and len(read) - 91 < 4


def test_the_machines_read_disjoint_shards_but_where_their_shares_meet(tmp_path: Path) -> None:
    storage = make_documents(tmp_path / "docs", shards=16, per_shard=8)
    batches = read_in_lockstep(loaders(storage, 4, local_world_size=2, drop_last=True))
    machine_shards = [{index // 8 for rank in batches[m * 2 : m * 2 + 2] for b in rank for index in b} for m in (0, 1)]
    assert len(machine_shards[0] & machine_shards[1]) <= 1
    assert all(len(shards) <= 9 for shards in machine_shards)


def test_a_window_mixes_its_shards_in_every_batch(tmp_path: Path) -> None:
    storage = make_documents(tmp_path / "docs", shards=12, per_shard=20)
    (loader,) = loaders(storage, 1, shuffle_window=4, local_batch_size=16)
    with loader:
        shards_per_batch = [len({index // 20 for index in ids(batch)}) for batch in loader]
    assert np.mean(shards_per_batch) >= 3


def test_token_windows_resume_bit_for_bit(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path / "tokens", (9, 7, 11, 5, 8, 6))

    def open_loader() -> StatefulDataLoader:
        return StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=3, sequence_length=9, shuffle=True, shuffle_window=2
        )

    assert_resumes_exactly(open_loader, 20, [1, 4, 7])


def test_batches_do_not_depend_on_workers(tmp_path: Path) -> None:
    storage = make_tokens(tmp_path / "tokens", (9, 7, 11, 5, 8, 6))
    options: dict[str, Any] = {"local_batch_size": 3, "sequence_length": 9, "shuffle": True, "shuffle_window": 2}
    with StatefulDataLoader.from_storage(storage, device="cpu", **options) as loader:
        inline = [batch.tolist() for batch in loader]
    with StatefulDataLoader.from_storage(storage, device="cpu", num_workers=2, **options) as loader:
        assert [batch.tolist() for batch in loader] == inline


@pytest.mark.parametrize(
    ("before", "after"),
    [
        ({"world_size": 4, "local_world_size": 2}, {"world_size": 2, "local_world_size": 1}),  # the same machines
        ({"world_size": 2, "local_world_size": 1}, {"world_size": 4, "local_world_size": 2, "local_batch_size": 3}),
        ({"world_size": 4, "local_world_size": 2}, {"world_size": 1, "local_world_size": 1, "local_batch_size": 4}),
        ({"world_size": 2, "local_world_size": 2}, {"world_size": 3, "local_world_size": 1, "local_batch_size": 1}),
        ({"world_size": 4, "local_world_size": 1}, {"world_size": 3, "local_world_size": 1, "local_batch_size": 3}),
    ],
)
def test_an_elastic_resume_skips_and_repeats_nothing(
    tmp_path: Path, before: dict[str, int], after: dict[str, int]
) -> None:
    storage = make_documents(tmp_path / "docs", shards=15, per_shard=8)
    first = loaders(storage, before.pop("world_size"), **before)
    read = flat(read_in_lockstep(first, steps=5))
    state = json.loads(json.dumps(first[0].state_dict()))
    assert all(loader.state_dict() == state for loader in first)
    second = loaders(storage, after.pop("world_size"), **after)
    for loader in second:
        loader.load_state_dict(state)
    read += flat(read_in_lockstep(second))
    assert sorted(read[:120]) == list(range(120)) and set(read[120:]) <= set(range(120))


def test_a_state_of_another_window_is_refused(tmp_path: Path) -> None:
    storage = make_documents(tmp_path / "docs")
    (loader,) = loaders(storage, 1)
    state = loader.state_dict()
    (other,) = loaders(storage, 1, shuffle_window=5)
    with pytest.raises(StateMismatchError, match="shuffle_window=3"):
        other.load_state_dict(state)
    (global_order,) = loaders(storage, 1, shuffle_window=None)
    with pytest.raises(StateMismatchError, match="shuffle_window"):
        global_order.load_state_dict(state)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"shuffle": False}, "needs shuffle=True"),
        ({"shuffle_window": 0}, "shuffle_window"),
        ({"local_world_size": 3}, "must divide world_size"),
    ],
)
def test_bad_arguments_are_refused(tmp_path: Path, options: dict[str, Any], message: str) -> None:
    storage = make_documents(tmp_path / "docs")
    with pytest.raises(ValueError, match=message):
        loaders(storage, 2, **options)


def test_local_world_size_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    storage = make_documents(tmp_path / "docs")
    assert loaders(storage, 4)[0].local_world_size == 2


@pytest.mark.parametrize("mode", [{}, {"document_boundaries": True}, {"pack_documents": True}])
def test_token_modes_read_every_sample_once(tmp_path: Path, mode: dict[str, bool]) -> None:
    storage = make_tokens(tmp_path / "tokens", (9, 7, 11, 5, 8, 6, 10))
    make: Callable[..., StatefulDataLoader] = StatefulDataLoader.from_storage
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 2, "sequence_length": 16, **mode}
    with make(storage, **options) as plain, make(storage, shuffle=True, shuffle_window=2, **options) as windowed:
        assert len(windowed) == len(plain)
        described = windowed.explain(len(windowed))
        read = sorted(str(sample["pieces"][0]) for batch in described for sample in batch["samples"])
        expected = sorted(
            str(sample["pieces"][0]) for batch in plain.explain(len(plain)) for sample in batch["samples"]
        )
        assert read == expected


def test_a_windowed_state_is_explained_from_the_state_alone(tmp_path: Path) -> None:
    storage = make_documents(tmp_path / "docs")
    ranks = loaders(storage, 4, local_world_size=2)
    read_in_lockstep(ranks, steps=3)
    state = json.loads(json.dumps(ranks[0].state_dict()))
    expected = ranks[3].explain(2)
    with loader_from_state(state, rank=3) as reopened:
        assert reopened.explain(2) == expected
