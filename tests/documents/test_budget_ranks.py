"""Batches by budget over real gloo process groups: every rank yields the same number of batches."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist

from guideloom import DocumentStorage, StatefulDataLoader
from tests.documents.records import ids, make_sized_records, record_lengths
from tests.helpers.ranks import run_ranks
from tests.helpers.storages import RawFormat

LENGTHS = record_lengths(61, seed=3)


def read_in_a_rank(rank: int, world_size: int, path: str, state: Any, options: dict[str, Any]) -> dict[str, Any]:
    storage = DocumentStorage(path, RawFormat())
    with StatefulDataLoader.from_storage(
        storage, ids, device="cpu", batch_tokens=90, shuffle=True, seed=2, **options
    ) as loader:
        if state is not None:
            loader.load_state_dict(state)
        batches = []
        for batch in loader:
            batches.append(batch)
            dist.barrier()  # a rank with fewer batches would leave the others waiting here
        return {"batches": batches, "length": len(loader)}


def read_in_ranks(world_size: int, path: Path, out: Path, state: Any = None, **options: Any) -> list[Any]:
    return run_ranks(read_in_a_rank, world_size, str(path), state, options, out=out)


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_yield_equal_batch_counts_and_share_the_epoch(tmp_path: Path, world_size: int) -> None:
    storage = make_sized_records(tmp_path / "records", LENGTHS)
    ranks = read_in_ranks(world_size, tmp_path / "records", tmp_path / "out.json")
    counts = {len(rank["batches"]) for rank in ranks}
    assert len(counts) == 1 and counts == {ranks[0]["length"]}
    steps = zip(*(rank["batches"] for rank in ranks), strict=True)
    read = [i for step in steps for batch in step for i in batch]
    assert sorted(read[: len(LENGTHS)]) == list(range(len(LENGTHS)))  # then padding, from the epoch's start
    with StatefulDataLoader.from_storage(storage, ids, device="cpu", batch_tokens=90, shuffle=True, seed=2) as alone:
        order = [i for batch in alone for i in batch]
    assert read[: len(LENGTHS)] == order  # the same order, the ranks' batches one after another


@pytest.mark.timeout(180)
def test_machines_of_a_windowed_epoch_yield_equal_batch_counts_each_from_its_share(tmp_path: Path) -> None:
    storage_path = tmp_path / "records"
    make_sized_records(storage_path, LENGTHS, shards=6)
    ranks = read_in_ranks(2, storage_path, tmp_path / "out.json", shuffle_window=1, local_world_size=1)
    assert len({len(rank["batches"]) for rank in ranks}) == 1 and len(ranks[0]["batches"]) == ranks[0]["length"]
    shards = [{i * 6 // len(LENGTHS) for batch in rank["batches"] for i in batch} for rank in ranks]
    assert len(shards[0] & shards[1]) <= 1  # each machine its share of the shards (they may meet in one)
    read = [i for step in zip(*(rank["batches"] for rank in ranks), strict=True) for batch in step for i in batch]
    assert sorted(set(read)) == list(range(len(LENGTHS))) and len(read) - len(LENGTHS) < 2
