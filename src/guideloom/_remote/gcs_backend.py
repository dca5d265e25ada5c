"""Google Cloud Storage (``gs://``, ``gcs://``): the object-store backend through gcsfs's public calls.

A create is an upload with ``ifGenerationMatch=0`` (gcsfs's ``mode="create"``; GCS answers 412 where the
object exists); a read is one GET (``cat_file``, ranged where asked), the start of an object one ranged GET
whose ``Content-Range`` gives the whole size, a size one request for the object's metadata, a listing
``ls`` and a whole download one GET (``get_file`` with ``concurrency=1``: gcsfs's default asks the object's
metadata and whether it is a folder first). gcsfs retries 408, 429 and 5xx answers and dropped connections
itself (6 tries, 1 to 17 s apart, not configurable through its public API); guideloom's retries come on top,
for what outlasts them. So that ``loader.metrics()`` counts every request the service answers, theirs
included, each request gcsfs sends is counted where aiohttp sends it (a trace hook in ``session_kwargs``).
"""

from __future__ import annotations

import errno
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from guideloom._core.metrics import count
from guideloom._remote.fsspec_backend import ConditionalFsspecBackend
from guideloom._remote.object_backend import BROKEN_CONNECTIONS, Decoder, named_among

# requests' and aiohttp's classes for "the connection failed or the response was incomplete", by name.
GCS_BROKEN_CONNECTIONS = BROKEN_CONNECTIONS | {"ChunkedEncodingError", "ServerDisconnectedError", "ReadTimeout"}


class GcsBackend(ConditionalFsspecBackend):
    """The objects of a GCS bucket through gcsfs (one filesystem per process)."""

    counts_requests = True

    def __init__(self, protocol: str, options: dict[str, Any], location: str = "") -> None:
        super().__init__(protocol, {"use_listings_cache": False, **options}, location)

    def filesystem_options(self) -> dict[str, Any]:
        """The storage's options, with a trace of aiohttp's requests added to the user's ``session_kwargs``."""
        import aiohttp

        tracing = aiohttp.TraceConfig()
        tracing.on_request_start.append(self._request_started)
        session = dict(self.options.get("session_kwargs") or {})
        session["trace_configs"] = [*session.get("trace_configs", []), tracing]
        return {**self.options, "session_kwargs": session}

    async def _request_started(self, *_: Any) -> None:
        count("requests", 1, self.location)

    def read_start(self, key: str, limit: int) -> tuple[bytes, int]:
        """One ranged GET; the whole size from its ``Content-Range`` (a 416 answer: the object is empty)."""
        fs = self.fs
        try:
            headers, data = fs.call("GET", fs.url(key), headers={"Range": f"bytes=0-{limit - 1}"})
        except Exception as error:
            if self.status(error) == 416:
                return b"", 0
            raise
        total = str(headers.get("Content-Range") or "").rpartition("/")[2]
        return bytes(data), int(total) if total.isdigit() else len(data)

    def size(self, key: str) -> int:
        """One request for the object's metadata (gcsfs's ``info`` also lists, to learn whether it is a folder)."""
        bucket, path, _ = self.fs.split_path(key)
        if not path:
            raise FileNotFoundError(errno.ENOENT, "not an object", key)
        found = self.fs.call("GET", "b/{}/o/{}", bucket, path, json_out=True)
        return int(found.get("size") or 0)

    def download(self, key: str, destination: Path, decoder: Callable[[IO[bytes]], Decoder] | None) -> None:
        if decoder is None:
            self.fs.get_file(key, str(destination), concurrency=1)
            return
        super().download(key, destination, decoder)

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
