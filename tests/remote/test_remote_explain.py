"""``guideloom explain`` of a state whose storage lives on an object store."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._cli import main
from guideloom._loading.explain import next_batch
from guideloom._loading.settings import OrderKind, OrderSettings
from tests.remote.conftest import ServiceStorage


def test_explain_opens_the_url_the_state_names(
    service: ServiceStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache")
    with storage.sync_writer() as writer:
        for shard in (0, 4):
            for document in range(6):
                writer.append(shard, np.arange(3 + 5 * document))
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=2, sequence_length=8, pack_documents=True, shuffle=True
    ) as loader:
        next(iter(loader))
        (tmp_path / "state.json").write_text(json.dumps(loader.state_dict()))
        expected = loader.explain(3)
    options = json.dumps(service.options)
    assert (
        main(["explain", str(tmp_path / "state.json"), "--batches", "3", "--json", "--storage-options", options]) == 0
    )
    assert json.loads(capsys.readouterr().out) == expected


@pytest.mark.parametrize("mode", [{}, {"document_boundaries": True}])
def test_the_next_batch_digest_downloads_no_shard(
    service: ServiceStorage, tmp_path: Path, mode: dict[str, bool]
) -> None:
    with TokenStorage(
        service.url, storage_options=service.options, cache_dir=tmp_path / "writer"
    ).sync_writer() as writer:
        for shard in range(3):
            writer.append(shard, np.arange(100))
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "fresh")
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=2, sequence_length=8, **mode
    ) as loader:
        loader.skip(7)  # the next batch starts in shard 1
        settings = OrderSettings(False, 0, 2, 1, False, kind=OrderKind.PERMUTATION)
        assert len(next_batch(loader._source, settings, loader.epoch, loader.position)) == 16
        assert service.reads("/shards/") == []
        loader._source.describe(np.array([14]), 0)  # describing the sample would have downloaded its shard
        assert len(service.reads("/shards/")) == 1
