"""The same storage behaviours on each object-store service (S3, GCS, Azure), each a real emulator.

Parametrised over the services by the ``service`` fixture (tests/remote/services.py): writing and reading, racing
commits (exactly one writer wins each shard), conditional creates, ranged reads, listing pages, the index object,
compression, parts of shards, streaming through a cache and readers sharing one (each shard downloaded once, counted
at the service's proxy), a large shard's upload racing another, and a service's throttling answer retried (and
counted as the requests the service answered).
Everything else runs on S3 only (moto): the shared code above the backends.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import (
    DocumentJsonFormat,
    DocumentStorage,
    ShardExistsError,
    StatefulDataLoader,
    StorageNotFoundError,
    TokenStorage,
)
from guideloom._cli import main
from guideloom._core.metrics import counts_now
from guideloom._remote.object_store import ObjectStore
from guideloom._shards.checkpoints import CHECKPOINT_BYTES
from tests.remote.conftest import ServiceStorage

SHARDS = 8


def _tokens(shard: int, count: int = 4, length: int = 300) -> list[np.ndarray]:
    generator = np.random.default_rng(shard)
    return [generator.integers(0, 50_000, length, dtype=np.uint32) for _ in range(count)]


def _storage(service: ServiceStorage, cache: Path, **options: Any) -> TokenStorage:
    return TokenStorage(service.url, storage_options=service.options, cache_dir=cache, **options)


def _write(storage: TokenStorage, shards: int = SHARDS) -> list[list[int]]:
    written = []
    with storage.sync_writer() as writer:
        for shard in range(shards):
            for tokens in _tokens(shard):
                writer.append(shard, tokens)
                written.append(tokens.tolist())
    return written


def _read_all(storage: TokenStorage) -> list[list[int]]:
    with storage.sync_reader() as reader:
        return [reader.read(i).tolist() for i in range(len(reader))]


def _shard_downloads(service: ServiceStorage, since: int = 0) -> list[str]:
    """The shard objects read since the ``since``-th recorded read, one entry a request."""
    reads = service.service.object_reads(service.bucket, ".shard")[since:]
    return [path.split("?")[0].rsplit("%2F", 1)[-1].rsplit("/", 1)[-1] for path, _, _, _ in reads]


def test_a_storage_is_written_and_read_back_in_order(service: ServiceStorage, tmp_path: Path) -> None:
    written = _write(_storage(service, tmp_path / "writer"))
    assert _read_all(_storage(service, tmp_path / "reader")) == written


def test_documents_round_trip(service: ServiceStorage, tmp_path: Path) -> None:
    documents = [{"shard": shard, "text": "x" * (7 * shard + i)} for shard in range(3) for i in range(4)]
    storage = DocumentStorage(service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path)
    with storage.sync_writer() as writer:
        for document in documents:
            writer.append(int(str(document["shard"])), document)
    reopened = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / "r"
    )
    with reopened.sync_reader() as reader:
        assert list(reader) == documents


def test_racing_writers_of_the_same_shards_get_exactly_one_winner_each(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service, tmp_path / "cache")
    storage.sync_writer().close()  # the header, written once
    wins: dict[int, list[str]] = {shard: [] for shard in range(SHARDS)}
    start = threading.Barrier(2)

    def write(name: str, offset: int) -> None:
        writer = _storage(service, tmp_path / name).sync_writer()
        start.wait()
        for shard in range(SHARDS):
            try:  # a shard the other writer committed first is refused at append or at commit
                writer.append(shard, np.arange(offset, offset + 10 + shard, dtype=np.uint32))
                writer.commit(shard)
                wins[shard].append(name)
            except ShardExistsError:
                pass
        writer.close()

    threads = [threading.Thread(target=write, args=(name, offset)) for name, offset in (("a", 0), ("b", 1000))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert [len(winners) for winners in wins.values()] == [1] * SHARDS
    read = _read_all(_storage(service, tmp_path / "reader"))
    offsets = {"a": 0, "b": 1000}
    assert read == [list(range(offsets[wins[s][0]], offsets[wins[s][0]] + 10 + s)) for s in range(SHARDS)]


def test_a_second_create_of_an_object_is_refused_by_the_service(service: ServiceStorage) -> None:
    store = ObjectStore(service.url, service.options)
    assert store.conditional
    assert store.create("object", b"first") is True
    assert store.create("object", b"second") is False  # found holding other bytes: not ours
    assert store.create("object", b"first") is True  # found holding ours: an earlier attempt of this call landed
    assert store.read("object") == b"first"


def test_ranged_reads_and_the_start_of_an_object(service: ServiceStorage) -> None:
    store = ObjectStore(service.url, service.options)
    data = bytes(range(256)) * 64
    store.put("object", data)
    assert store.read("object", 100, 5000) == data[100:5000]
    assert store.read_start("object", 1000) == (data[:1000], len(data))
    assert store.read("missing") is None


def test_listing_pages_hold_the_objects_after_a_name(service: ServiceStorage) -> None:
    store = ObjectStore(service.url, service.options)
    for name in ("d/a", "d/b", "d/c", "d/sub/x"):
        store.put(name, name.encode())
    assert store.listing("d") == {"a": 3, "b": 3, "c": 3}
    assert store.listing("d", after="a") == {"b": 3, "c": 3}
    assert store.listing("empty") == {}


def test_the_index_object_lists_the_storage_for_readers(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service, tmp_path / "writer")
    written = _write(storage)
    assert storage.write_index() == SHARDS
    extra = _tokens(SHARDS)
    with storage.sync_writer() as writer:  # committed after the index: still seen
        for tokens in extra:
            writer.append(SHARDS, tokens)
    assert _read_all(_storage(service, tmp_path / "reader")) == written + [tokens.tolist() for tokens in extra]


def test_compressed_shards_read_back_the_same(service: ServiceStorage, tmp_path: Path) -> None:
    storage = _storage(service, tmp_path / "writer", compression="zstd")
    written = _write(storage, shards=3)
    assert _read_all(_storage(service, tmp_path / "reader")) == written
    sizes = ObjectStore(service.url, service.options).listing("shards")
    stored = sum(size for name, size in sizes.items() if name.endswith(".shard"))
    assert 0 < stored < sum(len(tokens) * 4 for tokens in written)


def test_a_loader_streams_through_a_cache_downloading_each_shard_once(service: ServiceStorage, tmp_path: Path) -> None:
    _write(_storage(service, tmp_path / "writer"))
    local = TokenStorage(tmp_path / "local")
    _write(local)
    since = len(service.service.object_reads(service.bucket, ".shard"))

    def batches(storage: TokenStorage) -> list[list[int]]:
        loader = StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=4, sequence_length=33, shuffle=True, seed=3, shuffle_window=2
        )
        with loader:
            return [batch.tolist() for batch in loader]

    limit = 5 * int(local.snapshot().rows["size"].max())
    assert batches(_storage(service, tmp_path / "cache", cache_limit_bytes=limit)) == batches(local)
    downloads = _shard_downloads(service, since)
    assert sorted(set(downloads)) == [f"{shard:012d}.shard" for shard in range(SHARDS)]
    assert len(downloads) == SHARDS
    sizes = ObjectStore(service.url, service.options).listing("shards")
    downloaded = sum(size for _, _, _, size in service.service.object_reads(service.bucket, ".shard")[since:])
    assert downloaded == sum(size for name, size in sizes.items() if name.endswith(".shard"))


@pytest.mark.parametrize("fault", ["slow_down", "reset_before"])
def test_a_throttling_answer_or_a_reset_connection_is_retried(
    service: ServiceStorage, tmp_path: Path, fault: str
) -> None:
    written = _write(_storage(service, tmp_path / "writer"), shards=1)
    proxy = service.service.proxy
    proxy.rates, proxy.applies, proxy.max_in_a_row = {fault: 1.0}, _a_shard_read, 1
    try:
        assert _read_all(_storage(service, tmp_path / "reader")) == written
    finally:
        proxy.rates, proxy.applies = {}, None
    assert proxy.injected[fault] >= 1


def _a_shard_read(method: str, target: str) -> bool:
    return method == "GET" and ".shard" in target.replace("%2F", "/").replace("%2f", "/")


def test_a_machine_downloads_only_its_part_of_the_shards_it_shares(service: ServiceStorage, tmp_path: Path) -> None:
    corpus = [np.random.default_rng(shard).integers(0, 50_000, 40_000, dtype=np.uint32) for shard in range(4)]
    for storage in (TokenStorage(tmp_path / "local"), _storage(service, tmp_path / "writer")):
        with storage.sync_writer() as writer:
            for shard, tokens in enumerate(corpus):
                writer.append(shard, tokens)
    since = len(service.service.object_reads(service.bucket, ".shard"))

    def batches(storage: TokenStorage) -> list[list[int]]:  # the second of four machines, windowed
        loader = StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=4,
            sequence_length=2049,
            shuffle=True,
            seed=5,
            shuffle_window=2,
            rank=1,
            world_size=4,
        )
        with loader:
            return [batch.tolist() for batch in loader]

    read = batches(_storage(service, tmp_path / "machine"))
    assert read == batches(TokenStorage(tmp_path / "local"))
    downloaded = sum(size for _, _, _, size in service.service.object_reads(service.bucket, ".shard")[since:])
    share = sum(len(batch) for batch in read) * 2049 * 4
    assert downloaded <= share + 2 * (CHECKPOINT_BYTES + 4096)  # its windows' pieces and the shards' tails


def test_readers_sharing_a_cache_download_each_shard_once(service: ServiceStorage, tmp_path: Path) -> None:
    written = _write(_storage(service, tmp_path / "writer"))
    since = len(service.service.object_reads(service.bucket, ".shard"))
    readers = [_storage(service, tmp_path / "shared") for _ in range(2)]
    results: list[list[list[int]]] = []
    threads = [
        threading.Thread(target=lambda storage=storage: results.append(_read_all(storage))) for storage in readers
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert results == [written, written]
    assert sorted(_shard_downloads(service, since)) == [f"{shard:012d}.shard" for shard in range(SHARDS)]


def test_a_shard_larger_than_one_simple_upload_commits_once(service: ServiceStorage, tmp_path: Path) -> None:
    big = np.arange(2 << 20, dtype=np.uint32)  # 8 MiB: a resumable upload on GCS
    first, second = (_storage(service, tmp_path / name).sync_writer() for name in ("a", "b"))
    first.append(0, big)
    second.append(0, big[::-1].copy())
    first.commit(0)
    with pytest.raises(ShardExistsError):
        second.commit(0)
    first.close()
    second.close()
    with _storage(service, tmp_path / "reader").sync_reader() as reader:
        assert np.array_equal(reader.read(0), big)


def test_the_command_line_inspects_verifies_and_indexes_a_storage(
    service: ServiceStorage, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _write(_storage(service, tmp_path / "writer"), shards=3)
    options = ["--storage-options", json.dumps(service.options)]
    assert main(["inspect", service.url, *options]) == 0
    assert "shards:     3" in capsys.readouterr().out
    assert main(["verify", service.url, *options]) == 0
    assert "ok: 3 shards" in capsys.readouterr().out
    assert main(["index", service.url, *options]) == 0
    assert ObjectStore(service.url, service.options).read("shards.index") is not None


def test_a_missing_bucket_is_no_storage(service: ServiceStorage, tmp_path: Path) -> None:
    url = service.service.url("no-such-bucket-here")
    with pytest.raises(StorageNotFoundError, match="no storage at"):
        TokenStorage(url, storage_options=service.options, cache_dir=tmp_path).sync_reader()


CREDENTIAL_HINTS = {
    "s3": "AWS_ACCESS_KEY_ID",
    "gcs": "GOOGLE_APPLICATION_CREDENTIALS",
    "azure": "AZURE_STORAGE_ACCOUNT",
}


def test_a_denied_request_is_a_permission_error_naming_the_services_credentials(
    service: ServiceStorage, tmp_path: Path
) -> None:
    _write(_storage(service, tmp_path / "writer"), shards=1)
    proxy = service.service.proxy
    proxy.rates, proxy.max_in_a_row = {"forbidden": 1.0}, 100
    hint = CREDENTIAL_HINTS[service.service.name]
    try:
        with pytest.raises(PermissionError, match=rf"(?s)guideloom\.json was denied.*{hint}"):
            _storage(service, tmp_path / "reader")
    finally:
        proxy.rates = {}


def test_a_retried_request_is_counted_as_the_service_answered_it(service: ServiceStorage) -> None:
    """A throttled read and its retry: two requests counted, as the service answered two. The retry is guideloom's
    (counted, logged, bounded by its policy) where the client's own retries are off: botocore's and the Azure SDK's;
    gcsfs retries on its own, in ways its public API does not let guideloom switch off."""
    store = ObjectStore(service.url, service.options)
    store.put("object", b"payload")
    since = len(service.requests())
    before = counts_now().get((service.url, "requests"), 0)
    proxy = service.service.proxy
    proxy.rates, proxy.applies, proxy.max_in_a_row = {"slow_down": 1.0}, _a_read_of_the_object, 1
    try:
        assert store.read("object") == b"payload"
    finally:
        proxy.rates, proxy.applies = {}, None
    # (the proxy may record the put's answer after the put returned: only the reads of the object are compared)
    answered = [
        status for method, path, status, _, _ in service.requests()[since:] if _a_read_of_the_object(method, path)
    ]
    assert [status // 100 for status in answered] == [5, 2]  # throttled, then read
    assert counts_now()[service.url, "requests"] - before == 2
    assert store.retrying.count == (0 if service.name == "gcs" else 1)


def _a_read_of_the_object(method: str, target: str) -> bool:
    return method == "GET" and target.split("?")[0].replace("%2F", "/").endswith("/corpus/object")
