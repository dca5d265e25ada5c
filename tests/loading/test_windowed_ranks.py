"""shuffle_window with real torch.distributed ranks (gloo): machines from LOCAL_WORLD_SIZE, exactly once, resumed.

One process group of four ranks (two machines of two) runs every check, so the ranks start once: a whole epoch,
five steps and their state, that state resumed by two of the ranks as a world of two, and a windowed mixture.
"""

from __future__ import annotations

import os
from typing import Any

import pytest
import torch.distributed as dist

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader
from guideloom._mixture.mixture import Mixture
from tests.helpers.ranks import run_ranks

RECORDS, PER_SHARD = 96, 8
MIXED = 2000  # the ids of the mixture's second component start here
WORLD_SIZE = 4


def open_loader(storage: Any, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=2, shuffle=True, seed=5, shuffle_window=3, **options
    )


def read(loader: StatefulDataLoader, steps: int = -1) -> list[int]:
    """The loader's record ids over ``steps`` batches (the rest of the epoch if negative), the ranks in step."""
    ids: list[int] = []
    for step, batch in enumerate(loader, start=1):
        ids += [record["id"] for record in batch]
        dist.barrier()  # every rank yields as many batches, or this hangs
        if step == steps:
            break
    return ids


def check_in_a_rank(rank: int, world_size: int, path: str) -> dict[str, Any]:
    """One rank: its machine from LOCAL_WORLD_SIZE, each check in turn in step with the others."""
    os.environ["LOCAL_WORLD_SIZE"] = "2"
    storage = DocumentStorage(path + "/a", DocumentJsonFormat())
    with open_loader(storage) as loader:
        result: dict[str, Any] = {"epoch": read(loader), "machines": loader.world_size // loader.local_world_size}
    with open_loader(storage) as loader:
        result["first"], result["state"] = read(loader, 5), loader.state_dict()
    result["second"] = []
    if rank < 2:  # the state resumed by a world of two ranks (one machine), stepping apart from the others
        with open_loader(storage, rank=rank, world_size=2) as resumed:
            resumed.load_state_dict(result["state"])
            result["second"] = [[record["id"] for record in batch] for batch in resumed]
    dist.barrier()
    mixture = Mixture({"a": storage, "b": DocumentStorage(path + "/b", DocumentJsonFormat())}, {"a": 1, "b": 1})
    with open_loader(mixture, drop_last=True) as loader:
        result["mixture"] = read(loader) + read(loader)  # two epochs: a pass of "a" is about one
    return result


@pytest.fixture(scope="module")
def ranks(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """What each of the four ranks read and recorded."""
    path = tmp_path_factory.mktemp("windowed-ranks")
    for component, first in (("a", 0), ("b", MIXED)):
        with DocumentStorage(path / component, DocumentJsonFormat()).sync_writer() as writer:
            for index in range(RECORDS):
                writer.append(index // PER_SHARD, {"id": first + index})
    return run_ranks(check_in_a_rank, WORLD_SIZE, str(path), out=path / "out.json")


def machine_shards(ranks: list[dict[str, Any]], key: str) -> list[set[int]]:
    return [{index // PER_SHARD for rank in ranks[m * 2 : m * 2 + 2] for index in rank[key]} for m in (0, 1)]


def test_four_ranks_on_two_machines_read_every_record_once_each_machine_its_shards(
    ranks: list[dict[str, Any]],
) -> None:
    assert {rank["machines"] for rank in ranks} == {2}
    assert sorted(index for rank in ranks for index in rank["epoch"]) == list(range(RECORDS))
    shards = machine_shards(ranks, "epoch")
    assert len(shards[0] & shards[1]) <= 1


def test_a_state_of_four_ranks_resumes_on_two_without_loss_or_repeat(ranks: list[dict[str, Any]]) -> None:
    assert all(rank["state"] == ranks[0]["state"] for rank in ranks)
    assert len(ranks[0]["second"]) == len(ranks[1]["second"]) > 0
    read = [index for rank in ranks for index in rank["first"]]
    read += [index for rank in ranks[:2] for batch in rank["second"] for index in batch]
    assert sorted(read) == list(range(RECORDS))


def test_a_windowed_mixture_reads_each_pass_of_a_component_once_each_machine_its_share(
    ranks: list[dict[str, Any]],
) -> None:
    assert len({len(rank["mixture"]) for rank in ranks}) == 1
    machines = [in_machine_order(ranks[m * 2 : m * 2 + 2]) for m in (0, 1)]
    first_pass = [[index for index in machine if index < MIXED][: RECORDS // 2] for machine in machines]
    assert sorted(first_pass[0] + first_pass[1]) == list(range(RECORDS))
    shards = [{index // PER_SHARD for index in share} for share in first_pass]
    assert len(shards[0] & shards[1]) <= 1


def in_machine_order(ranks: list[dict[str, Any]]) -> list[int]:
    """A machine's mixture records in the order it reads them: batch by batch (two records each), rank by rank."""
    batches = [[rank["mixture"][start : start + 2] for start in range(0, len(rank["mixture"]), 2)] for rank in ranks]
    return [index for step in zip(*batches, strict=True) for batch in step for index in batch]
