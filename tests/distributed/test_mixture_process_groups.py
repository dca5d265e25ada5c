"""A mixture read by real torch.distributed process groups (gloo), resumed with another world size."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch.distributed as dist

from guideloom import Mixture, StatefulDataLoader, TokenStorage
from tests.helpers.ranks import run_ranks

S = 4
WINDOWS = {"web": 40, "code": 9, "math": 5}


def mixture_of(root: str) -> Mixture:
    storages = {name: TokenStorage(Path(root) / name) for name in WINDOWS}
    return Mixture(storages, {"web": 0.5, "code": 0.3, "math": 0.2}, samples_per_epoch=61, block_size=10)


def read_in_a_rank(rank: int, world_size: int, root: str, steps: int, state: Any) -> dict[str, Any]:
    """One rank: read ``steps`` batches (the rest of the epoch if negative), and the state after."""
    with StatefulDataLoader.from_storage(
        mixture_of(root), device="cpu", local_batch_size=2, sequence_length=S, shuffle=True, seed=5
    ) as loader:
        if state is not None:
            loader.load_state_dict(state)
        read: list[list[int]] = []
        for step, batch in enumerate(loader, start=1):
            read.append([row[0] for row in batch.tolist()])  # a window's first token identifies it
            dist.barrier()  # every rank yields the same number of batches, or this hangs
            if step == steps:
                break
        return {"read": read, "state": loader.state_dict()}


def read_in_ranks(world_size: int, root: Path, out: Path, steps: int = -1, state: Any = None) -> tuple[list[int], Any]:
    """The windows all ranks read, in the global order (batch by batch, rank by rank), and the state after."""
    ranks = run_ranks(read_in_a_rank, world_size, str(root), steps, state, out=out)
    assert all(rank["state"] == ranks[0]["state"] for rank in ranks), "state dicts differ between ranks"
    read = [window for batches in zip(*(rank["read"] for rank in ranks), strict=True) for b in batches for window in b]
    return read, ranks[0]["state"]


@pytest.mark.timeout(240)
def test_a_mixture_resumed_by_another_world_size_loses_and_repeats_nothing(tmp_path: Path) -> None:
    for k, (name, count) in enumerate(WINDOWS.items()):
        with TokenStorage(tmp_path / name).sync_writer() as writer:
            writer.append(0, 1000 * k + np.arange(count * S, dtype=np.uint32))
    before, state = read_in_ranks(2, tmp_path, tmp_path / "first.json", steps=4)
    after, _ = read_in_ranks(3, tmp_path, tmp_path / "second.json", state=state)
    with StatefulDataLoader.from_storage(
        mixture_of(str(tmp_path)), device="cpu", local_batch_size=61, sequence_length=S, shuffle=True, seed=5
    ) as single:
        whole = [row[0] for row in next(iter(single)).tolist()]
    assert len(before) == 16
    assert before + after[: 61 - 16] == whole
    assert after[61 - 16 :] == whole[: -45 % 3]  # only the wrap-around padding of the last batch repeats
