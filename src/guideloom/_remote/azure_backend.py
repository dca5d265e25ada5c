"""Azure Blob Storage (``az://``, ``abfs://``): the object-store backend through adlfs's public calls.

A create is an upload with ``If-None-Match: *`` (adlfs's ``mode="create"``; Azure answers 409 where the
blob exists); reads are ``cat_file`` (ranged where asked), listings ``ls``, whole downloads ``get_file``.
The Azure SDK under adlfs retries throttling (429, 503), 5xx answers and dropped connections itself
(3 retries, 15 s and more apart; adlfs passes no retry settings to it); guideloom's retries come on top.
"""

from __future__ import annotations

from typing import Any

from guideloom._remote.fsspec_backend import ConditionalFsspecBackend
from guideloom._remote.object_backend import BROKEN_CONNECTIONS, named_among

# azure-core's classes for "the request did not get through" and "the response came incomplete", by name.
AZURE_BROKEN_CONNECTIONS = BROKEN_CONNECTIONS | {"ServiceRequestError", "ServiceResponseError", "IncompleteReadError"}


class AzureBackend(ConditionalFsspecBackend):
    """The blobs of an Azure container through adlfs (one filesystem per process)."""

    def __init__(self, protocol: str, options: dict[str, Any]) -> None:
        super().__init__(protocol, {"use_listings_cache": False, **options})

    def status(self, error: BaseException) -> int | None:
        """azure-core's ``HttpResponseError`` carries the answer's status as its ``status_code``."""
        code = getattr(error, "status_code", None)
        return code if isinstance(code, int) else None

    def broken_connection(self, error: BaseException) -> bool:
        return named_among(error, AZURE_BROKEN_CONNECTIONS)

    def missing_bucket(self, error: FileNotFoundError) -> bool:
        text = str(error)
        return "ContainerNotFound" in text or "container does not exist" in text
