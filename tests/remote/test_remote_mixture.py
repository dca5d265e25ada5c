"""A mixture with a component on an S3 API server yields exactly the batches of the same data on disk."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import Mixture, StatefulDataLoader, TokenStorage
from tests.remote.conftest import ServiceStorage


def fill(storage: TokenStorage, first: int, shards: range) -> TokenStorage:
    with storage.sync_writer() as writer:
        for shard in shards:
            writer.append(shard, first + 100 * shard + np.arange(60, dtype=np.uint32))
    return storage


def batches(web: TokenStorage, code: TokenStorage, state: Any = None, count: int | None = None) -> tuple[list, Any]:
    mixture = Mixture({"web": web, "code": code}, {"web": 2, "code": 1}, block_size=6)
    with StatefulDataLoader.from_storage(
        mixture, device="cpu", local_batch_size=3, sequence_length=5, shuffle=True, seed=4
    ) as loader:
        if state is not None:
            loader.load_state_dict(state)
        read = []
        for batch in loader:
            read.append(batch.tolist())
            if len(read) == count:
                break
        return read, json.loads(json.dumps(loader.state_dict()))


def test_a_remote_component_reads_and_resumes_as_a_local_one(service: ServiceStorage, tmp_path: Path) -> None:
    code = fill(TokenStorage(tmp_path / "code"), 10_000, range(2))
    local = fill(TokenStorage(tmp_path / "web"), 0, range(3))
    remote = fill(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache"), 0, range(3))
    whole, _ = batches(local, code)
    assert batches(remote, code)[0] == whole
    first, state = batches(remote, code, count=4)
    rest, _ = batches(remote, code, state=state)
    assert first + rest == whole
