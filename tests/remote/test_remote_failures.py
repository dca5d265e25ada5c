"""Failures of the store, the network and the data get clear errors; nothing committed is lost."""

from __future__ import annotations

import errno
import io
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import requests
import torch

import guideloom._remote.ranged_parts
import guideloom._remote.s3_backend
from guideloom import CorruptStorageError, StatefulDataLoader, TokenStorage
from tests.remote.conftest import ServiceStorage
from tests.remote.s3_support import S3Server
from tests.remote.services import AZURITE_ACCOUNT, AZURITE_KEY


def _storage(url: str, service: ServiceStorage, cache: Path, **options: Any) -> TokenStorage:
    return TokenStorage(url, storage_options=service.options, cache_dir=cache, **options)


def _fill(storage: TokenStorage, shards: int = 6, documents: int = 8) -> None:
    generator = np.random.default_rng(2)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            for _ in range(documents):
                writer.append(shard, generator.integers(0, 1000, 40, dtype=np.uint32))


def _epoch(storage: TokenStorage, **options: Any) -> list[list[list[int]]]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=16, **options
    ) as loader:
        return [batch.tolist() for batch in loader]


UNREACHABLE = {  # a storage's options naming an endpoint where nothing listens
    "s3": {"endpoint_url": "http://127.0.0.1:9", "config_kwargs": {"retries": {"total_max_attempts": 1}}},
    "az": {
        "connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint=http://127.0.0.1:9/{AZURITE_ACCOUNT};"
    },
}


@pytest.mark.usefixtures("s3_server")  # the credentials
@pytest.mark.parametrize("scheme", sorted(UNREACHABLE))
def test_an_unreachable_endpoint_is_named(tmp_path: Path, scheme: str) -> None:
    """Not on GCS: gcsfs retries a refused connection on its own for a minute or more (6 tries up to 17 s apart),
    which its public API does not let a test shorten."""
    with pytest.raises(ConnectionError, match=r"cannot be reached"):
        TokenStorage(f"{scheme}://bucket/corpus", storage_options=UNREACHABLE[scheme], cache_dir=tmp_path)


@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_denied_credentials_are_named(service: ServiceStorage, s3_server: S3Server, tmp_path: Path) -> None:
    """On S3 only: moto's own check of credentials (each service's denial: test_remote_services)."""
    _fill(_storage(service.url, service, tmp_path), shards=1)
    reset = f"{s3_server.endpoint}/moto-api/reset-auth"
    requests.post(reset, data=b"0", timeout=10)  # from now on the server checks credentials: ours are unknown
    try:
        with pytest.raises(PermissionError, match=r"denied.*AWS_ACCESS_KEY_ID"):
            _storage(service.url, service, tmp_path / "denied")
    finally:
        requests.post(reset, data=str(2**62).encode(), timeout=10)
    assert _epoch(_storage(service.url, service, tmp_path / "again"))  # nothing was lost


def test_a_corrupt_object_is_downloaded_three_times_then_named(service: ServiceStorage, tmp_path: Path) -> None:
    _fill(_storage(service.url, service, tmp_path / "w"), shards=2)
    key = "shards/000000000001.shard"
    damaged = bytearray(service.object_bytes(key))
    damaged[10] ^= 0x40  # a flipped bit in the data, as bit rot on the store would leave it
    service.put_object(key, bytes(damaged))
    storage = _storage(service.url, service, tmp_path / "r")
    with storage.sync_reader() as reader:
        with pytest.raises(
            CorruptStorageError, match=r"shard 1 failed its checks 3 times.*do not match their checkpoint"
        ):
            reader.read(len(reader) - 1)
        assert reader.read(0).tolist()  # the other shard is fine
    assert len(service.reads("000000000001.shard")) == 3  # (the damaging above went past the proxy)
    assert [problem.startswith("shard 1: data bytes 0..") for problem in storage.verify()] == [True]


def test_a_shard_deleted_from_the_store_is_named(service: ServiceStorage, tmp_path: Path) -> None:
    _fill(_storage(service.url, service, tmp_path / "w"), shards=2)
    storage = _storage(service.url, service, tmp_path / "r")
    with storage.sync_reader() as reader:
        service.delete_object("shards/000000000000.shard")
        with pytest.raises(CorruptStorageError, match=r"shard 0 vanished: .* was deleted from the store"):
            reader.read(0)


def test_eviction_keeps_the_cache_within_two_shards_during_a_shuffled_epoch(
    service: ServiceStorage, tmp_path: Path
) -> None:
    local = TokenStorage(tmp_path / "local")
    _fill(local)
    _fill(_storage(service.url, service, tmp_path / "w"))
    shard_size = max(path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir())
    cache = tmp_path / "cache"
    remote = _storage(service.url, service, cache, cache_limit_bytes=2 * shard_size)
    assert _epoch(remote, shuffle=True, seed=4) == _epoch(local, shuffle=True, seed=4)
    cached = [path for path in cache.rglob("*.shard")]
    assert len(cached) <= 2
    assert len(service.reads("/shards/")) > 6  # shards were evicted and fetched again


def test_shards_read_within_a_clock_tick_are_evicted_in_the_order_they_were_read(
    service: ServiceStorage, tmp_path: Path
) -> None:
    """Eviction follows the order of use to the nanosecond, not the file system's clock (it may tick only every
    few milliseconds): a resumed epoch relies on the shards it needs first being evicted last."""
    _fill(_storage(service.url, service, tmp_path / "w"))
    storage = _storage(service.url, service, tmp_path / "cache")
    with storage.sync_reader() as reader:
        for _ in range(3):  # downloaded, then read again from the cache in a scrambled order
            order = [3, 0, 5, 1, 4, 2]
            for position in order:
                reader.shard_tokens(position)
            cached = {
                int(path.name.split(".")[0]): path.stat().st_mtime_ns for path in (tmp_path / "cache").rglob("*.shard")
            }
            assert sorted(cached, key=cached.__getitem__) == order


@pytest.mark.parametrize("service", ["s3", "azure"], indirect=True)
def test_the_server_stopped_mid_epoch_raises_then_the_loader_continues(service: ServiceStorage, tmp_path: Path) -> None:
    """Not on GCS: gcsfs retries a refused connection on its own for a minute or more (6 tries up to 17 s apart),
    which its public API does not let a test shorten."""
    local = TokenStorage(tmp_path / "local")
    _fill(local)
    _fill(_storage(service.url, service, tmp_path / "w"))
    expected = _epoch(local)
    options = dict(service.options)
    if service.name == "s3":
        options["config_kwargs"] = {"retries": {"total_max_attempts": 1}}  # (botocore's own)
    largest = max(path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir())
    # A cache of two shards leaves no room to prefetch, so the epoch's later shards are fetched only
    # when read, after the server has stopped.
    remote = TokenStorage(
        service.url, storage_options=options, cache_dir=tmp_path / "cache", cache_limit_bytes=2 * largest
    )
    with StatefulDataLoader.from_storage(remote, device="cpu", local_batch_size=4, sequence_length=16) as loader:
        batches: list[torch.Tensor] = [next(iter(loader))]  # shard 0 only
        with service.outage(), pytest.raises(ConnectionError, match=r"cannot be reached.*shard|shard.*reached"):
            batches.extend(loader)
        batches.extend(loader)  # the failed batch and the rest, from where the loader stopped
    assert [batch.tolist() for batch in batches] == expected


def test_the_loader_prefetches_the_epochs_shards_so_it_needs_the_server_only_at_first(
    service: ServiceStorage, tmp_path: Path
) -> None:
    local = TokenStorage(tmp_path / "local")
    _fill(local)
    _fill(_storage(service.url, service, tmp_path / "w"))
    expected = _epoch(local, shuffle=True)
    cache = tmp_path / "cache"
    remote = _storage(service.url, service, cache)
    with StatefulDataLoader.from_storage(
        remote, device="cpu", local_batch_size=4, sequence_length=16, shuffle=True
    ) as loader:
        batches = iter(loader)
        taken = [next(batches).tolist()]
        deadline = time.monotonic() + 60
        while len(list(cache.rglob("*.shard"))) < 6 and time.monotonic() < deadline:
            time.sleep(0.05)
        with service.outage():
            taken += [batch.tolist() for batch in batches]
    assert taken == expected


class _FullDisk(io.FileIO):
    """A cache file on a disk that fills up after its first MiB (fault injection at the local file)."""

    def write(self, data: Any) -> int:
        if self.tell() + len(data) > 1 << 20:
            raise OSError(errno.ENOSPC, "No space left on device")
        return super().write(data)


def _full_disk_at(descriptor: int, data: bytes, offset: int) -> None:
    """A ranged part's write on a disk that fills up after its first MiB."""
    if offset + len(data) > 1 << 20:
        raise OSError(errno.ENOSPC, "No space left on device")
    guideloom._remote.ranged_parts.os.pwrite(descriptor, data, offset)


@pytest.mark.parametrize("download", ["one GET", "ranged parts"])
@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_a_full_cache_disk_is_named_and_nothing_is_left_half_written(
    download: str, service: ServiceStorage, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On S3 only: the full disk is injected where the S3 backend writes a download, whole or in ranged parts
    (gcsfs and adlfs write theirs inside their own ``get_file``, and download no ranged parts)."""
    writer_storage = _storage(service.url, service, tmp_path / "w")
    with writer_storage.sync_writer() as writer:
        writer.append(0, np.arange(1 << 19, dtype=np.uint32))  # a 2 MiB shard: one GET by default
    cache = tmp_path / "cache"
    storage = _storage(service.url, service, cache)
    if download == "one GET":
        monkeypatch.setattr(guideloom._remote.s3_backend, "open", _FullDisk, raising=False)  # where its body is written
    else:
        monkeypatch.setattr(guideloom._remote.ranged_parts, "WHOLE_GET_BYTES", 0)  # 4 ranged parts
        monkeypatch.setattr(guideloom._remote.ranged_parts, "write_at", _full_disk_at)
    with storage.sync_reader() as reader:
        with pytest.raises(OSError, match=r"cache directory .* is full while downloading shard 0") as raised:
            reader.read(0)
    assert raised.value.errno == errno.ENOSPC
    assert [*cache.rglob("*.part"), *cache.rglob("*.shard")] == []  # no partial download, nothing visible
    monkeypatch.undo()
    with storage.sync_reader() as reader:  # space again: the shard downloads and reads
        assert reader.read(0).tolist() == list(range(1 << 19))
