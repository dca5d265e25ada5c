"""Storages served over ``http://`` / ``https://`` (a static server or CDN serving a storage's files): read only.

Reads go through fsspec's HTTP filesystem with the URL's scheme kept (ranged GETs where asked). A static
server cannot list, so a listing finds nothing: such a storage is read through its index object (written
with ``write_index()`` before the files were served). Creating, replacing or deleting an object is a
``ReadOnlyStorageError``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO

from guideloom._core.errors import ReadOnlyStorageError
from guideloom._remote.fsspec_backend import FsspecBackend
from guideloom._remote.object_backend import Decoder, ListPage
from guideloom._remote.retries import Retrying


class HttpBackend(FsspecBackend):
    """The files under an HTTP(S) URL, read through fsspec (one filesystem per process)."""

    listable = False

    def _url(self, key: str) -> str:
        return f"{self.protocol}://{key}"

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        return ListPage({}, None)  # nothing to list: the index object names the shards

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        return super().read(self._url(key), start, end)

    def size(self, key: str) -> int:
        return super().size(self._url(key))

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        super().download(self._url(key), destination, decoder)

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        raise self._read_only(key)

    def put(self, key: str, data: bytes) -> None:
        raise self._read_only(key)

    def delete(self, key: str) -> None:
        raise self._read_only(key)

    def status(self, error: BaseException) -> int | None:
        """aiohttp's ``ClientResponseError`` carries the answer's status."""
        status = getattr(error, "status", None)
        return status if isinstance(status, int) else None

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        return False

    def bucket_exists(self, bucket: str) -> bool:
        return True  # a web server has no buckets: a missing object is only missing

    def _read_only(self, key: str) -> ReadOnlyStorageError:
        return ReadOnlyStorageError(
            f"{self._url(key)}: {self.protocol}:// storages are read only (a static server cannot create "
            "objects); write the storage to a directory, s3://, gs:// or az:// and serve its files"
        )
