"""Any other fsspec filesystem (``gs://``, ``az://``, ``memory://``, ...): the object-store backend through
fsspec's generic, public calls.

Without a conditional put here, a create is "check, then put": two writers racing for one name may both
think they created it (see docs/object-storage.md); ``ConditionalFsspecBackend`` is the base of the services
whose fsspec client creates atomically (``mode="create"``: GCS, Azure). A listing is one answer holding
everything (fsspec's ``ls``), a download one ``get_file`` or a read through the decoder.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from guideloom._remote.object_backend import (
    BROKEN_CONNECTIONS,
    DOWNLOAD_CHUNK,
    Decoder,
    ListPage,
    named_among,
    require_fsspec,
)
from guideloom._remote.retries import Retrying


class FsspecClient:
    """One fsspec filesystem per process, made where first used (fsspec's async clients must not cross a fork);
    picklable (a client is made afresh where it is unpickled). ``location``: the storage's URL, that its
    requests are counted for where the client counts them itself."""

    counts_requests = False

    def __init__(self, protocol: str, options: dict[str, Any], location: str = "") -> None:
        require_fsspec(protocol)
        self.protocol = protocol
        self.options = options
        self.location = location
        self._fs: Any = None
        self._pid = -1

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_fs": None, "_pid": -1}

    @property
    def fs(self) -> Any:
        """The filesystem of this process."""
        if self._fs is None or self._pid != os.getpid():
            import fsspec

            self._fs = fsspec.filesystem(self.protocol, skip_instance_cache=True, **self.filesystem_options())
            self.made(self._fs)
            self._pid = os.getpid()
        return self._fs

    def filesystem_options(self) -> dict[str, Any]:
        """The options a filesystem of this process is made with (the storage's own here)."""
        return self.options

    def made(self, fs: Any) -> None:
        """Set up a filesystem just made (nothing here)."""

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        """Whether a missing object's error names its bucket as missing (S3's ``NoSuchBucket``, as fsspec words it)."""
        text = str(error)
        return "NoSuchBucket" in text or "specified bucket does not exist" in text

    def bucket_exists(self, bucket: str) -> bool:
        return bool(self.fs.exists(bucket))

    def close(self) -> None:
        self._fs = None


class FsspecBackend(FsspecClient):
    """The objects under one fsspec filesystem."""

    atomic_creates = False
    ranged_downloads = False
    listable = True

    def _path(self, name: str) -> str:
        """A path as the filesystem names it in listings (without its scheme, in its own spelling)."""
        from fsspec.core import strip_protocol

        return str(strip_protocol(name if "://" in name else f"{self.protocol}://{name}"))

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        try:
            entries = self.fs.ls(folder, detail=True, refresh=True)
        except FileNotFoundError as error:
            if self.missing_bucket(error):
                raise
            return ListPage({}, None)
        prefix = self._path(folder).rstrip("/") + "/"
        names = {}
        for entry in entries:
            path = self._path(str(entry["name"]))
            if entry.get("type") == "file" and path.startswith(prefix) and path[len(prefix) :] > start_after:
                names[path[len(prefix) :]] = int(entry.get("size") or 0)
        return ListPage(names, None)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        try:
            return bytes(self.fs.cat_file(key, start=start, end=end))
        except Exception as error:
            if self.status(error) == 416:  # a range past the object's end: EINVAL, as s3fs says it
                raise OSError(errno.EINVAL, f"{key}: the range asked begins past the object's end") from error
            raise

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        size = self.size(key)
        return (self.read(key, 0, min(size, limit)) if size else b""), size

    def size(self, key: str) -> int:
        return int(self.fs.size(key))

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        if decoder is None:
            self.fs.get_file(key, str(destination))
            return
        with self.fs.open(key, "rb") as remote, open(destination, "wb") as file:
            decoding = decoder(file)
            while chunk := remote.read(DOWNLOAD_CHUNK):
                decoding.write(chunk)
            decoding.finish()

    def download_ranges(
        self, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
    ) -> None:
        raise NotImplementedError(f"{self.protocol}:// downloads whole objects (ranged_downloads is False)")

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        if retrying.call(doing, lambda _: self.fs.exists(key)):
            return False
        if isinstance(source, Path):
            retrying.call(doing, lambda _: self.fs.put_file(str(source), key))
        else:
            retrying.call(doing, lambda _: self.fs.pipe_file(key, source))
        return True

    def put(self, key: str, data: bytes) -> None:
        self.fs.pipe_file(key, data)

    def delete(self, key: str) -> None:
        self.fs.rm_file(key)

    def abort_uploads(self, folder: str, older_than: float, retrying: Retrying, doing: str) -> list[str]:
        return []  # fsspec has no generic call for a service's unfinished uploads

    def status(self, error: BaseException) -> int | None:
        return None

    def broken_connection(self, error: BaseException) -> bool:
        return named_among(error, BROKEN_CONNECTIONS)


class ConditionalFsspecBackend(FsspecBackend):
    """A service whose fsspec client creates an object only where it is absent, in one request the service
    checks (fsspec's ``mode="create"``, answered by ``FileExistsError`` where the object exists)."""

    atomic_creates = True

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        def put(_: int) -> bool | None:
            try:
                if isinstance(source, Path):
                    self.fs.put_file(str(source), key, mode="create")
                else:
                    self.fs.pipe_file(key, source, mode="create")
            except FileExistsError:  # another writer's object, or our earlier attempt's whose answer was lost
                return None
            return True

        return retrying.call(doing, put)
