"""torch.distributed.checkpoint: the loader is a Stateful; dcp.save/dcp.load resume exactly with 1 and 2 gloo ranks."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.stateful import Stateful

from guideloom import TokenStorage
from tests.helpers.batches import comparable, take
from tests.helpers.loaders import framework_loader

SAVED_AT = 5  # batches before the checkpoint; 10 more after it, across the end of the epoch


def test_the_loader_is_a_dcp_stateful(tokens: TokenStorage) -> None:
    with framework_loader(tokens) as loader:
        assert isinstance(loader, Stateful)


@pytest.mark.filterwarnings("ignore:torch.distributed is disabled")  # it says: one process, as intended
def test_dcp_save_and_load_resume_exactly_in_one_process(tokens: TokenStorage, tmp_path: Path) -> None:
    with framework_loader(tokens) as loader:  # 15 batches an epoch
        take(loader, SAVED_AT)
        dcp.save({"loader": loader}, checkpoint_id=str(tmp_path / "checkpoint"), no_dist=True)
        after = take(loader, 2 * SAVED_AT, comparable)
    with framework_loader(tokens) as resumed:
        dcp.load({"loader": resumed}, checkpoint_id=str(tmp_path / "checkpoint"), no_dist=True)
        assert take(resumed, 2 * SAVED_AT, comparable) == after


RANK_SCRIPT = """
import json
import sys

import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from guideloom import StatefulDataLoader, TokenStorage

storage, rendezvous, checkpoint, output, rank = sys.argv[1:6]
dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=int(rank), world_size=2)


def make_loader():
    return StatefulDataLoader.from_storage(
        TokenStorage(storage), device="cpu", local_batch_size=2, sequence_length=17, shuffle=True, seed=3
    )


def take(loader, count):
    batches = []
    while len(batches) < count:  # across the end of an epoch
        batches += [batch.tolist() for _, batch in zip(range(count - len(batches)), loader)]
    return batches


with make_loader() as loader:
    before = take(loader, 5)
    dcp.save({"loader": loader}, checkpoint_id=checkpoint)
    after = take(loader, 10)
with make_loader() as resumed:
    dcp.load({"loader": resumed}, checkpoint_id=checkpoint)
    continued = take(resumed, 10)
with open(output, "w") as file:
    json.dump({"before": before, "after": after, "continued": continued, "rank": resumed.rank}, file)
dist.destroy_process_group()
"""


def test_dcp_save_and_load_resume_exactly_with_two_gloo_ranks(tokens: TokenStorage, tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(textwrap.dedent(RANK_SCRIPT))
    environment = {key: value for key, value in os.environ.items() if key not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    processes = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(tokens.path),
                str(tmp_path / "rendezvous"),
                str(tmp_path / "checkpoint"),
                str(tmp_path / f"rank{rank}.json"),
                str(rank),
            ],
            env=environment,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for rank in range(2)
    ]
    outputs = [process.communicate(timeout=120)[0] for process in processes]
    assert [process.returncode for process in processes] == [0, 0], "\n".join(outputs)[-4000:]
    ranks = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]

    assert [result["rank"] for result in ranks] == [0, 1]
    for result in ranks:
        assert result["continued"] == result["after"]
    windows = [{tuple(row) for batch in result["before"] for row in batch} for result in ranks]
    assert len(windows[0]) == len(windows[1]) == 5 * 2 and not windows[0] & windows[1]
