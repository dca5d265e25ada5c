"""Objects of a storage on an object store: listings, reads, conditional creates, whole downloads, each retried.

Imported only when a storage is opened by URL (fsspec, s3fs, gcsfs and adlfs come from the ``remote``
extra). What a service's client does is its backend's (``object_backend``: one module per service, chosen
by the URL's scheme in ``BACKENDS``); here, what every service shares: the objects' names, retries of
every request on transient failures (``retries``), errors a user can act on, whether an object found
existing after a lost answer holds our bytes, and downloads in ranged parts where the backend has them.
Each request is counted for the storage's URL (``_core.metrics``: in ``retries``, one per attempt, or by the
backend's client where it sends several HTTP requests a call, ``counts_requests``), and so are the bytes of the
objects read.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import IO, Any, TypeVar

from guideloom._core.errors import ReadOnlyStorageError, StorageNotFoundError
from guideloom._core.metrics import count
from guideloom._remote.azure_backend import AzureBackend
from guideloom._remote.compression import DamagedDownload
from guideloom._remote.fsspec_backend import FsspecBackend
from guideloom._remote.gcs_backend import GcsBackend
from guideloom._remote.http_backend import HttpBackend
from guideloom._remote.object_backend import Decoder, ListPage, ObjectBackend
from guideloom._remote.ranged_parts import part_ranges
from guideloom._remote.retries import RetriesExhausted, Retrying, RetryPolicy
from guideloom._remote.s3_backend import S3Backend

# The backend of each URL scheme; any other scheme goes through fsspec's generic calls.
BACKENDS: dict[str, Callable[[str, dict[str, Any], str], ObjectBackend]] = {
    "s3": S3Backend,
    "s3a": S3Backend,
    "gs": GcsBackend,
    "gcs": GcsBackend,
    "az": AzureBackend,
    "abfs": AzureBackend,
    "abfss": AzureBackend,
    "http": HttpBackend,
    "https": HttpBackend,
}
BUCKET_PROTOCOLS = ("s3", "s3a", "gs", "gcs", "az", "abfs", "abfss")  # the first part of the path is a bucket
# Words of a denied request's error, by service: S3's codes, gcsfs's 403, Azure's codes and exception.
DENIED = (
    *("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "NoCredentials", "credentials"),
    *("Forbidden", "AuthenticationFailed", "AuthorizationFailure", "ClientAuthenticationError"),
)
# Where each service's client looks for credentials without storage_options (named in a denied request's error).
CREDENTIALS = {
    "s3": "AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_PROFILE",
    "gs": "GOOGLE_APPLICATION_CREDENTIALS, or storage_options={'token': ...}",
    "az": "AZURE_STORAGE_ACCOUNT_NAME with AZURE_STORAGE_ACCOUNT_KEY, or AZURE_STORAGE_CONNECTION_STRING",
}
CREDENTIALS |= {
    "s3a": CREDENTIALS["s3"],
    "gcs": CREDENTIALS["gs"],
    "abfs": CREDENTIALS["az"],
    "abfss": CREDENTIALS["az"],
}
COMPARED_TAIL = 64  # bytes at an object's end compared with ours (a shard's footer: its checksums)
T = TypeVar("T")
A = TypeVar("A")


def is_url(location: object) -> bool:
    """Whether a storage location names an object store (``scheme://...``) rather than a local path."""
    return isinstance(location, str) and "://" in location and not location.startswith("file://")


def parse_storage_options(text: str | None) -> dict[str, Any] | None:
    """The command line's ``--storage-options``: a JSON object handed to fsspec (URLs only)."""
    if text is None:
        return None
    try:
        options = json.loads(text)
    except ValueError as error:
        raise ValueError(f"--storage-options must be a JSON object: {error}") from None
    if not isinstance(options, dict):
        raise ValueError(f"--storage-options must be a JSON object, got {text!r}")
    return options


class ObjectStore:
    """The objects under one URL prefix; picklable, and fork-safe (its backend makes a client in each process)."""

    def __init__(self, url: str, options: dict[str, Any] | None) -> None:
        self.protocol, _, rest = url.partition("://")
        if not rest.strip("/") or (rest.startswith("/") and self.protocol in BUCKET_PROTOCOLS):
            raise ValueError(f"path {url!r} names no bucket: use {self.protocol}://BUCKET/PREFIX")
        self.url = url.rstrip("/")
        self.root = rest.rstrip("/")
        policy, self.options = RetryPolicy.from_options(options or {})
        try:
            self.backend = BACKENDS.get(self.protocol, FsspecBackend)(self.protocol, self.options, self.url)
        except ImportError as error:  # the service's client library is not installed
            raise ImportError(f"opening {url} needs {error}") from None
        self.retrying = Retrying(policy, self.backend, self.url, counts_requests=not self.backend.counts_requests)

    @property
    def conditional(self) -> bool:
        """Whether creating an object is atomic against a racing create (If-None-Match)."""
        return self.backend.atomic_creates

    @property
    def listable(self) -> bool:
        """Whether the store lists its objects (a static HTTP server does not: its index object lists them)."""
        return self.backend.listable

    def key(self, name: str) -> str:
        return f"{self.root}/{name}"

    def name_of(self, name: str) -> str:
        """The full URL of an object, for messages."""
        return f"{self.url}/{name}"

    def close(self) -> None:
        """Let go of the backend's client (a later request makes a new one)."""
        self.backend.close()

    def guarded(self, doing: str, request: Callable[[], T]) -> T:
        """``request()``, its failure turned into an error a user can act on (a missing bucket: no storage)."""
        try:
            return request()
        except RetriesExhausted as error:
            raise self.failure(error, doing) from error.last
        except FileNotFoundError as error:
            self._check_root(error)  # a missing bucket is StorageNotFoundError: callers let it through
            raise
        except (FileExistsError, StorageNotFoundError, ReadOnlyStorageError):
            raise
        except Exception as error:
            raise self.failure(error, doing) from error

    def call(self, doing: str, request: Callable[[int], T]) -> T:
        """``request(attempt)`` with retries; a failure that remains is an error a user can act on."""
        return self.guarded(doing, lambda: self.retrying.call(doing, request))

    def _unless_absent(self, doing: str, request: Callable[[int], T], absent: A) -> T | A:
        """``call``, or ``absent`` where the object is missing (a missing bucket still raises)."""
        try:
            return self.call(doing, request)
        except StorageNotFoundError:
            raise
        except FileNotFoundError:
            return absent

    def listing(self, directory: str, after: str = "", enough: Callable[[str], bool] | None = None) -> dict[str, int]:
        """Names (relative to ``directory``) and sizes of the objects in it that sort after ``after``; empty when
        there are none.

        Pages are requested until the listing ends or a page holds a name for which ``enough`` is true;
        the names of the last page past that one are returned too (callers ignore what they do not need).
        """
        doing = f"listing {self.name_of(directory)}" + (f" after {after}" if after else "")
        folder = self.key(directory)
        names: dict[str, int] = {}
        page: str | None = None
        while True:
            found = self._unless_absent(doing, partial(self._list_page, folder, after, page), None)
            if found is None:
                return names
            names.update(found.names)
            page = found.next_page
            if page is None or (enough is not None and any(enough(name) for name in found.names)):
                return names

    def _list_page(self, folder: str, after: str, page: str | None, _: int) -> ListPage:
        return self.backend.list_page(folder, after, page)

    def exists(self, name: str) -> bool:
        return self._unless_absent(
            f"looking up {self.name_of(name)}", lambda _: self.backend.size(self.key(name)) >= 0, False
        )

    def read(self, name: str, start: int | None = None, end: int | None = None) -> bytes | None:
        """The object's bytes (or a range of them); None if it does not exist."""
        data = self._unless_absent(
            f"reading {self.name_of(name)}", lambda _: self.backend.read(self.key(name), start, end), None
        )
        if data is not None:
            count("bytes_downloaded", len(data), self.url)
        return data

    def read_start(self, name: str, limit: int) -> tuple[bytes, int] | None:
        """The first ``limit`` bytes of an object and its whole size (one request on S3); None if it is absent."""
        found = self._unless_absent(
            f"reading {self.name_of(name)}", lambda _: self.backend.read_start(self.key(name), limit), None
        )
        if found is not None:
            count("bytes_downloaded", len(found[0]), self.url)
        return found

    def put(self, name: str, data: bytes) -> None:
        """Put ``data`` under ``name``, replacing what is there (a derived object: the last writer wins)."""
        self.call(f"writing {self.name_of(name)}", lambda _: self.backend.put(self.key(name), data))

    def create(self, name: str, source: bytes | Path) -> bool:
        """Create the object from bytes or a local file unless it exists; True if this call created it.

        An object found existing (412) counts as created by this call when it holds this call's bytes:
        an earlier attempt landed and its answer was lost (our retry, or the HTTP client's own resend
        of a PUT on a dropped kept-alive connection, which aiohttp does once). Compared: the size and
        the last bytes, a shard's footer with its checksums (the whole object for bytes).
        """
        doing = f"creating {self.name_of(name)}"
        try:
            created = self.guarded(doing, lambda: self.backend.create(self.key(name), source, self.retrying, doing))
            return self._holds(name, source) if created is None else created
        except StorageNotFoundError:
            raise
        except FileNotFoundError as error:
            raise self.failure(error, doing) from error

    def _holds(self, name: str, source: bytes | Path) -> bool:
        """Whether the object ``name`` is ``source``'s bytes (compared by size and by its last bytes)."""
        if isinstance(source, bytes):
            return self.read(name) == source
        size = source.stat().st_size
        with open(source, "rb") as file:
            file.seek(max(0, size - COMPARED_TAIL))
            tail = file.read()
        stored = self.call(f"looking up {self.name_of(name)}", lambda _: self.backend.size(self.key(name)))
        return stored == size and (not tail or self.read(name, size - len(tail), size) == tail)

    def download(
        self,
        name: str,
        destination: Path,
        decoder: Callable[[IO[bytes]], Decoder] | None = None,
        size: int | None = None,
    ) -> None:
        """Write the whole object into ``destination`` (created or truncated), through ``decoder`` if given.

        Where the backend has ranged downloads, an object of a known ``size`` (its bytes as stored), read
        without a decoder, comes in ranged parts side by side (``ranged_parts``), each retried on its own;
        else one GET, retried whole. FileNotFoundError if the object is gone. Each attempt starts the file afresh.
        """
        doing = f"downloading {self.name_of(name)}"
        key = self.key(name)
        whole = decoder is not None or size is None or not self.backend.ranged_downloads
        ranges = [] if whole else part_ranges(size or 0)
        counted = None if decoder is None else partial(_CountingDecoder, decoder, self.url)
        try:
            if len(ranges) > 1:
                self.backend.download_ranges(key, destination, ranges, self.retrying, doing)
            else:
                self.retrying.call(doing, lambda _: self.backend.download(key, destination, counted))
            if decoder is None:
                count("bytes_downloaded", destination.stat().st_size, self.url)
        except FileNotFoundError:
            raise
        except RetriesExhausted as error:
            raise self.failure(error, doing) from error.last
        except OSError as error:
            if error.filename is not None and Path(str(error.filename)) == destination:
                raise  # the local side failed (a full cache disk): not the store's fault
            raise self.failure(error, doing) from error
        except DamagedDownload:
            raise
        except Exception as error:
            raise self.failure(error, doing) from error

    def delete(self, name: str) -> None:
        """Delete the object; one already gone is no error."""
        self._unless_absent(f"deleting {self.name_of(name)}", lambda _: self.backend.delete(self.key(name)), None)

    def abort_uploads(self, directory: str, older_than: float) -> list[str]:
        """Abort multipart uploads under ``directory`` begun ``older_than`` seconds ago or more; their URLs."""
        doing = f"listing unfinished uploads under {self.name_of(directory)}"
        folder = self.key(directory)
        aborted = self.guarded(doing, lambda: self.backend.abort_uploads(folder, older_than, self.retrying, doing))
        return [f"{self.protocol}://{key}" for key in aborted]

    def bucket_missing(self) -> bool:
        """Whether the storage's bucket does not exist (one request: asked only where an object is missing)."""
        bucket = self.root.split("/", 1)[0]
        return not self.guarded(
            f"asking whether {self.protocol}://{bucket} exists", lambda: self.backend.bucket_exists(bucket)
        )

    def _check_root(self, error: FileNotFoundError) -> None:
        """A missing bucket is a missing storage, said so; a missing key is the caller's business."""
        if self.backend.missing_bucket(error):
            raise StorageNotFoundError(f"no storage at {self.url}: the bucket does not exist") from None

    def failure(self, error: BaseException, doing: str) -> Exception:
        """An error a user can act on, for a failed call to the store."""
        if isinstance(error, RetriesExhausted):
            last = error.last
            unreachable = "Connect" in type(last).__name__ or isinstance(last, ConnectionRefusedError)
            where = self._endpoint()
            reason = f"the object store{where} cannot be reached, " if unreachable else ""
            return ConnectionError(f"{doing} failed: {reason}{error} (see storage_options['request_attempts'])")
        text = str(error) or type(error).__name__
        if isinstance(error, PermissionError) or any(word in text or word in type(error).__name__ for word in DENIED):
            return PermissionError(
                f"{doing} was denied: {text} (credentials come from storage_options or the usual environment "
                f"variables, e.g. {CREDENTIALS.get(self.protocol, CREDENTIALS['s3'])})"
            )
        kind = type(error).__name__
        if "Connect" in kind or "Timeout" in kind or isinstance(error, ConnectionError | TimeoutError):
            return ConnectionError(f"{doing} failed: the object store{self._endpoint()} cannot be reached ({text})")
        if isinstance(error, OSError):
            return OSError(error.errno, f"{doing} failed: {text}")
        return OSError(f"{doing} failed: {kind}: {text}")

    def _endpoint(self) -> str:
        endpoint = self.options.get("endpoint_url") or self.options.get("client_kwargs", {}).get("endpoint_url")
        return f" at {endpoint}" if endpoint else ""


class _CountingDecoder:
    """A download's decoder that counts the bytes it is given (those of the object, before decoding)."""

    def __init__(self, decoder: Callable[[IO[bytes]], Decoder], location: str, file: IO[bytes]) -> None:
        self._decoder = decoder(file)
        self._location = location

    def write(self, chunk: bytes) -> None:
        count("bytes_downloaded", len(chunk), self._location)
        self._decoder.write(chunk)

    def finish(self) -> None:
        self._decoder.finish()
