"""Object-store services behind one backend protocol: a service is its backend, chosen by the URL's scheme."""

from __future__ import annotations

import threading
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, ClassVar

import numpy as np
import pytest

import guideloom._remote.object_store
from guideloom import TokenStorage
from guideloom._remote.object_backend import Decoder, ListPage
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.retries import Retrying


class Hiccup(Exception):
    """What the dictionary service's client raises for a dropped connection."""


class DictBackend:
    """A service that keeps its objects in a dictionary of this process: only the protocol's methods."""

    atomic_creates = True
    ranged_downloads = False
    listable = True
    counts_requests = False
    objects: ClassVar[dict[str, bytes]] = {}
    hiccups: ClassVar[list[str]] = []  # keys whose next read fails once with a Hiccup
    lock = threading.Lock()

    def __init__(self, protocol: str, options: dict[str, Any], location: str) -> None:
        self.protocol = protocol

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        prefix = folder.rstrip("/") + "/"
        names = {key[len(prefix) :]: len(data) for key, data in sorted(self.objects.items())}
        return ListPage({name: size for name, size in names.items() if "/" not in name and name > start_after}, None)

    def _get(self, key: str) -> bytes:
        if key in self.hiccups:
            self.hiccups.remove(key)
            raise Hiccup(f"connection to the dictionary dropped while reading {key}")
        if key not in self.objects:
            raise FileNotFoundError(key)
        return self.objects[key]

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return self._get(key)[start:end]

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        data = self._get(key)
        return data[:limit], len(data)

    def size(self, key: str) -> int:
        return len(self._get(key))

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        data = self._get(key)
        with open(destination, "wb") as file:
            if decoder is None:
                file.write(data)
            else:
                decoding = decoder(file)
                decoding.write(data)
                decoding.finish()

    def download_ranges(
        self, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
    ) -> None:
        raise AssertionError("ranged_downloads is False")

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        data = source.read_bytes() if isinstance(source, Path) else source
        with self.lock:
            if key in self.objects:
                return False
            self.objects[key] = data
        return True

    def put(self, key: str, data: bytes) -> None:
        self.objects[key] = data

    def delete(self, key: str) -> None:
        self.objects.pop(key, None)

    def abort_uploads(self, folder: str, older_than: float, retrying: Retrying, doing: str) -> list[str]:
        return []

    def status(self, error: BaseException) -> int | None:
        return None

    def broken_connection(self, error: BaseException) -> bool:
        return isinstance(error, Hiccup)

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        return False

    def bucket_exists(self, bucket: str) -> bool:
        return True

    def close(self) -> None:
        pass


@pytest.fixture
def dict_service(monkeypatch: pytest.MonkeyPatch) -> dict[str, bytes]:
    """The ``dict://`` scheme served by ``DictBackend``: one line in the table of backends."""
    monkeypatch.setitem(guideloom._remote.object_store.BACKENDS, "dict", DictBackend)
    monkeypatch.setattr(DictBackend, "objects", {})
    monkeypatch.setattr(DictBackend, "hiccups", [])
    return DictBackend.objects


def test_a_storage_on_a_registered_service_is_written_indexed_and_read_through_its_backend(
    dict_service: dict[str, bytes], tmp_path: Path
) -> None:
    documents = [np.arange(shard * 100, shard * 100 + 50, dtype=np.uint32) for shard in range(3)]
    storage = TokenStorage("dict://bucket/corpus", cache_dir=tmp_path / "cache")
    with storage.sync_writer() as writer:
        for shard, tokens in enumerate(documents):
            writer.append(shard, tokens)
    assert storage.write_index() == 3
    assert sorted(key for key in dict_service if key.endswith(".shard")) == [
        f"bucket/corpus/shards/{shard:012d}.shard" for shard in range(3)
    ]
    reopened = TokenStorage("dict://bucket/corpus", cache_dir=tmp_path / "other-cache")
    with reopened.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [tokens.tolist() for tokens in documents]


def test_the_service_backend_says_which_of_its_errors_are_retried(dict_service: dict[str, bytes]) -> None:
    store = ObjectStore("dict://bucket/corpus", None)
    dict_service["bucket/corpus/x"] = b"payload"
    DictBackend.hiccups.append("bucket/corpus/x")
    assert store.read("x") == b"payload"
    assert store.retrying.count == 1


def test_azure_options_are_adlfs_and_an_unknown_one_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    for variable in ("AZURE_STORAGE_CLIENT_SECRET", "AZURE_STORAGE_TENANT_ID"):
        monkeypatch.delenv(variable, raising=False)
    with pytest.raises(ValueError, match=r"az:// have no option 'endpoint_url'"):
        TokenStorage("az://container/corpus", storage_options={"account_name": "a", "endpoint_url": "x"})
    with pytest.raises(ValueError, match=r"client_id.*needs 'client_secret' and 'tenant_id'"):
        TokenStorage("az://container/corpus", storage_options={"account_name": "a", "client_id": "c"})
