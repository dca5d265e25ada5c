"""A real S3 API server on 127.0.0.1 (moto's ThreadedMotoServer) for the object-storage tests.

The server runs in the test process; its request log (werkzeug's, one record per HTTP request) is
captured, so tests count on the server side what every process asked for. Credentials are dummy
values in the environment, as a user's would be; subprocesses inherit them.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest

from tests.helpers.processes import free_port
from tests.remote.fault_proxy import FaultProxy
from tests.remote.s3_support import DUMMY_CREDENTIALS, RequestLog, S3Server
from tests.remote.services import AZURITE, SERVICES, Service, start_azurite, start_gcs, start_s3_proxy

# gcsfs asks each bucket's layout over gRPC unless told not to: against the emulator, a minute a call.
os.environ["GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT"] = "false"


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[S3Server]:
    # The default cache directory too: a storage opened without cache_dir must not write under ~/.cache.
    environment = {**DUMMY_CREDENTIALS, "GUIDELOOM_CACHE_DIR": str(tmp_path_factory.mktemp("default-cache"))}
    saved = {name: os.environ.get(name) for name in environment}
    os.environ.update(environment)
    log = RequestLog()
    werkzeug = logging.getLogger("werkzeug")
    werkzeug.addHandler(log)
    werkzeug.setLevel(logging.INFO)
    werkzeug.propagate = False  # the log is counted, not printed
    server = S3Server(free_port(), log)
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


@pytest.fixture(scope="session")
def s3_service(s3_server: S3Server) -> Iterator[Service]:
    service = start_s3_proxy(s3_server.port)
    yield service
    service.stop()


@pytest.fixture(scope="session")
def gcs_service(s3_server: S3Server) -> Iterator[Service]:  # s3_server: the dummy credentials and default cache
    pytest.importorskip("gcp_storage_emulator", reason="the GCS emulator comes with the test extra")
    service = start_gcs(free_port())
    yield service
    service.stop()


@pytest.fixture(scope="session")
def azure_service(s3_server: S3Server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Service]:
    if not AZURITE.exists():
        pytest.skip("Azurite is not installed (scripts/setup.sh installs it with npm)")
    service = start_azurite(free_port(), tmp_path_factory.mktemp("azurite"))
    yield service
    service.stop()


@dataclass
class ServiceStorage:
    """Where a test's storage lives on one service: its URL (not created yet), options and the service; its
    objects reached with fsspec's client of the service (as a user's other tools would), past the proxy, and the
    requests the service's proxy answered about its bucket, objects named as in the bucket (``corpus/shards/...``)."""

    service: Service
    bucket: str
    url: str
    options: dict[str, Any]

    @property
    def name(self) -> str:
        return self.service.name

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """The service unreachable (its proxy refuses connections, and resets those open) for the block's time."""
        self.service.proxy.outage()
        try:
            yield
        finally:
            self.service.proxy.restart()

    @contextlib.contextmanager
    def faults(
        self, rates: dict[str, float], max_in_a_row: int = 1, applies: Callable[[str, str], bool] | None = None
    ) -> Iterator[FaultProxy]:
        """The service's proxy injecting faults at ``rates`` for the block's time (its ``injected`` counted afresh)."""
        proxy = self.service.proxy
        proxy.rates, proxy.max_in_a_row, proxy.applies, proxy.injected = dict(rates), max_in_a_row, applies, Counter()
        try:
            yield proxy
        finally:
            proxy.rates, proxy.max_in_a_row, proxy.applies = {}, 2, None

    def filesystem(self) -> Any:
        import fsspec

        return fsspec.filesystem(self.service.scheme, skip_instance_cache=True, **self.service.upstream_options)

    def object_path(self, name: str) -> str:
        """The fsspec path of the object ``name`` of the storage (``shards/...``)."""
        return f"{self.url.split('://', 1)[1]}/{name}"

    def put_object(self, name: str, data: bytes) -> None:
        self.filesystem().pipe_file(self.object_path(name), data)

    def object_bytes(self, name: str) -> bytes:
        return bytes(self.filesystem().cat_file(self.object_path(name)))

    def delete_object(self, name: str) -> None:
        self.filesystem().rm_file(self.object_path(name))

    def object_names(self) -> list[str]:
        """The names of the storage's objects (``shards/...``), sorted."""
        root = self.url.split("://", 1)[1]
        return sorted(path.removeprefix(root + "/") for path in self.filesystem().find(root))

    def requests(self) -> list[tuple[str, str, int, str, int]]:
        """(method, path, status, Range header, body bytes) of every request answered about the bucket."""
        return self.service.answers(self.bucket)

    def listings(self) -> list[str]:
        """The paths of the listings of objects the service answered about the bucket, in order."""
        return [path for method, path, _, _, _ in self.requests() if self.service.listing(method, path)]

    def reads(self, key_part: str = "") -> list[tuple[str, str, int, int]]:
        """(object name, Range header, status, bytes) of the successful reads of objects' bytes, in order."""
        return [
            (self.service.object_name(self.bucket, path), byte_range, status, size)
            for path, byte_range, status, size in self.service.object_reads(self.bucket, key_part)
        ]

    def gets(self, key_part: str = "") -> list[str]:
        """Names of the objects read whole (all the bytes the object holds now), one entry a request, in order.

        Told by bytes, not by status or header: the Azure SDK asks a whole blob as a range too (``x-ms-range``)."""
        sizes = self.object_sizes()
        return [name for name, _, _, size in self.reads(key_part) if size == sizes.get(name)]

    def ranged_gets(self, key_part: str = "") -> list[str]:
        """Names of the objects read in part, one entry a request, in order."""
        sizes = self.object_sizes()
        return [name for name, _, _, size in self.reads(key_part) if size != sizes.get(name)]

    def byte_ranges(self, key_part: str = "") -> list[tuple[str, str]]:
        """(name, range asked) of the reads of a part of an object, in order."""
        sizes = self.object_sizes()
        return [(name, asked) for name, asked, _, size in self.reads(key_part) if size != sizes.get(name)]

    def object_sizes(self) -> dict[str, int]:
        """The sizes of the bucket's objects now, by name in the bucket."""
        found = self.filesystem().find(self.bucket, detail=True)
        return {path.removeprefix(f"{self.bucket}/"): int(info["size"]) for path, info in found.items()}

    def bytes_read(self, key_part: str = "") -> int:
        return sum(size for _, _, _, size in self.reads(key_part))


@pytest.fixture(params=SERVICES)
def service(request: pytest.FixtureRequest) -> ServiceStorage:
    """A storage URL in a fresh bucket on each service (S3, GCS, Azure) in turn."""
    running: Service = request.getfixturevalue(f"{request.param}_service")
    bucket = running.new_bucket()
    return ServiceStorage(running, bucket, running.url(bucket), dict(running.options))
