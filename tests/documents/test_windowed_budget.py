"""batch_tokens with shuffle_window: each machine's ranks batch their own share by budget, exactly once, resumable."""

from __future__ import annotations

import itertools
import json
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentStorage, Mixture, StatefulDataLoader
from guideloom._loading.reopen import loader_from_state
from tests.documents.records import ids, make_sized_records, record_lengths

LENGTHS = record_lengths(241, seed=5)
SHARDS = 12
BUDGET = 100


def shard_of(record: int) -> int:
    return record * SHARDS // len(LENGTHS)  # (how make_sized_records spreads the records)


@pytest.fixture
def storage(tmp_path: Path) -> DocumentStorage[Any, Any]:
    return make_sized_records(tmp_path / "records", LENGTHS, shards=SHARDS)


def loaders(storage: Any, world_size: int, local_world_size: int = 1, **options: Any) -> list[StatefulDataLoader]:
    settings = {"batch_tokens": BUDGET, "shuffle": True, "seed": 4, "shuffle_window": 3, **options}
    return [
        StatefulDataLoader.from_storage(
            storage, ids, device="cpu", rank=rank, world_size=world_size, local_world_size=local_world_size, **settings
        )
        for rank in range(world_size)
    ]


def lockstep(ranks: list[StatefulDataLoader], steps: int | None = None) -> list[list[Any]]:
    """Each rank's batches, the ranks stepping together; strict: a rank with another count fails here."""
    batches: list[list[Any]] = [[] for _ in ranks]
    for together in itertools.islice(zip(*(iter(loader) for loader in ranks), strict=True), steps):
        for rank, batch in enumerate(together):
            batches[rank].append(batch)
    return batches


def flat(batches: list[list[Any]]) -> list[Any]:
    """What the ranks read, step by step, rank after rank."""
    return [record for step in zip(*batches, strict=True) for batch in step for record in batch]


def state_of(ranks: list[StatefulDataLoader]) -> dict[str, Any]:
    states = [json.loads(json.dumps(loader.state_dict())) for loader in ranks]
    assert all(state == states[0] for state in states)
    state: dict[str, Any] = states[0]
    return state


@pytest.mark.parametrize(("world_size", "local_world_size"), [(1, 1), (2, 1), (4, 2), (3, 1), (4, 1)])
def test_every_record_once_within_the_budget_and_as_many_batches_on_every_rank(
    storage: DocumentStorage[Any, Any], world_size: int, local_world_size: int
) -> None:
    ranks = loaders(storage, world_size, local_world_size)
    batches = lockstep(ranks)
    assert {len(rank) for rank in batches} == {len(ranks[0])}
    read = flat(batches)
    assert sorted(set(read)) == list(range(len(LENGTHS))) and len(read) - len(LENGTHS) < world_size
    assert all(len(batch) == 1 or sum(LENGTHS[i] for i in batch) <= BUDGET for rank in batches for batch in rank)


@pytest.mark.parametrize(("world_size", "local_world_size"), [(1, 1), (4, 2), (3, 1)])
def test_drop_last_leaves_out_the_last_step_and_repeats_nothing(
    storage: DocumentStorage[Any, Any], world_size: int, local_world_size: int
) -> None:
    every = flat(lockstep(loaders(storage, world_size, local_world_size)))
    ranks = loaders(storage, world_size, local_world_size, drop_last=True)
    batches = lockstep(ranks)
    assert {len(rank) for rank in batches} == {len(ranks[0])}
    read = flat(batches)
    assert len(read) == len(set(read)) and read == every[: len(read)] and len(read) < len(LENGTHS)


def test_a_state_reopens_the_loader_of_its_rank(storage: DocumentStorage[Any, Any]) -> None:
    ranks = loaders(storage, 4, local_world_size=2)
    lockstep(ranks, 5)
    state = json.loads(json.dumps(ranks[1].state_dict()))
    with loader_from_state(state) as reopened:
        assert reopened.explain(3, rank=1) == ranks[1].explain(3)
        assert (reopened.batch_tokens, reopened.shuffle_window, reopened.local_world_size) == (BUDGET, 3, 2)


def test_each_machine_reads_its_own_share_of_the_shards(storage: DocumentStorage[Any, Any]) -> None:
    batches = lockstep(loaders(storage, 4, local_world_size=2))
    shards = [{shard_of(i) for rank in batches[m * 2 : m * 2 + 2] for batch in rank for i in batch} for m in (0, 1)]
    assert len(shards[0] & shards[1]) <= 2 and len(shards[0] | shards[1]) == SHARDS  # they meet at most at the ends


def test_one_machine_reads_a_window_of_shards_at_a_time(storage: DocumentStorage[Any, Any]) -> None:
    (loader,) = loaders(storage, 1, shuffle_window=2)
    read = [record for batch in loader for record in batch]
    spans = [len({shard_of(i) for i in read[start : start + 25]}) for start in range(0, len(read) - 25, 25)]
    assert max(spans) <= 4  # a window of 2 shards, and the next one starting


@pytest.mark.parametrize("local_world_size", [1, 2])
def test_resume_continues_bit_for_bit(storage: DocumentStorage[Any, Any], local_world_size: int) -> None:
    expected = lockstep(loaders(storage, 4, local_world_size))
    first = loaders(storage, 4, local_world_size)
    before = lockstep(first, 9)
    resumed = loaders(storage, 4, local_world_size)
    for loader in resumed:
        loader.load_state_dict(state_of(first))
    after = lockstep(resumed)
    assert [b + a for b, a in zip(before, after, strict=True)] == expected


def described(loader: StatefulDataLoader, batches: int) -> list[list[int]]:
    """The records of the loader's next batches, as ``explain`` tells them without reading."""
    return [[sample["pieces"][0]["index"] for sample in batch["samples"]] for batch in loader.explain(batches)]


def test_elastic_resume_across_world_sizes_skips_and_repeats_nothing(storage: DocumentStorage[Any, Any]) -> None:
    ranks, predicted = loaders(storage, 1), None
    read: list[int] = []
    for world_size, local_world_size, budget in [(2, 1, 100), (4, 2, 140), (3, 1, 70), (6, 2, 100), (1, 1, 90)]:
        batches = lockstep(ranks, 4)
        assert predicted is None or [rank[:3] for rank in batches] == predicted
        read += flat(batches)
        state = state_of(ranks)
        ranks = loaders(storage, world_size, local_world_size, batch_tokens=budget)
        for loader in ranks:
            loader.load_state_dict(state)
        predicted = [described(loader, 3) for loader in ranks]
    in_epoch = [[b for b in loader.explain(len(LENGTHS)) if b["epoch"] == 0] for loader in ranks]
    rest = lockstep(ranks)
    assert rest == [[[s["pieces"][0]["index"] for s in b["samples"]] for b in rank] for rank in in_epoch]
    read += flat(rest)
    assert sorted(set(read)) == list(range(len(LENGTHS))) and len(read) - len(LENGTHS) < 6
    assert all(len(batch) == 1 or sum(LENGTHS[i] for i in batch) <= 90 for rank in rest for batch in rank)


def test_explain_and_skip_agree_with_iteration(storage: DocumentStorage[Any, Any]) -> None:
    expected = lockstep(loaders(storage, 4, local_world_size=2))
    ranks = loaders(storage, 4, local_world_size=2)
    for rank, loader in enumerate(ranks):
        assert described(loader, len(loader) + 2)[: len(loader)] == expected[rank]  # (on into the next epoch)
        loader.skip(5)
    assert lockstep(ranks) == [rank[5:] for rank in expected]


def test_the_batches_do_not_depend_on_worker_processes(storage: DocumentStorage[Any, Any]) -> None:
    in_main = lockstep(loaders(storage, 2))
    assert lockstep(loaders(storage, 2, num_workers=2)) == in_main


def test_a_mixture_of_document_storages_by_budget_and_window(tmp_path: Path) -> None:
    a = make_sized_records(tmp_path / "a", LENGTHS[:120], shards=6)
    b = make_sized_records(tmp_path / "b", LENGTHS[120:], shards=5, first_id=1000)
    mixture = Mixture({"a": a, "b": b}, {"a": 1, "b": 1}, samples_per_epoch=200, block_size=8)
    length = {**dict(enumerate(LENGTHS[:120])), **{1000 + i: n for i, n in enumerate(LENGTHS[120:])}}
    ranks = loaders(mixture, 2)
    batches = lockstep(ranks)
    assert {len(rank) for rank in batches} == {len(ranks[0])} and len(flat(batches)) >= 200
    assert all(len(batch) == 1 or sum(length[i] for i in batch) <= BUDGET for rank in batches for batch in rank)
    first = loaders(mixture, 2)
    before = lockstep(first, 6)
    resumed = loaders(mixture, 2)
    for loader in resumed:
        loader.load_state_dict(state_of(first))
    assert [b + a for b, a in zip(before, lockstep(resumed), strict=True)] == batches
