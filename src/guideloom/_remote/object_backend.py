"""The seam between a storage's objects and one object-store service: a few requests a service's client makes.

``ObjectStore`` (names, retries, errors a user can act on, the checks a create needs) asks a backend
only these, so a service is one module that implements them and one line in ``object_store.BACKENDS``
that chooses it by the URL's scheme (``s3_backend`` for S3; ``fsspec_backend`` for any other fsspec
filesystem, where a create is "check, then put"). Keys are the object's whole path without the scheme
(``bucket/prefix/name``). A method makes one attempt, except where it takes ``retrying``: those make
several requests (a multipart upload, a download in ranged parts) and retry each on its own. An object
that is absent is ``FileNotFoundError``.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import IO, NamedTuple, Protocol

from guideloom._remote.retries import Retrying

DOWNLOAD_CHUNK = 4 * 1024 * 1024  # bytes a download moves at a time
PAGE_SIZE = 1000  # names a listing page holds at most (S3's maximum and default)
# Exception classes of fsspec's HTTP clients (aiohttp, http.client, fsspec) that mean "the connection
# failed or the response was incomplete", matched by name so that none of them is imported here.
BROKEN_CONNECTIONS = frozenset({"ClientPayloadError", "ClientConnectionError", "IncompleteRead", "FSTimeoutError"})


class Decoder(Protocol):
    """What a download's bytes go through on their way into the file (a decompressor)."""

    def write(self, chunk: bytes) -> None: ...

    def finish(self) -> None: ...


class ListPage(NamedTuple):
    """One answer to a listing: names (relative to the listed folder) with their sizes, and where the next
    page starts (None where the listing is complete)."""

    names: dict[str, int]
    next_page: str | None


class ObjectBackend(Protocol):
    """The requests of one object-store service (see the module's docstring); picklable: its client is made
    afresh in each process that uses it. Made as ``Backend(protocol, options, location)``: the URL's scheme,
    the storage's options for the service's client, and the storage's URL (what its requests are counted for)."""

    atomic_creates: bool  # whether ``create`` is atomic against a racing create (a conditional put)
    ranged_downloads: bool  # whether ``download_ranges`` may be used (ranged GETs side by side)
    listable: bool  # whether ``list_page`` lists (a static HTTP server cannot: read through the index object)
    # whether it counts each HTTP request it sends itself (``_core.metrics``: "requests" for the storage's
    # location, its client's own retries included); where not, ``Retrying`` counts one request an attempt
    counts_requests: bool

    def list_page(self, folder: str, start_after: str, page: str | None) -> ListPage:
        """The objects directly in ``folder`` whose names sort after ``start_after`` (``page``: where an earlier
        answer said the next page starts). Empty where the folder holds nothing."""
        ...

    def read(self, key: str, start: int | None = None, end: int | None = None) -> bytes:
        """The object's bytes, or those in ``[start, end)``."""
        ...

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        """The object's first ``limit`` bytes (fewer if it is smaller) and its whole size."""
        ...

    def size(self, key: str) -> int:
        """The object's size in bytes."""
        ...

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        """Write the whole object into ``destination`` (created or truncated), through ``decoder`` if given."""
        ...

    def download_ranges(
        self, key: str, destination: Path, ranges: list[tuple[int, int]], retrying: Retrying, doing: str
    ) -> None:
        """Write the object's byte ``ranges`` into ``destination`` (created or truncated), side by side, each
        retried on its own (only where ``ranged_downloads``)."""
        ...

    def create(self, key: str, source: bytes | Path, retrying: Retrying, doing: str) -> bool | None:
        """Create the object from bytes or a local file unless it exists: True if created, False if it existed
        before, None if it was found existing after an attempt whose answer was lost (whose bytes: unknown)."""
        ...

    def put(self, key: str, data: bytes) -> None:
        """Put ``data`` under ``key``, replacing what is there."""
        ...

    def delete(self, key: str) -> None:
        """Delete the object."""
        ...

    def abort_uploads(self, folder: str, older_than: float, retrying: Retrying, doing: str) -> list[str]:
        """Abort unfinished multipart uploads under ``folder`` begun ``older_than`` seconds ago or more; their keys."""
        ...

    def status(self, error: BaseException) -> int | None:
        """The HTTP status the service answered, read from one error of its client; None if it holds none."""
        ...

    def broken_connection(self, error: BaseException) -> bool:
        """Whether one error of its client means the connection failed or the response came incomplete."""
        ...

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        """Whether a missing object's error says the bucket (so the whole storage) is missing."""
        ...

    def bucket_exists(self, bucket: str) -> bool:
        """Whether the bucket (an Azure container) exists: asked where an object is missing and its error does
        not say why (GCS and Azure answer a read in a missing bucket as a missing object)."""
        ...

    def close(self) -> None:
        """Let go of the client (a later request makes a new one)."""
        ...


def named_among(error: BaseException, names: frozenset[str]) -> bool:
    """Whether the error's class or one of its bases is named in ``names``."""
    return any(kind.__name__ in names for kind in type(error).__mro__)


def require_fsspec(protocol: str) -> None:
    """ImportError, saying what to install, where fsspec or its implementation of ``protocol`` is missing."""
    try:
        import fsspec
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ImportError("fsspec (and s3fs for s3://): pip install 'guideloom[remote]'") from None
    try:
        fsspec.get_filesystem_class(protocol)
    except (ImportError, ValueError) as error:
        raise ImportError(f"the fsspec implementation of {protocol}://: {error}") from None
