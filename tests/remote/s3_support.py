"""The S3 API server the object-storage tests run against, and what it answered (see conftest.py)."""

from __future__ import annotations

import logging
import re
import threading
import uuid
from dataclasses import dataclass
from typing import Any

_REQUEST_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d+)(?: \S+ range=(\S+))?')
_TERMINAL_STYLE = re.compile(r"\x1b\[[0-9;]*m")  # werkzeug colours the request line of answers other than 200
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class RequestLog(logging.Handler):
    """Records (method, path, status) of every request the server answers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.requests: list[tuple[str, str, int]] = []
        self.ranges: list[tuple[str, str, int, str]] = []  # (method, path, status, Range header) of ranged requests
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        match = _REQUEST_LINE.search(_TERMINAL_STYLE.sub("", record.getMessage()))
        if match is not None:
            with self._lock:
                self.requests.append((match.group(1), match.group(2), int(match.group(3))))
                if match.group(4) is not None:
                    self.ranges.append((match.group(1), match.group(2), int(match.group(3)), match.group(4)))


@dataclass
class S3Server:
    """The running server: its endpoint, and the requests it answered."""

    port: int
    log: RequestLog
    server: Any = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint}

    def start(self) -> None:
        self.server = _range_logging_server()(ip_address="127.0.0.1", port=self.port, verbose=False)
        self.server.start()

    def stop(self) -> None:
        """Stop answering (the stored objects stay: moto keeps them in this process)."""
        self.server.stop()

    def new_bucket(self) -> str:
        import boto3

        name = f"bucket-{uuid.uuid4().hex[:12]}"
        boto3.client("s3", endpoint_url=self.endpoint).create_bucket(Bucket=name)
        return name

    def gets(self, bucket: str, key_part: str = "") -> list[str]:
        """Paths of the successful whole-object GETs in ``bucket`` (status 200; listings excluded), in order."""
        return [path for path, status in self._object_gets(bucket, key_part) if status == 200]

    def ranged_gets(self, bucket: str, key_part: str = "") -> list[str]:
        """Paths of the GETs of a range of an object in ``bucket`` (status 206: partial content), in order."""
        return [path for path, status in self._object_gets(bucket, key_part) if status == 206]

    def byte_ranges(self, bucket: str, key_part: str = "") -> list[tuple[str, str]]:
        """(path, Range header) of the successful ranged GETs of objects in ``bucket`` (status 206), in order."""
        prefix = f"/{bucket}/"
        return [
            (path, byte_range)
            for method, path, status, byte_range in list(self.log.ranges)
            if method == "GET" and path.startswith(prefix) and key_part in path and status == 206
        ]

    def _object_gets(self, bucket: str, key_part: str) -> list[tuple[str, int]]:
        prefix = f"/{bucket}/"
        return [
            (path, status)
            for method, path, status in list(self.log.requests)
            if method == "GET" and path.startswith(prefix) and "?" not in path and key_part in path and status < 300
        ]


def _range_logging_server() -> type[Any]:
    """moto's threaded server, whose request log line also names a request's ``Range`` header."""
    from moto.moto_server.threaded_moto_server import ThreadedMotoServer
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from werkzeug.serving import make_server

    class RangeLoggingHandler(MotoRequestHandler):
        def log_request(self, code: int | str = "-", size: int | str = "-") -> None:
            byte_range = self.headers.get("Range")
            super().log_request(code, size if byte_range is None else f"{size} range={byte_range}")

    class RangeLoggingMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:  # moto's own, with the handler above
            app = DomainDispatcherApplication(create_backend_app)
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=RangeLoggingHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return RangeLoggingMotoServer
