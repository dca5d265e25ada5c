"""Storages on each object-store service: writes, reads, the one-listing open, the cache and the commit rules."""

from __future__ import annotations

import pickle
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import guideloom._remote.s3_backend
from guideloom import (
    DocumentJsonFormat,
    DocumentStorage,
    FormatMismatchError,
    ShardExistsError,
    StorageNotFoundError,
    TokenStorage,
)
from tests.remote.conftest import ServiceStorage


def _documents(shard: int, count: int = 5) -> list[dict[str, object]]:
    return [{"shard": shard, "i": i, "text": "x" * (i * 7 + shard)} for i in range(count)]


def _write_tokens(storage: TokenStorage, shards: int = 3) -> list[np.ndarray]:
    documents = []
    with storage.sync_writer() as writer:
        for shard in range(shards):
            for length in (5, 17, 0, 40):
                tokens = np.arange(length, dtype=np.uint32) + 1000 * shard
                writer.append(shard, tokens)
                documents.append(tokens)
    return documents


def test_tokens_round_trip(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache")
    documents = _write_tokens(storage)
    reopened = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "other")
    assert reopened.dtype == np.uint32
    with reopened.sync_reader() as reader:
        assert len(reader) == len(documents)
        assert [reader.read(i).tolist() for i in range(len(reader))] == [d.tolist() for d in documents]
        assert reader.token_count == sum(len(d) for d in documents)


def test_documents_round_trip(service: ServiceStorage, tmp_path: Path) -> None:
    storage = DocumentStorage(service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path)
    with storage.sync_writer() as writer:
        for shard in (2, 0):
            for document in _documents(shard):
                writer.append(shard, document)
    with storage.sync_reader() as reader:
        assert list(reader) == _documents(0) + _documents(2)


def test_opening_costs_one_listing_and_no_shard_reads(service: ServiceStorage, tmp_path: Path) -> None:
    _write_tokens(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path), shards=5)
    before = len(service.listings())
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "fresh")
    with storage.sync_reader() as reader:
        assert len(reader) == 20
        assert len(service.listings()) > before
    assert service.reads("/shards/") == []  # counts came from the listing, no shard was read


def test_reads_download_each_shard_once_into_the_cache(service: ServiceStorage, tmp_path: Path) -> None:
    _write_tokens(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path), shards=2)
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "cache")
    for _ in range(2):
        with storage.sync_reader() as reader:
            [reader.read(i) for i in range(len(reader))]
    assert sorted(name for name, _, _, _ in service.reads("/shards/")) == [
        "corpus/shards/000000000000.shard",
        "corpus/shards/000000000001.shard",
    ]


def test_a_committed_shard_cannot_be_written_again(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    _write_tokens(storage, shards=1)
    with pytest.raises(ShardExistsError, match="shard 0"):
        with storage.sync_writer() as writer:
            writer.append(0, [1, 2, 3])


def test_racing_writers_of_one_shard_one_wins(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    first, second = storage.sync_writer(), storage.sync_writer()
    first.append(7, [1, 2, 3])
    second.append(7, [4, 5])
    first.commit(7)
    with pytest.raises(ShardExistsError, match="shard 7 was committed by another writer"):
        second.commit(7)
    second.close()
    first.close()
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r").sync_reader() as reader:
        assert reader.read(0).tolist() == [1, 2, 3]


def test_the_header_is_never_overwritten(service: ServiceStorage, tmp_path: Path) -> None:
    TokenStorage(service.url, "uint16", storage_options=service.options, cache_dir=tmp_path).sync_writer().close()
    with pytest.raises(FormatMismatchError, match="uint16"):
        TokenStorage(service.url, "uint32", storage_options=service.options, cache_dir=tmp_path)


def test_a_missing_storage_is_named(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    with pytest.raises(StorageNotFoundError, match=r"guideloom\.json is missing"):
        storage.sync_reader()


def test_a_missing_bucket_is_named(service: ServiceStorage, tmp_path: Path) -> None:
    url = service.service.url("no-such-bucket-here")
    with pytest.raises(StorageNotFoundError, match="bucket does not exist"):
        TokenStorage(url, storage_options=service.options, cache_dir=tmp_path).sync_reader()


def test_local_paths_refuse_storage_options(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="storage_options apply to URLs only"):
        TokenStorage(tmp_path / "x", storage_options={"anon": True})


def test_a_remote_storage_has_no_local_path(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    assert storage.location == service.url
    assert not hasattr(storage, "path")


def test_a_shard_without_its_marker_is_indexed_from_its_footer(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    documents = _write_tokens(storage, shards=2)
    (marker,) = [name for name in service.object_names() if name.startswith("shards/000000000001.r")]
    service.delete_object(marker)  # as if its writer died between the two creates
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r").sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [d.tolist() for d in documents]


def test_clean_removes_markers_whose_shard_is_gone(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    _write_tokens(storage, shards=2)
    service.delete_object("shards/000000000000.shard")
    removed = storage.clean_leftovers(older_than=0)
    assert [str(path).rsplit("/", 1)[1].startswith("000000000000.r") for path in removed] == [True]
    with storage.sync_reader() as reader:
        assert len(reader) == 4


def test_any_fsspec_store_works_through_generic_calls(tmp_path: Path) -> None:
    url = f"memory://guideloom-test-{tmp_path.name}/corpus"
    storage = TokenStorage(url, cache_dir=tmp_path)
    documents = _write_tokens(storage)
    with pytest.raises(ShardExistsError):
        with storage.sync_writer() as writer:
            writer.append(1, [1])
    with TokenStorage(url, cache_dir=tmp_path / "r").sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [d.tolist() for d in documents]
    assert storage.verify() == []


def test_a_remote_storage_travels_by_pickle(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    documents = _write_tokens(storage, shards=1)
    with storage.sync_reader() as reader:
        reader.read(0)  # the original has made its client
    with pickle.loads(pickle.dumps(storage)).sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [d.tolist() for d in documents]


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Shards over 5 MiB go up in 5 MiB parts (the smallest S3 allows), so tests stay small."""
    monkeypatch.setattr(guideloom._remote.s3_backend, "MULTIPART_BYTES", 5 << 20)
    monkeypatch.setattr(guideloom._remote.s3_backend, "PART_BYTES", 5 << 20)


@pytest.mark.usefixtures("small_parts")
@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_large_shards_upload_in_parts_and_racing_writers_still_get_one_winner(
    service: ServiceStorage, tmp_path: Path
) -> None:
    """On S3 only: S3's multipart upload (the others' large uploads: test_remote_services)."""
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path)
    first, second = storage.sync_writer(), storage.sync_writer()
    big = np.arange(3 << 20, dtype=np.uint32)  # 12 MiB: three parts
    first.append(0, big)
    second.append(0, big[::-1].copy())
    first.commit(0)
    with pytest.raises(ShardExistsError, match="shard 0 was committed by another writer"):
        second.commit(0)
    first.close()
    second.close()
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r").sync_reader() as reader:
        assert np.array_equal(reader.read(0), big)


def test_local_storages_never_import_fsspec(run_python: Callable[..., Any], tmp_path: Path) -> None:
    completed = run_python(
        """
        import sys
        from guideloom import StatefulDataLoader, TokenStorage
        storage = TokenStorage(sys.argv[1])
        with storage.sync_writer() as writer:
            writer.append(0, list(range(100)))
        with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=10) as loader:
            next(iter(loader))
        print(sorted(name for name in sys.modules if name.split(".")[0] in ("fsspec", "s3fs", "boto3")))
        """,
        tmp_path / "local",
    )
    assert completed.returncode == 0, completed.stderr
    assert completed.stdout.strip() == "[]"
