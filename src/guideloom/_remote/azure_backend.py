"""Azure Blob Storage (``az://``, ``abfs://``): the object-store backend through azure-storage-blob's public client.

The Azure SDK's own sync client (``BlobServiceClient``), not adlfs: adlfs passes no client options to it, so
neither its retries nor its requests could be seen. Here its retries are off (``retry_total=0``: guideloom's
``retries`` are the ones, with their bounds, as on S3) and each request it sends is counted for the storage
(``raw_request_hook``), so ``loader.metrics()`` says what the service answered. A listing page is one
``List Blobs`` request (names directly in the folder, ``PAGE_SIZE`` a page); a read one ranged GET (the start
of a blob too: its ``Content-Range`` gives the whole size); a size one HEAD; a whole download one GET up to
``REQUEST_BYTES`` (larger blobs in GETs of that size); a create an upload with ``If-None-Match: *`` (Azure answers
409 where the blob exists; a file larger than ``REQUEST_BYTES`` goes in blocks of that size, committed with the
same condition). The only retries left to the SDK are its download's own, of a body cut short (counted too).

The storage's options are adlfs's (so that a storage moves between the two unchanged): ``account_name`` with
``account_key``, ``sas_token``, ``credential`` or a service principal (``client_id``, ``client_secret``,
``tenant_id``), or ``connection_string``; ``account_host``, ``anon``; each read from its ``AZURE_STORAGE_*``
environment variable where not given. Without a key, token or credential (and ``anon`` not set), azure-identity's
``DefaultAzureCredential`` signs the requests, as adlfs does.
"""

from __future__ import annotations

import contextlib
import errno
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any

from guideloom._core.metrics import count
from guideloom._remote.object_backend import BROKEN_CONNECTIONS, PAGE_SIZE, Decoder, ListPage, named_among
from guideloom._remote.retries import Retrying

REQUEST_BYTES = 64 << 20  # a blob up to this size is one GET or PUT, a larger one moves in parts of it (in memory)
# adlfs's options, read as adlfs reads them (each from its environment variable where not given).
CREDENTIAL_OPTIONS = {
    "account_name": "AZURE_STORAGE_ACCOUNT_NAME",
    "account_key": "AZURE_STORAGE_ACCOUNT_KEY",
    "connection_string": "AZURE_STORAGE_CONNECTION_STRING",
    "sas_token": "AZURE_STORAGE_SAS_TOKEN",
    "client_id": "AZURE_STORAGE_CLIENT_ID",
    "client_secret": "AZURE_STORAGE_CLIENT_SECRET",
    "tenant_id": "AZURE_STORAGE_TENANT_ID",
}
CLIENT_OPTIONS = ("connection_timeout", "read_timeout")  # passed on to the SDK's client
# adlfs's options for its file system and its caches: nothing to do here, accepted so that a storage's options move
# unchanged between adlfs and guideloom.
FILESYSTEM_OPTIONS = frozenset(
    {
        "use_listings_cache",
        "listings_expiry_time",
        "max_paths",
        "skip_instance_cache",
        "blocksize",
        "default_fill_cache",
        "default_cache_type",
        "version_aware",
        "assume_container_exists",
        "max_concurrency",
        "location_mode",
        "timeout",
        "socket_timeout",
        "request_session",
        "asynchronous",
        "loop",
    }
)
# azure-core's classes for "the request did not get through" and "the response came incomplete", by name.
AZURE_BROKEN_CONNECTIONS = BROKEN_CONNECTIONS | {"ServiceRequestError", "ServiceResponseError", "IncompleteReadError"}


class AzureBackend:
    """The blobs of an Azure container through the SDK's sync client: one client per process (made where first
    used, as a fork must not share its connections), shared by the process's threads; picklable."""

    atomic_creates = True
    ranged_downloads = False
    listable = True
    counts_requests = True

    def __init__(self, protocol: str, options: dict[str, Any], location: str = "") -> None:
        try:
            import azure.storage.blob  # noqa: F401
        except ImportError:  # pragma: no cover - depends on the installed extras
            raise ImportError("azure-storage-blob for az://: pip install 'guideloom[remote]'") from None
        unknown = sorted(set(options) - set(CREDENTIAL_OPTIONS) - {"credential", "account_host", "anon"})
        unknown = [name for name in unknown if name not in CLIENT_OPTIONS and name not in FILESYSTEM_OPTIONS]
        if unknown:
            raise ValueError(f"storage_options for {protocol}:// have no option {', '.join(map(repr, unknown))}")
        given = _credential_options(options)
        if not given["connection_string"] and not given["account_name"]:
            raise ValueError(
                f"{protocol}:// storages need storage_options['account_name'] (with a key, token or credential) or "
                "['connection_string'], or the environment variable AZURE_STORAGE_ACCOUNT_NAME or "
                "AZURE_STORAGE_CONNECTION_STRING"
            )
        if given["client_id"] and not (given["client_secret"] and given["tenant_id"]):
            raise ValueError(
                f"{protocol}:// storage_options['client_id'] (a service principal) needs 'client_secret' and "
                "'tenant_id' (or AZURE_STORAGE_CLIENT_SECRET and AZURE_STORAGE_TENANT_ID)"
            )
        self.protocol = protocol
        self.options = options
        self.location = location
        self._service: Any = None
        self._pid = -1
        self._lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        return {"protocol": self.protocol, "options": self.options, "location": self.location}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._service, self._pid, self._lock = None, -1, threading.Lock()

    @property
    def service(self) -> Any:
        """The ``BlobServiceClient`` of this process."""
        with self._lock:
            if self._service is None or self._pid != os.getpid():
                self._service = self._make_service()
                self._pid = os.getpid()
            return self._service

    def _make_service(self) -> Any:
        from azure.storage.blob import BlobServiceClient

        options = self.options
        given = _credential_options(options)
        settings: dict[str, Any] = {
            "retry_total": 0,
            "raw_request_hook": self._request_sent,
            "max_single_get_size": REQUEST_BYTES,
            "max_chunk_get_size": REQUEST_BYTES,
            "max_single_put_size": REQUEST_BYTES,
            "max_block_size": REQUEST_BYTES,
            **{name: options[name] for name in CLIENT_OPTIONS if name in options},
        }
        if given["connection_string"]:
            return BlobServiceClient.from_connection_string(given["connection_string"], **settings)
        name = given["account_name"]
        url = f"https://{options.get('account_host') or f'{name}.blob.core.windows.net'}"
        credential = options.get("credential")
        if credential is None and given["account_key"]:
            credential = {"account_name": name, "account_key": given["account_key"]}
        elif credential is None and given["sas_token"]:
            from azure.core.credentials import AzureSasCredential

            credential = AzureSasCredential(str(given["sas_token"]).lstrip("?"))
        elif credential is None and given["client_id"]:
            from azure.identity import ClientSecretCredential

            credential = ClientSecretCredential(
                str(given["tenant_id"]), str(given["client_id"]), str(given["client_secret"])
            )
        elif credential is None and not _anonymous(options):
            from azure.identity import DefaultAzureCredential

            credential = DefaultAzureCredential()
        return BlobServiceClient(url, credential=credential, **settings)

    def _request_sent(self, _: Any) -> None:
        count("requests", 1, self.location)

    def _blob(self, key: str) -> Any:
        container, _, name = key.partition("/")
        return self.service.get_blob_client(container, name)

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        """One ``List Blobs`` page of the names directly in ``folder`` (those after ``start_after``, from the first
        page on: Azure lists from the folder's start)."""
        from azure.storage.blob import BlobProperties

        container, _, path = folder.partition("/")
        prefix = path.strip("/") + "/" if path.strip("/") else ""
        client = self.service.get_container_client(container)
        pages = client.walk_blobs(name_starts_with=prefix, delimiter="/", results_per_page=PAGE_SIZE)
        with _named_errors(folder):
            paging = pages.by_page(continuation_token=page)
            entries = list(next(paging))
        names = {}
        for entry in entries:
            name = str(entry.name)[len(prefix) :]
            if isinstance(entry, BlobProperties) and name > start_after:  # not a folder (a ``BlobPrefix``)
                names[name] = int(entry.size or 0)
        return ListPage(names, paging.continuation_token or None)

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        if start is not None and end is not None and end <= start:
            return b""
        offset = start if end is None else start or 0
        length = None if end is None else end - (start or 0)
        with _named_errors(key):
            return bytes(self._blob(key).download_blob(offset=offset, length=length, max_concurrency=1).readall())

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        """One ranged GET: the blob's whole size comes in its ``Content-Range``; 416 where the blob is empty."""
        try:
            with _named_errors(key):
                download = self._blob(key).download_blob(offset=0, length=limit, max_concurrency=1)
                data = bytes(download.readall())
        except OSError as error:
            if error.errno == errno.EINVAL:
                return b"", 0
            raise
        total = str(download.properties.content_range or "").rpartition("/")[2]
        return data, int(total) if total.isdigit() else len(data)

    def size(self, key: str) -> int:
        with _named_errors(key):
            return int(self._blob(key).get_blob_properties().size)

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        with _named_errors(key):
            download = self._blob(key).download_blob(max_concurrency=1)
        with _named_errors(key), open(destination, "wb") as file:
            decoding = None if decoder is None else decoder(file)
            for chunk in download.chunks():
                if decoding is None:
                    file.write(chunk)
                else:
                    decoding.write(chunk)
            if decoding is not None:
                decoding.finish()

    def download_ranges(
        self, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
    ) -> None:
        """Not asked: ``ranged_downloads`` is False (a blob comes whole, in GETs of up to ``REQUEST_BYTES``)."""
        raise NotImplementedError(f"{self.protocol}:// blobs are downloaded whole")

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        """An upload with ``If-None-Match: *`` (a file streamed, in blocks where large); 409: the blob exists."""
        from azure.core.exceptions import ResourceExistsError

        def put(_: int) -> bool | None:
            try:
                with open(source, "rb") if isinstance(source, Path) else contextlib.nullcontext(source) as body:
                    with _named_errors(key):
                        self._blob(key).upload_blob(body, overwrite=False, max_concurrency=1)
            except ResourceExistsError:  # another writer's blob, or our earlier attempt's whose answer was lost
                return None
            return True

        return retrying.call(doing, put)

    def put(self, key: str, data: bytes) -> None:
        with _named_errors(key):
            self._blob(key).upload_blob(data, overwrite=True, max_concurrency=1)

    def delete(self, key: str) -> None:
        with _named_errors(key):
            self._blob(key).delete_blob()

    def abort_uploads(self, folder: str, older_than: float, retrying: Retrying, doing: str) -> list[str]:
        return []  # a block blob's uncommitted blocks are dropped by the service after a week

    def status(self, error: BaseException) -> int | None:
        """azure-core's ``HttpResponseError`` carries the answer's status as its ``status_code``."""
        code = getattr(error, "status_code", None)
        return code if isinstance(code, int) else None

    def broken_connection(self, error: BaseException) -> bool:
        return named_among(error, AZURE_BROKEN_CONNECTIONS)

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        return "ContainerNotFound" in str(error)

    def bucket_exists(self, bucket: str) -> bool:
        with _named_errors(bucket):
            return bool(self.service.get_container_client(bucket).exists())

    def close(self) -> None:
        with self._lock:
            service, self._service = self._service, None
        if service is not None and self._pid == os.getpid():
            service.close()


def _credential_options(options: dict[str, Any]) -> dict[str, Any]:
    """adlfs's credential options, each from its environment variable where not given."""
    return {name: options.get(name) or os.environ.get(variable) for name, variable in CREDENTIAL_OPTIONS.items()}


def _anonymous(options: dict[str, Any]) -> bool:
    """Whether to send requests unsigned (``anon``, else ``AZURE_STORAGE_ANON``), as adlfs decides."""
    if options.get("anon") is not None:
        return bool(options["anon"])
    return os.environ.get("AZURE_STORAGE_ANON", "false").lower() not in ("false", "0", "f", "")


@contextlib.contextmanager
def _named_errors(key: str) -> Iterator[None]:
    """The SDK's errors for a missing blob or container as FileNotFoundError, a range past a blob's end as EINVAL,
    each naming the key and the service's error code (``ContainerNotFound``, ``InvalidRange``); a request that did
    not get through (no connection) as ConnectionError."""
    from azure.core.exceptions import ResourceNotFoundError, ServiceRequestError
    from azure.storage.blob import StorageErrorCode

    try:
        yield
    except ServiceRequestError as error:
        raise ConnectionError(f"{key}: the request was not sent: {error}") from error
    except ResourceNotFoundError as error:
        raise FileNotFoundError(errno.ENOENT, f"{key}: {getattr(error, 'error_code', None) or 'not found'}") from error
    except Exception as error:
        code = getattr(error, "error_code", None)
        if code == StorageErrorCode.INVALID_RANGE or getattr(error, "status_code", None) == 416:
            raise OSError(
                errno.EINVAL, f"{key}: the range asked begins past the object's end (InvalidRange)"
            ) from error
        raise
