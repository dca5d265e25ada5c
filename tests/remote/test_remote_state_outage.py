"""On an object store, a state is taken from the listing's facts: during an outage, downloading nothing."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from guideloom import StatefulDataLoader, TokenStorage
from tests.remote.conftest import ServiceStorage

TOKENS = 20_000  # per shard: 80 KB, so a 300 KB cache holds a few shards, not the 40


def test_a_state_is_taken_during_an_outage_and_downloads_nothing(service: ServiceStorage, tmp_path: Path) -> None:
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "w").sync_writer() as writer:
        for shard in range(40):
            writer.append(shard, np.arange(shard * TOKENS, (shard + 1) * TOKENS, dtype=np.uint32))
    cache = tmp_path / "cache"
    remote = TokenStorage(service.url, storage_options=service.options, cache_dir=cache, cache_limit_bytes=300_000)
    with StatefulDataLoader.from_storage(remote, device="cpu", local_batch_size=4, sequence_length=16) as loader:
        at_start = loader.state_dict()
        assert service.reads("/shards/") == []  # the state came from the listing
        first = next(iter(loader))
        with service.outage():
            state = loader.state_dict()  # the store is unreachable: nothing may be needed from it
        assert len(list(cache.rglob("*.shard"))) <= 4
    assert at_start["source"] == state["source"]
    assert first[0].tolist() == list(range(16))
    with StatefulDataLoader.from_storage(remote, device="cpu", local_batch_size=4, sequence_length=16) as fresh:
        fresh.load_state_dict(state)
        assert next(iter(fresh))[0].tolist() == list(range(64, 80))
