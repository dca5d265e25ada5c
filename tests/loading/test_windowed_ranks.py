"""shuffle_window with real torch.distributed ranks (gloo): machines from LOCAL_WORLD_SIZE, exactly once, resumed."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
import torch.distributed as dist
import torch.multiprocessing as mp

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
from tests.helpers import gather_to_file
from tests.test_distributed import free_port

RECORDS, PER_SHARD = 96, 8


def rank_main(rank: int, world_size: int, port: int, path: str, out: str, steps: int, state: Any) -> None:
    """One rank: its machine from LOCAL_WORLD_SIZE, ``steps`` batches (all if negative) in step with the others."""
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    try:
        storage = DocumentStorage(path, DocumentJsonFormat())
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=2, shuffle=True, seed=5, shuffle_window=3
        ) as loader:
            if state is not None:
                loader.load_state_dict(state)
            ids: list[int] = []
            for step, batch in enumerate(loader, start=1):
                ids += [record["id"] for record in batch]
                dist.barrier()  # every rank yields as many batches, or this hangs
                if step == steps:
                    break
            result = {
                "ids": ids,
                "state": loader.state_dict(),
                "machines": loader.world_size // loader.local_world_size,
            }
        gather_to_file(result, out)
    finally:
        dist.destroy_process_group()


def run_ranks(world_size: int, path: Path, out: Path, steps: int = -1, state: Any = None) -> list[Any]:
    arguments = (world_size, free_port(), str(path), str(out), steps, state)
    mp.start_processes(rank_main, args=arguments, nprocs=world_size, join=True, start_method="spawn")
    result: list[Any] = json.loads(out.read_text())
    return result


@pytest.fixture(scope="module")
def documents(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("windowed-ranks")
    storage = DocumentStorage(path, DocumentJsonFormat())
    with storage.sync_writer() as writer:
        for index in range(RECORDS):
            writer.append(index // PER_SHARD, {"id": index})
    return path


def test_four_ranks_on_two_machines_read_every_record_once_each_machine_its_shards(
    documents: Path, tmp_path: Path
) -> None:
    ranks = run_ranks(4, documents, tmp_path / "out.json")
    assert {rank["machines"] for rank in ranks} == {2}
    read = [index for rank in ranks for index in rank["ids"]]
    assert sorted(read) == list(range(RECORDS))
    machine_shards = [
        {index // PER_SHARD for rank in ranks[m * 2 : m * 2 + 2] for index in rank["ids"]} for m in (0, 1)
    ]
    assert len(machine_shards[0] & machine_shards[1]) <= 1


def test_a_state_of_four_ranks_resumes_on_two_without_loss_or_repeat(documents: Path, tmp_path: Path) -> None:
    first = run_ranks(4, documents, tmp_path / "first.json", steps=5)
    assert all(rank["state"] == first[0]["state"] for rank in first)
    second = run_ranks(2, documents, tmp_path / "second.json", state=first[0]["state"])
    read = [index for rank in first + second for index in rank["ids"]]
    assert sorted(read) == list(range(RECORDS))
