"""Real torch.distributed process groups (gloo, several processes on this machine)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from guideloom import StatefulDataLoader, TokenStorage
from tests.helpers.ranks import join_group, run_ranks

SEQUENCE_LENGTH = 6
LOCAL_BATCH = 3


def read_in_a_rank(rank: int, world_size: int, storage_path: str, steps: int, state: Any) -> dict[str, Any]:
    """One rank: read `steps` batches (all if negative) with rank/world size from the process group."""
    storage = TokenStorage(storage_path)
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=LOCAL_BATCH, sequence_length=SEQUENCE_LENGTH, shuffle=True, seed=11
    ) as loader:
        assert (loader.rank, loader.world_size) == (rank, world_size)
        if state is not None:
            loader.load_state_dict(state)
        windows: list[list[int]] = []
        for step, batch in enumerate(loader, start=1):
            windows += [row[0] for row in batch.tolist()]  # a window's first token identifies it here
            dist.barrier()  # every rank yields the same number of batches, or this hangs
            if step == steps:
                break
        return {"windows": windows, "state": loader.state_dict(), "batches": len(loader)}


def read_in_ranks(world_size: int, storage: Path, out: Path, steps: int = -1, state: Any = None) -> list[Any]:
    return run_ranks(read_in_a_rank, world_size, str(storage), steps, state, out=out)


@pytest.fixture(scope="module")
def storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Windows whose first token is the window's number, so a window is recognised by it."""
    path = tmp_path_factory.mktemp("distributed")
    stream = np.repeat(np.arange(101, dtype=np.uint32), SEQUENCE_LENGTH)
    storage = TokenStorage(path)
    with storage.sync_writer() as writer:
        for shard, part in enumerate(np.array_split(stream, 4)):
            writer.append(shard, part)
    return path


@pytest.mark.timeout(180)
@pytest.mark.parametrize("world_size", [2, 3])
def test_ranks_split_the_epoch_disjointly(storage: Path, tmp_path: Path, world_size: int) -> None:
    ranks = read_in_ranks(world_size, storage, tmp_path / "out.json")
    windows = [rank["windows"] for rank in ranks]
    assert len({len(w) for w in windows}) == 1, "ranks yielded different numbers of samples"
    assert all(rank["state"] == ranks[0]["state"] for rank in ranks), "state dicts differ between ranks"
    assert len({rank["batches"] for rank in ranks}) == 1
    everything = [window for rank_windows in windows for window in rank_windows]
    assert set(everything) == set(range(101))
    padding = -101 % world_size
    assert len(everything) == 101 + padding


@pytest.mark.timeout(240)
def test_resume_with_another_world_size_loses_and_repeats_nothing(storage: Path, tmp_path: Path) -> None:
    first = read_in_ranks(2, storage, tmp_path / "first.json", steps=5)
    state = first[0]["state"]
    assert state["position"] == 5 * 2 * LOCAL_BATCH
    second = read_in_ranks(3, storage, tmp_path / "second.json", state=state)
    before = [w for rank in first for w in rank["windows"]]
    after = [w for rank in second for w in rank["windows"]]
    assert len(set(before)) == len(before) == 30
    assert len(set(after) - set(before)) == 101 - 30, "a sample was skipped or seen twice across the restart"
    assert len(after) == 71 + (-71 % 3), "only the wrap-around padding of the last batch may repeat"


def loader_before_group(rank: int, world_size: int, storage_path: str) -> str:
    """One rank that builds its loader before the process group exists, with no RANK in its environment."""
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        os.environ.pop(name, None)
    loader = StatefulDataLoader.from_storage(
        TokenStorage(storage_path), device="cpu", local_batch_size=LOCAL_BATCH, sequence_length=SEQUENCE_LENGTH
    )
    join_group(rank, world_size)
    with loader:
        try:
            next(iter(loader))
            return "no error"
        except ValueError as error:
            return str(error)


@pytest.mark.timeout(180)
def test_a_loader_whose_ranks_the_process_group_contradicts_refuses_to_iterate(storage: Path, tmp_path: Path) -> None:
    messages = run_ranks(loader_before_group, 2, str(storage), out=tmp_path / "out.json", in_group=False)
    assert messages == [
        "this loader took rank 0 of 1 from the environment when it was created, but the initialised process "
        f"group says rank {rank} of 2: build the loader after init_process_group, or pass rank= and world_size="
        for rank in (0, 1)
    ]
