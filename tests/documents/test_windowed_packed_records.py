"""Packed records with shuffle_window: rows packed shard by shard, each machine reading its own share of them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentStorage, Mixture, StatefulDataLoader
from tests.documents.records import identifier, make_sized_records, record_lengths
from tests.documents.test_windowed_budget import flat, lockstep, state_of

LENGTHS = record_lengths(300, seed=8)
SHARDS = 10
ROW = 128


def shard_of(record: int) -> int:
    return record * SHARDS // len(LENGTHS)  # (how make_sized_records spreads the records)


def rows_of_ids(rows: list[list[bytes]]) -> list[list[int]]:
    return [[identifier(data) for data in row] for row in rows]


@pytest.fixture
def storage(tmp_path: Path) -> DocumentStorage[Any, Any]:
    return make_sized_records(tmp_path / "records", LENGTHS, shards=SHARDS)


def loaders(storage: Any, world_size: int, local_world_size: int = 1, **options: Any) -> list[StatefulDataLoader]:
    settings = {"local_batch_size": 2, "shuffle": True, "seed": 6, "shuffle_window": 2, **options}
    return [
        StatefulDataLoader.from_storage(
            storage,
            rows_of_ids,
            device="cpu",
            pack_documents=True,
            sequence_length=ROW,
            rank=rank,
            world_size=world_size,
            local_world_size=local_world_size,
            **settings,
        )
        for rank in range(world_size)
    ]


def records(batches: list[list[Any]]) -> list[int]:
    """The records read, row after row, step by step, rank after rank."""
    return [record for row in flat(batches) for record in row]


@pytest.mark.parametrize(("world_size", "local_world_size"), [(1, 1), (2, 1), (4, 2)])
def test_every_record_once_in_rows_of_one_shard_each(
    storage: DocumentStorage[Any, Any], world_size: int, local_world_size: int
) -> None:
    ranks = loaders(storage, world_size, local_world_size, drop_last=True)
    batches = lockstep(ranks)
    assert {len(rank) for rank in batches} == {len(ranks[0])}
    rows = flat(batches)
    read = records(batches)
    assert len(read) == len(set(read)) and len(rows) > 0
    assert all(len({shard_of(i) for i in row}) == 1 and sum(LENGTHS[i] for i in row) <= ROW for row in rows)
    (whole,) = loaders(storage, 1, shuffle=True, drop_last=False)
    assert sorted(record for batch in whole for row in batch for record in row) == list(range(len(LENGTHS)))


def test_each_machine_reads_its_own_share_a_window_at_a_time(storage: DocumentStorage[Any, Any]) -> None:
    batches = lockstep(loaders(storage, 4, local_world_size=2, drop_last=True))
    shares = [records(batches[m * 2 : m * 2 + 2]) for m in (0, 1)]
    shards = [{shard_of(i) for i in share} for share in shares]
    assert len(shards[0] & shards[1]) <= 2 and len(shards[0] | shards[1]) == SHARDS
    for share in shares:
        assert all(len({shard_of(i) for i in share[at : at + 20]}) <= 3 for at in range(0, len(share) - 20, 20))


def test_resume_continues_bit_for_bit_and_elastically_exactly_once(storage: DocumentStorage[Any, Any]) -> None:
    expected = lockstep(loaders(storage, 4, local_world_size=2))
    first = loaders(storage, 4, local_world_size=2)
    before = lockstep(first, 3)
    state = state_of(first)
    resumed = loaders(storage, 4, local_world_size=2)
    for loader in resumed:
        loader.load_state_dict(state)
    assert [b + a for b, a in zip(before, lockstep(resumed), strict=True)] == expected
    elastic = loaders(storage, 1, local_batch_size=3)
    elastic[0].load_state_dict(state)
    read = records(before) + records(lockstep(elastic))
    assert sorted(read) == list(range(len(LENGTHS)))  # (one rank: no padding)


def test_the_rows_do_not_depend_on_worker_processes(storage: DocumentStorage[Any, Any]) -> None:
    in_main = lockstep(loaders(storage, 2))
    assert lockstep(loaders(storage, 2, num_workers=2)) == in_main


def test_a_mixture_of_packed_record_storages_in_machine_shares(tmp_path: Path) -> None:
    a = make_sized_records(tmp_path / "a", LENGTHS[:150], shards=5)
    b = make_sized_records(tmp_path / "b", LENGTHS[150:], shards=5, first_id=1000)
    mixture = Mixture({"a": a, "b": b}, {"a": 1, "b": 1}, samples_per_epoch=40, block_size=4)
    batches = lockstep(loaders(mixture, 2))
    rows = flat(batches)
    assert len(rows) == 40 and all(all(i < 1000 for i in row) or all(i >= 1000 for i in row) for row in rows)
