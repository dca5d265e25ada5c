"""Batches by budget over real gloo process groups: every rank yields the same number of batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from guideloom import DocumentStorage, StatefulDataLoader
from tests.documents.records import ids, make_sized_records, record_lengths
from tests.helpers.processes import free_port, gather_to_file
from tests.helpers.storages import RawFormat

LENGTHS = record_lengths(61, seed=3)


def rank_main(rank: int, world_size: int, port: int, path: str, out: str, state: Any, options: dict[str, Any]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
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
            gather_to_file({"batches": batches, "length": len(loader)}, out)
    finally:
        dist.destroy_process_group()


def run_ranks(world_size: int, path: Path, out: Path, state: Any = None, **options: Any) -> list[Any]:
    mp.start_processes(
        rank_main,
        args=(world_size, free_port(), str(path), str(out), state, options),
        nprocs=world_size,
        join=True,
        start_method="spawn",
    )
    result: list[Any] = json.loads(out.read_text())
    return result


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_yield_equal_batch_counts_and_share_the_epoch(tmp_path: Path, world_size: int) -> None:
    storage = make_sized_records(tmp_path / "records", LENGTHS)
    ranks = run_ranks(world_size, tmp_path / "records", tmp_path / "out.json")
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
    ranks = run_ranks(2, storage_path, tmp_path / "out.json", shuffle_window=1, local_world_size=1)
    assert len({len(rank["batches"]) for rank in ranks}) == 1 and len(ranks[0]["batches"]) == ranks[0]["length"]
    shards = [{i * 6 // len(LENGTHS) for batch in rank["batches"] for i in batch} for rank in ranks]
    assert len(shards[0] & shards[1]) <= 1  # each machine its share of the shards (they may meet in one)
    read = [i for step in zip(*(rank["batches"] for rank in ranks), strict=True) for batch in step for i in batch]
    assert sorted(set(read)) == list(range(len(LENGTHS))) and len(read) - len(LENGTHS) < 2
