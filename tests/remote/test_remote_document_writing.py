"""Record lengths and writers that pick their own shard ids, on each object-store service (conditional creates)."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import DocumentJsonFormat, DocumentStorage
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.rolling_writer import RollingWriter
from tests.remote.conftest import ServiceStorage


def _storage(
    url: str, service: ServiceStorage, cache: Path, compression: str | None = None
) -> DocumentStorage[object, object]:
    return DocumentStorage(
        url,
        DocumentJsonFormat(length=lambda record: len(record["text"])),
        storage_options=service.options,
        cache_dir=cache,
        compression=compression,
    )


def test_two_rolling_writers_claim_distinct_ids_on_an_object_store(service: ServiceStorage, tmp_path: Path) -> None:
    first = _storage(service.url, service, tmp_path / "one").sync_writer(shard_size=1)
    second = _storage(service.url, service, tmp_path / "two").sync_writer(shard_size=1)
    first.append({"text": "a"})  # claims shard 0
    second.append({"text": "bb"})  # starts after the highest committed: claims 1
    first.append({"text": "ccc"})  # 1 is taken: claims 2
    first.close()
    second.close()
    assert (first.committed_shards, second.committed_shards) == ([0, 2], [1])
    with _storage(service.url, service, tmp_path / "reader").sync_reader() as reader:
        assert [record["text"] for record in reader] == ["a", "bb", "ccc"]


def test_a_claim_refused_by_the_conditional_create_moves_on(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service.url, service, tmp_path / "one")
    with storage.sync_writer() as writer:
        writer.append(0, {"text": "taken"})
    stale = RollingWriter(
        storage.commit_target(), storage.create(), RecordEncoder(storage.encode, storage.format.length), 1, lambda: -1
    )
    stale.append({"text": "claims 1"})  # its listing missed shard 0: refused once, then relabelled
    stale.close()
    assert stale.committed_shards == [1]
    with _storage(service.url, service, tmp_path / "reader").sync_reader() as reader:
        assert [record["text"] for record in reader] == ["taken", "claims 1"]
        assert reader.length(1) == len("claims 1")


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_record_lengths_travel_with_remote_shards(
    service: ServiceStorage, tmp_path: Path, compression: str | None
) -> None:
    storage = _storage(service.url, service, tmp_path / "writer", compression)
    with storage.sync_writer() as writer:
        for index in range(20):
            writer.append(index // 8, {"text": "x" * index})
    reopened = _storage(service.url, service, tmp_path / "reader")
    with reopened.sync_reader() as reader:
        assert [reader.length(index) for index in range(len(reader))] == list(range(20))
        assert reader.shard_lengths(2).tolist() == [16, 17, 18, 19]
    assert reopened.verify() == []
