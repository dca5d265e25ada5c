"""A real S3 API server on 127.0.0.1 (moto's ThreadedMotoServer) for the object-storage tests.

The server runs in the test process; its request log (werkzeug's, one record per HTTP request) is
captured, so tests count on the server side what every process asked for. Credentials are dummy
values in the environment, as a user's would be; subprocesses inherit them.
"""

from __future__ import annotations

import logging
import os
import re
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

_REQUEST_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/[0-9.]+" (\d+)')
DUMMY_CREDENTIALS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


class _RequestLog(logging.Handler):
    """Records (method, path, status) of every request the server answers."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.requests: list[tuple[str, str, int]] = []
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        match = _REQUEST_LINE.search(record.getMessage())
        if match is not None:
            with self._lock:
                self.requests.append((match.group(1), match.group(2), int(match.group(3))))


@dataclass
class S3Server:
    """The running server: its endpoint, and the requests it answered."""

    port: int
    log: _RequestLog
    server: Any = None
    buckets: list[str] = field(default_factory=list)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def options(self) -> dict[str, Any]:
        return {"endpoint_url": self.endpoint}

    def start(self) -> None:
        from moto.server import ThreadedMotoServer

        self.server = ThreadedMotoServer(ip_address="127.0.0.1", port=self.port, verbose=False)
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
        """Paths of the successful whole-object GETs in ``bucket`` (listings excluded), in order."""
        prefix = f"/{bucket}/"
        return [
            path
            for method, path, status in list(self.log.requests)
            if method == "GET" and path.startswith(prefix) and "?" not in path and key_part in path and status < 300
        ]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    saved = {name: os.environ.get(name) for name in DUMMY_CREDENTIALS}
    os.environ.update(DUMMY_CREDENTIALS)
    log = _RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # the log is counted, not printed
    server = S3Server(_free_port(), log)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        werkzeug.removeHandler(log)
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the server."""
    return s3_server.new_bucket()


@pytest.fixture
def s3_url(bucket: str) -> str:
    """The URL of a storage that does not exist yet, in a fresh bucket."""
    return f"s3://{bucket}/corpus"
