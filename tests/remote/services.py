"""The object-store services the remote tests run on, each a real emulator on 127.0.0.1 behind a proxy.

moto (S3, in this process), gcp-storage-emulator (GCS's JSON API, in this process) and Azurite (Azure Blob
Storage, an npm process). Each is reached through a ``FaultProxy`` that records every answer (method,
path, status, range, bytes), so tests count requests and bytes at the server side and can inject a
service's throttling. gcp-storage-emulator ignores ``ifGenerationMatch=0`` (a second create overwrites),
so its proxy answers GCS's 412 itself: an upload asking it, for an object that exists, is refused, one
such upload at a time (a resumable upload's condition is checked when it begins; GCS checks it when it
completes). Azurite answers ``If-None-Match: *`` with 409 itself; moto answers 412.
"""

from __future__ import annotations

import http.client
import json
import re
import subprocess
import time
import urllib.parse
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.remote.fault_proxy import FaultProxy

SERVICES = ("s3", "gcs", "azure")
AZURITE = Path(__file__).resolve().parents[2] / ".azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's development account: a public, well-known key (Azure's documentation prints it).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_FLAGS = ("--skipApiVersionCheck", "--disableTelemetry", "--silent")
_GCS_UPLOAD = re.compile(r"^/upload/storage/v1/b/([^/?]+)/o\?")
_GCS_NAME = re.compile(rb'"name": ("(?:[^"\\]|\\.)*")')


class GcsCreateProxy(FaultProxy):
    """A proxy in front of gcp-storage-emulator that answers 412 to a create (``ifGenerationMatch=0``) of an
    object that exists, as GCS does; such uploads go one at a time, so the check and the write are atomic."""

    def exclusive(self, method: str, target: str) -> bool:
        return method == "POST" and _GCS_UPLOAD.match(target) is not None and "ifGenerationMatch=0" in target

    def refusal(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes] | None:
        if not self.exclusive(method, target):
            return None
        match = _GCS_UPLOAD.match(target)
        assert match is not None
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(target).query)
        names = query.get("name") or [json.loads(found.group(1)) for found in [_GCS_NAME.search(body)] if found]
        if not names:
            return None
        bucket, name = match.group(1), names[0]
        connection = http.client.HTTPConnection("127.0.0.1", self.upstream_port, timeout=60)
        try:
            connection.request("GET", f"/storage/v1/b/{bucket}/o/{urllib.parse.quote(name, safe='')}")
            exists = connection.getresponse().status == 200
        finally:
            connection.close()
        if not exists:
            return None
        error = {"error": {"code": 412, "message": "At least one of the pre-conditions you specified did not hold."}}
        return 412, "application/json", json.dumps(error).encode()


@dataclass
class Service:
    """One running service: its scheme, the options a storage on it is opened with, and the proxy's records."""

    name: str
    scheme: str
    proxy: FaultProxy
    options: dict[str, Any]
    upstream_options: dict[str, Any]  # the emulator itself: what tests do besides the storage goes unrecorded
    stop_upstream: Any = None
    made: list[str] = field(default_factory=list)

    def new_bucket(self) -> str:
        """A fresh, empty bucket (an Azure container) on the service."""
        import fsspec

        bucket = f"bucket-{uuid.uuid4().hex[:12]}"
        fsspec.filesystem(self.scheme, skip_instance_cache=True, **self.upstream_options).mkdir(bucket)
        return bucket

    def url(self, bucket: str, prefix: str = "corpus") -> str:
        return f"{self.scheme}://{bucket}/{prefix}"

    def in_bucket(self, bucket: str, path: str) -> bool:
        """Whether a request's path names an object (or a listing) of ``bucket``."""
        if self.name == "gcs":
            return f"/b/{bucket}/" in path or path.endswith(f"/b/{bucket}")
        where = f"/{AZURITE_ACCOUNT}/{bucket}" if self.name == "azure" else f"/{bucket}"
        return path.startswith(where + "/") or path.startswith(where + "?")

    def answers(self, bucket: str) -> list[tuple[str, str, int, str, int]]:
        """The proxy's records of the requests about ``bucket``: (method, path, status, Range, body bytes)."""
        return [answer for answer in list(self.proxy.answered) if self.in_bucket(bucket, answer[1])]

    def object_reads(self, bucket: str, key_part: str = "") -> list[tuple[str, str, int, int]]:
        """(path, Range header, status, bytes) of the successful reads of objects' bytes in ``bucket``, in order."""
        return [
            (path, byte_range, status, size)
            for method, path, status, byte_range, size in self.answers(bucket)
            if self.is_object_read(method, path, status) and key_part in urllib.parse.unquote(path)
        ]

    def is_object_read(self, method: str, path: str, status: int) -> bool:
        """Whether a request read an object's bytes, successfully."""
        if method != "GET" or status >= 300:
            return False
        if self.name == "gcs":
            return "alt=media" in path  # not metadata or a listing
        return not any(word in path for word in ("comp=", "restype=", "list-type", "uploads"))  # nor the bucket's

    def listing(self, method: str, path: str) -> bool:
        """Whether a request is a listing of objects."""
        if method != "GET":
            return False
        if self.name == "gcs":
            return re.search(r"/b/[^/]+/o(\?|$)", path) is not None
        return ("comp=list" in path) if self.name == "azure" else ("list-type" in path)

    def object_name(self, bucket: str, path: str) -> str:
        """The name in ``bucket`` of the object a request's path names (``corpus/shards/...``)."""
        path = urllib.parse.urlsplit(path).path
        if self.name == "gcs":
            return urllib.parse.unquote(path.split(f"/b/{bucket}/o/", 1)[1])
        where = f"/{AZURITE_ACCOUNT}/{bucket}/" if self.name == "azure" else f"/{bucket}/"
        return urllib.parse.unquote(path.removeprefix(where))

    def stop(self) -> None:
        self.proxy.stop()
        if self.stop_upstream is not None:
            self.stop_upstream()


def start_gcs(port: int) -> Service:
    """gcp-storage-emulator in this process (in memory) behind a ``GcsCreateProxy``."""
    from gcp_storage_emulator.server import create_server

    server = create_server("127.0.0.1", port, in_memory=True)
    server.start()
    proxy = GcsCreateProxy(port, {}).start()
    options = {"token": "anon", "project": "guideloom-tests"}
    upstream = {"endpoint_url": f"http://127.0.0.1:{port}", **options}
    return Service("gcs", "gs", proxy, {"endpoint_url": proxy.endpoint, **options}, upstream, server.stop)


def start_azurite(port: int, location: Path) -> Service:
    """Azurite's blob service (npm, ``scripts/setup.sh`` installs it) behind a ``FaultProxy``."""
    process = subprocess.Popen(
        [str(AZURITE), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--location", str(location), *AZURITE_FLAGS],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 60
    while True:
        try:
            http.client.HTTPConnection("127.0.0.1", port, timeout=1).connect()
            break
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                process.kill()
                raise RuntimeError(f"azurite did not start on port {port}") from None
            time.sleep(0.1)

    def stop() -> None:
        process.terminate()
        process.wait(timeout=30)

    proxy = FaultProxy(port, {}).start()

    def connection(endpoint: str) -> dict[str, Any]:
        return {
            "connection_string": f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};"
            f"AccountKey={AZURITE_KEY};BlobEndpoint={endpoint}/{AZURITE_ACCOUNT};"
        }

    return Service("azure", "az", proxy, connection(proxy.endpoint), connection(f"http://127.0.0.1:{port}"), stop)


def start_s3_proxy(moto_port: int) -> Service:
    """A ``FaultProxy`` in front of the tests' moto server."""
    proxy = FaultProxy(moto_port, {}).start()
    return Service(
        "s3", "s3", proxy, {"endpoint_url": proxy.endpoint}, {"endpoint_url": f"http://127.0.0.1:{moto_port}"}
    )


class StaticFiles:
    """A static HTTP server over a directory, answering ``Range`` requests (as a CDN does), on 127.0.0.1."""

    def __init__(self, directory: Path) -> None:
        import functools
        from http.server import ThreadingHTTPServer

        self.requests: list[tuple[str, str, str]] = []  # (method, path, Range header)
        handler = functools.partial(_RangeHandler, directory=str(directory), served=self)
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self._server.daemon_threads = True
        import threading

        threading.Thread(target=self._server.serve_forever, name="static-files", daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()


def _range_handler_base() -> type[Any]:
    from http.server import SimpleHTTPRequestHandler

    return SimpleHTTPRequestHandler


class _RangeHandler(_range_handler_base()):  # type: ignore[misc]
    """``SimpleHTTPRequestHandler`` with single byte ranges (``bytes=A-B``, ``bytes=A-``) answered 206."""

    protocol_version = "HTTP/1.1"

    def __init__(self, *args: Any, served: StaticFiles, **kwargs: Any) -> None:
        self.served = served
        super().__init__(*args, **kwargs)

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_HEAD(self) -> None:
        self.served.requests.append(("HEAD", self.path, ""))
        super().do_HEAD()

    def do_GET(self) -> None:
        byte_range = self.headers.get("Range", "")
        self.served.requests.append(("GET", self.path, byte_range))
        path = Path(self.translate_path(self.path))
        match = re.fullmatch(r"bytes=(\d+)-(\d*)", byte_range)
        if not byte_range or match is None or not path.is_file():
            super().do_GET()
            return
        data = path.read_bytes()
        start = int(match.group(1))
        end = min(len(data), int(match.group(2)) + 1) if match.group(2) else len(data)
        if start >= len(data):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{len(data)}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(206)
        self.send_header("Content-Type", "application/octet-stream")
        self.send_header("Content-Range", f"bytes {start}-{end - 1}/{len(data)}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        self.wfile.write(data[start:end])
