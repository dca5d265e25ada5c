"""A local S3 API server (moto) that counts the bytes it sends, for the object-storage benchmark.

``python -m benchmarks.remote.s3_server PORT`` serves on 127.0.0.1:PORT until killed. ``GET /_bench/counters`` returns
``{"get_requests": n, "get_bytes": n, "list_requests": n}`` (object GETs, whole or ranged, the body bytes
they sent, and bucket listings: one per page) and ``POST /_bench/counters`` resets them. Counting at
the server measures every reader the same way, whatever client library it uses.
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from moto.server import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import run_simple

COUNTERS = {"get_requests": 0, "get_bytes": 0, "list_requests": 0}
LOCK = threading.Lock()


def _counted(body: Iterable[bytes]) -> Iterator[bytes]:
    try:
        for chunk in body:
            with LOCK:
                COUNTERS["get_bytes"] += len(chunk)
            yield chunk
    finally:
        close = getattr(body, "close", None)
        if close is not None:
            close()


class Counting:
    """WSGI middleware: counts object GETs and their body bytes, and listings (GETs of a bucket)."""

    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self.app = app

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
        if environ["PATH_INFO"] == "/_bench/counters":
            if environ["REQUEST_METHOD"] == "POST":
                with LOCK:
                    COUNTERS.update(get_requests=0, get_bytes=0, list_requests=0)
            start_response("200 OK", [("Content-Type", "application/json")])
            return [json.dumps(COUNTERS).encode()]
        body = self.app(environ, start_response)
        is_object = environ["PATH_INFO"].count("/") >= 2 and not environ.get("QUERY_STRING")
        if environ["REQUEST_METHOD"] == "GET" and is_object:
            with LOCK:
                COUNTERS["get_requests"] += 1
            return _counted(body)
        if environ["REQUEST_METHOD"] == "GET" and environ["PATH_INFO"].strip("/").count("/") == 0:
            with LOCK:
                COUNTERS["list_requests"] += 1
        return body


if __name__ == "__main__":
    application = Counting(DomainDispatcherApplication(create_backend_app))
    run_simple("127.0.0.1", int(sys.argv[1]), application, threaded=True)
