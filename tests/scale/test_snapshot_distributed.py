"""One snapshot per job: with torch.distributed initialised, rank 0 lists the storage and the others use its list.

Real gloo process groups of two ranks on this machine; a writer commits a shard between the ranks'
openings, and every rank must still read the same shards.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import StatefulDataLoader, StorageNotFoundError, TokenStorage
from tests.helpers.ranks import start_ranks


def wait_for(path: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{path} never appeared")
        time.sleep(0.02)


def open_in_a_rank(rank: int, world_size: int, paths: list[str], out: str) -> None:
    outcome: dict[str, Any] = {}
    folder = Path(out)
    if rank == 0:
        (folder / "opening").touch()
    else:
        wait_for(folder / "committed")  # rank 0 has listed; a shard was committed since
    try:
        with StatefulDataLoader.from_storage(
            TokenStorage(paths[rank]), device="cpu", local_batch_size=2, sequence_length=4, shuffle=True
        ) as loader:
            state = loader.state_dict()
            outcome = {
                "batches": len(loader),
                "shards": state["source"]["shards"],
                "first": next(iter(loader)).tolist(),
            }
    except StorageNotFoundError as error:
        outcome = {"error": str(error)}
    (folder / f"rank{rank}.json").write_text(json.dumps(outcome))


def write_shards(path: Path, shards: Iterable[int]) -> None:
    with TokenStorage(path, "uint32").sync_writer() as writer:
        for shard in shards:
            writer.append(shard, np.arange(shard * 40, shard * 40 + 40))


def launch(paths: list[Path], out: Path, between: Any = None) -> list[dict[str, Any]]:
    context = start_ranks(open_in_a_rank, 2, [str(path) for path in paths], str(out))
    wait_for(out / "opening")
    time.sleep(2)  # rank 0 lists its few shards meanwhile, then waits for rank 1 in the broadcast
    if between is not None:
        between()
    (out / "committed").touch()
    while not context.join():
        pass
    return [json.loads((out / f"rank{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.timeout(240)
def test_ranks_read_rank_0_s_snapshot_though_a_shard_was_committed_between_their_openings(tmp_path: Path) -> None:
    storage = tmp_path / "tokens"
    write_shards(storage, range(4))
    ranks = launch([storage, storage], tmp_path, between=lambda: write_shards(storage, range(4, 5)))
    assert ranks[0]["shards"] == ranks[1]["shards"] == "0-3"
    assert ranks[0]["batches"] == ranks[1]["batches"] == 10  # 160 tokens: 40 windows, 4 per global batch
    assert ranks[0]["first"] != ranks[1]["first"]  # each rank its own slice of one order


@pytest.mark.timeout(240)
def test_a_rank_that_cannot_see_a_shard_of_the_snapshot_names_it(tmp_path: Path) -> None:
    write_shards(tmp_path / "full", range(4))
    write_shards(tmp_path / "partial", [0, 1, 3])  # another machine's copy, which lacks shard 2
    ranks = launch([tmp_path / "full", tmp_path / "partial"], tmp_path)
    assert ranks[0]["shards"] == "0-3"
    assert "shard 2" in ranks[1]["error"]
