"""Storages served over HTTP(S) by a static server: read through their index object, never written."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import fsspec
import numpy as np
import pytest

from guideloom import ReadOnlyStorageError, StatefulDataLoader, StorageNotFoundError, TokenStorage
from tests.remote.services import Service, StaticFiles


@pytest.fixture
def served(s3_service: Service, tmp_path: Path) -> Iterator[tuple[StaticFiles, list[list[int]]]]:
    """A token storage of 4 shards written to S3 and indexed, its objects copied to a directory (as a sync to
    a web root does) and served by a static server; and what it holds."""
    bucket = s3_service.new_bucket()
    storage = TokenStorage(s3_service.url(bucket), storage_options=s3_service.options, cache_dir=tmp_path / "w")
    written = []
    with storage.sync_writer() as writer:
        for shard in range(4):
            for length in (30, 7, 120):
                tokens = np.arange(length, dtype=np.uint32) + 1000 * shard
                writer.append(shard, tokens)
                written.append(tokens.tolist())
    assert storage.write_index() == 4
    fs = fsspec.filesystem("s3", **s3_service.options)
    fs.get(f"{bucket}/corpus/", str(tmp_path / "site" / "corpus"), recursive=True)
    server = StaticFiles(tmp_path / "site")
    yield server, written
    server.stop()


def test_a_served_storage_reads_back_through_its_index(
    served: tuple[StaticFiles, list[list[int]]], tmp_path: Path
) -> None:
    server, written = served
    storage = TokenStorage(f"{server.url}/corpus", cache_dir=tmp_path / "cache")
    with storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == written


def test_a_loader_streams_a_served_storage_as_a_local_one(
    served: tuple[StaticFiles, list[list[int]]], tmp_path: Path
) -> None:
    server, _ = served

    def batches(storage: TokenStorage) -> list[list[int]]:
        loader = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=2, sequence_length=16, shuffle=True, seed=1
        )
        with loader:
            return [batch.tolist() for batch in loader]

    remote = TokenStorage(f"{server.url}/corpus", cache_dir=tmp_path / "cache")
    assert batches(remote) == batches(TokenStorage(tmp_path / "site" / "corpus", cache_dir=tmp_path / "again"))
    assert [path for method, path, _ in server.requests if method == "GET" and "?" in path] == []


def test_writing_to_a_served_storage_is_refused(served: tuple[StaticFiles, list[list[int]]], tmp_path: Path) -> None:
    server, _ = served
    storage = TokenStorage(f"{server.url}/corpus", cache_dir=tmp_path / "cache")
    with pytest.raises(ReadOnlyStorageError, match="read only"):
        with storage.sync_writer() as writer:
            writer.append(9, [1, 2, 3])
    with pytest.raises(ReadOnlyStorageError, match="read only"):
        storage.write_index()


def test_a_served_directory_without_a_storage_is_named(
    served: tuple[StaticFiles, list[list[int]]], tmp_path: Path
) -> None:
    server, _ = served
    with pytest.raises(StorageNotFoundError):
        TokenStorage(f"{server.url}/elsewhere", cache_dir=tmp_path / "cache").sync_reader()
