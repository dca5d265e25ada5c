"""Google Cloud Storage (``gs://``, ``gcs://``): the object-store backend through gcsfs's public calls.

A create is an upload with ``ifGenerationMatch=0`` (gcsfs's ``mode="create"``; GCS answers 412 where the
object exists); reads are ``cat_file`` (ranged where asked), listings ``ls``, whole downloads ``get_file``.
gcsfs retries 408, 429 and 5xx answers and dropped connections itself (6 tries, 1 to 17 s apart, not
configurable through its public API); guideloom's retries come on top, for what outlasts them.
"""

from __future__ import annotations

from typing import Any

from guideloom._remote.fsspec_backend import ConditionalFsspecBackend
from guideloom._remote.object_backend import BROKEN_CONNECTIONS, named_among

# requests' and aiohttp's classes for "the connection failed or the response was incomplete", by name.
GCS_BROKEN_CONNECTIONS = BROKEN_CONNECTIONS | {"ChunkedEncodingError", "ServerDisconnectedError", "ReadTimeout"}


class GcsBackend(ConditionalFsspecBackend):
    """The objects of a GCS bucket through gcsfs (one filesystem per process)."""

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        super().__init__(protocol, {"use_listings_cache": False, **options})

    def status(self, error: BaseException) -> int | None:
        """gcsfs's ``HttpError`` carries the answer's status as its ``code``."""
        code = getattr(error, "code", None)
        if isinstance(code, int):
            return code
        return int(code) if isinstance(code, str) and code.isdigit() else None

    def broken_connection(self, error: BaseException) -> bool:
        return named_among(error, GCS_BROKEN_CONNECTIONS)

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        text = str(error)
        return "bucket does not exist" in text or "No such bucket" in text
