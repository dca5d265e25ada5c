"""A store that throttles, resets connections and cuts bodies short (a fault proxy in front of the server).

Writers commit exactly their shards, loaders read exactly the fault-free batches, resume works,
the cache never shows a partial shard, and processes sharing a cache still download each shard once.
Retries are bounded, logged and counted; permanent errors are not retried.

The tests of one fault at a time run on S3 and Azure, whose clients leave retrying to guideloom; not on GCS:
gcsfs retries each failure on its own, seconds apart, in a way its public API does not let a test shorten (a
test would take minutes). The mixed schedules (about one request in three meets a fault) run on S3 only: their
seeds are chosen for S3's request lines. Each service's throttling and reset answers are retried in
test_remote_services.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._remote.object_store import ObjectStore
from tests.remote.conftest import ServiceStorage
from tests.remote.fault_proxy import FaultProxy
from tests.remote.remote_child import shard_tokens
from tests.remote.s3_support import S3Server

CHILD = Path(__file__).with_name("remote_child.py")
# The services whose clients leave retrying to guideloom (botocore's and the Azure SDK's retries are off).
FAULTED_SERVICES = ["s3", "azure"]
# A share of every kind of fault: about one request in three meets one. The proxy's schedule does not
# depend on the (random) bucket's name, so a seed gives a test the same faults in every run: seed 24 gives
# the writer every kind, the loader and the cache shard downloads cut short.
MIXED = {
    "slow_down": 0.08,
    "too_many": 0.04,
    "internal": 0.04,
    "reset_before": 0.04,
    "reset_after": 0.05,
    "short_body": 0.08,
    "delay": 0.05,
}


@pytest.fixture
def faulty(s3_server: S3Server) -> Iterator[FaultProxy]:
    proxy = FaultProxy(s3_server.port, MIXED, seed=24).start()
    yield proxy
    proxy.stop()


def _storage(url: str, endpoint: str, cache: Path, **options: Any) -> TokenStorage:
    return TokenStorage(url, storage_options={"endpoint_url": endpoint, **options}, cache_dir=cache)


def _on(service: ServiceStorage, cache: Path, **options: Any) -> TokenStorage:
    """A storage on the service, through its proxy (``options``: guideloom's own, e.g. ``request_attempts``)."""
    return TokenStorage(service.url, storage_options={**service.options, **options}, cache_dir=cache)


def _write(storage: TokenStorage, shards: range) -> None:
    with storage.sync_writer() as writer:
        for shard in shards:
            for tokens in shard_tokens(shard, documents=6, length=300):
                writer.append(shard, tokens)


def _epoch(storage: TokenStorage, **options: Any) -> list[list[list[int]]]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=64, shuffle=True, seed=3, **options
    ) as loader:
        return [batch.tolist() for batch in loader]


def _keys(s3_server: S3Server, bucket: str) -> list[str]:
    listing = boto3.client("s3", endpoint_url=s3_server.endpoint).list_objects_v2(Bucket=bucket)
    return sorted(item["Key"] for item in listing.get("Contents", []))


def test_writers_commit_exactly_their_shards_through_faults(
    s3_url: str, bucket: str, s3_server: S3Server, faulty: FaultProxy, tmp_path: Path
) -> None:
    storage = _storage(s3_url, faulty.endpoint, tmp_path / "w")
    _write(storage, range(6))
    shard_keys = [key for key in _keys(s3_server, bucket) if key.endswith(".shard")]
    assert shard_keys == [f"corpus/shards/{shard:012d}.shard" for shard in range(6)]
    # An answered fault (503, 429, 500) or a body cut short costs one retry, counted; a reset may cost none
    # (aiohttp resends an idempotent request once on a dropped connection, unseen), and a delay is no error.
    answered = sum(faulty.injected[name] for name in ("slow_down", "too_many", "internal"))
    assert answered > 0 and faulty.injected["short_body"] > 0
    errors = sum(faulty.injected.values()) - faulty.injected["delay"]
    assert answered + faulty.injected["short_body"] <= storage.retry_count <= errors
    direct = _storage(s3_url, s3_server.endpoint, tmp_path / "r")
    with direct.sync_reader() as reader:
        expected = [tokens for shard in range(6) for tokens in shard_tokens(shard, documents=6, length=300)]
        assert [reader.read(i).tolist() for i in range(len(reader))] == [tokens.tolist() for tokens in expected]


def test_a_loader_reads_the_fault_free_epoch_and_resumes(
    s3_url: str, s3_server: S3Server, faulty: FaultProxy, tmp_path: Path
) -> None:
    _write(_storage(s3_url, s3_server.endpoint, tmp_path / "w"), range(6))
    expected = _epoch(_storage(s3_url, s3_server.endpoint, tmp_path / "clean"))
    storage = _storage(s3_url, faulty.endpoint, tmp_path / "faulty")
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, sequence_length=64, shuffle=True, seed=3, num_workers=2
    ) as loader:
        batches = iter(loader)
        taken = [next(batches).tolist() for _ in range(5)]
        state = loader.state_dict()
    resumed = _storage(s3_url, faulty.endpoint, tmp_path / "resumed")
    with StatefulDataLoader.from_storage(
        resumed, device="cpu", local_batch_size=4, sequence_length=64, shuffle=True, seed=3
    ) as loader:
        loader.load_state_dict(state)
        taken += [batch.tolist() for batch in loader]
    assert taken == expected
    assert any(path.endswith(".shard") for path in faulty.cut_short)  # a shard's download was cut short


def test_the_cache_never_shows_a_partial_shard(
    s3_url: str, s3_server: S3Server, faulty: FaultProxy, tmp_path: Path
) -> None:
    _write(_storage(s3_url, s3_server.endpoint, tmp_path / "w"), range(6))
    local = TokenStorage(tmp_path / "local")
    _write(local, range(6))
    sizes = {path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir()}
    cache = tmp_path / "cache"
    seen: list[tuple[str, int]] = []
    stop = threading.Event()

    def watch() -> None:  # every visible shard file, while the epoch downloads them
        while not stop.is_set():
            for path in cache.rglob("*.shard"):
                seen.append((path.name, path.stat().st_size))

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        assert _epoch(_storage(s3_url, faulty.endpoint, cache)) == _epoch(local)
    finally:
        stop.set()
        watcher.join()
    assert seen and {size for _, size in seen} <= sizes
    assert list(cache.rglob("*.part")) == []
    assert any(path.endswith(".shard") for path in faulty.cut_short)  # the partial shard the cache never showed


def test_two_processes_sharing_a_cache_download_each_shard_once_through_faults(
    s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    _write(_storage(s3_url, s3_server.endpoint, tmp_path / "w"), range(3))
    # Seed 3: a shard's download fails twice (a 500 and a 503), the header's reads meet a 503 and a 429.
    proxy = FaultProxy(s3_server.port, {**MIXED, "reset_after": 0.0, "short_body": 0.0}, seed=3).start()
    try:
        readers = [
            subprocess.Popen(
                [
                    sys.executable,
                    str(CHILD),
                    json.dumps({"endpoint_url": proxy.endpoint}),
                    "read",
                    s3_url,
                    str(tmp_path / "shared"),
                ],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outputs = [reader.communicate(timeout=120) for reader in readers]
    finally:
        proxy.stop()
    total = sum(int(tokens.sum()) for shard in range(3) for tokens in shard_tokens(shard, documents=6, length=300))
    assert [out.strip() for out, _ in outputs] == [str(total)] * 2, outputs
    downloads = {path: count for (method, path), count in proxy.delivered.items() if path.endswith(".shard")}
    assert downloads == {f"/{bucket}/corpus/shards/{shard:012d}.shard": 1 for shard in range(3)}
    # Each process logs its retries (to stderr, as nothing configures logging there): one per answered fault.
    retries = [line for _, err in outputs for line in err.splitlines() if "retrying in" in line]
    answered = sum(proxy.injected[name] for name in ("slow_down", "too_many", "internal"))
    assert answered > 0 and answered <= len(retries) <= sum(proxy.injected.values()) - proxy.injected["delay"]
    assert any(line.startswith("downloading") and ".shard" in line for line in retries), retries


@pytest.mark.parametrize("service", FAULTED_SERVICES, indirect=True)
def test_a_create_whose_answer_was_lost_is_committed(service: ServiceStorage, tmp_path: Path) -> None:
    _on(service, tmp_path / "w").sync_writer().close()  # the header
    # Every PUT lands, then its connection is reset: the retry meets 412 (409 on Azure) on the writer's own object.
    with service.faults({"reset_after": 1.0}, applies=lambda method, path: method == "PUT") as proxy:
        _write(_on(service, tmp_path / "w"), range(2))
    # Each shard's and marker's first PUT landed unanswered; the resend (ours, or the HTTP client's own on a
    # kept-alive connection) met the refusal and found the writer's own bytes.
    assert proxy.injected["reset_after"] >= 4
    with _on(service, tmp_path / "r").sync_reader() as reader:
        assert len(reader) == 12


@pytest.mark.parametrize("service", FAULTED_SERVICES, indirect=True)
def test_a_retry_meeting_another_object_is_not_committed(service: ServiceStorage) -> None:
    service.put_object("x", b"theirs")
    # The first attempt is reset before it reaches the server; the retry finds someone else's object.
    with service.faults({"reset_before": 1.0}) as proxy:
        assert ObjectStore(service.url, service.options).create("x", b"mine") is False
    assert proxy.injected["reset_before"] >= 1
    assert service.object_bytes("x") == b"theirs"


@pytest.mark.parametrize("service", FAULTED_SERVICES, indirect=True)
@pytest.mark.parametrize(("fault", "status"), [("too_many", 429), ("slow_down", 503), ("internal", 500)])
def test_retries_are_bounded_logged_and_name_the_object(
    fault: str, status: int, service: ServiceStorage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    _write(_on(service, tmp_path / "w"), range(1))
    url = service.url
    with service.faults({fault: 1.0}, max_in_a_row=100) as proxy:  # 429: a code botocore does not know
        with caplog.at_level(logging.WARNING, logger="guideloom"):
            with pytest.raises(
                ConnectionError, match=rf"(?s)reading {url}/guideloom\.json failed.*3 attempts.*{status}"
            ):
                _on(service, tmp_path / "r", request_attempts=3)
    assert proxy.injected[fault] == 3  # guideloom's attempts, and no more: the client does not retry on its own
    retries = [record for record in caplog.records if record.name == "guideloom"]
    assert [record.getMessage().split(": attempt")[0] for record in retries] == [f"reading {url}/guideloom.json"] * 2


@pytest.mark.parametrize("service", FAULTED_SERVICES, indirect=True)
def test_a_denied_request_is_not_retried(service: ServiceStorage, tmp_path: Path) -> None:
    _write(_on(service, tmp_path / "w"), range(1))
    with service.faults({"forbidden": 1.0}, max_in_a_row=100) as proxy:
        with pytest.raises(PermissionError, match=rf"reading {service.url}/guideloom\.json was denied"):
            _on(service, tmp_path / "r")
    assert proxy.injected["forbidden"] == 1


def test_retry_options_are_checked(s3_url: str, s3_server: S3Server, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"request_attempts.*1 or more"):
        _storage(s3_url, s3_server.endpoint, tmp_path, request_attempts=0)
    with pytest.raises(ValueError, match=r"request_deadline_s.*positive"):
        _storage(s3_url, s3_server.endpoint, tmp_path, request_deadline_s="soon")


def test_an_iterator_whose_batch_failed_keeps_raising_and_a_fresh_one_continues(
    s3_url: str, s3_server: S3Server, tmp_path: Path
) -> None:
    local = TokenStorage(tmp_path / "local")
    _write(local, range(6))
    _write(_storage(s3_url, s3_server.endpoint, tmp_path / "w"), range(6))
    expected = [batch.tolist() for batch in _loader_batches(local)]
    largest = max(path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir())
    remote = TokenStorage(
        s3_url,
        storage_options={"endpoint_url": s3_server.endpoint, "request_attempts": 1},
        cache_dir=tmp_path / "cache",
        cache_limit_bytes=2 * largest,  # no room to prefetch: later shards are fetched when read
    )
    with StatefulDataLoader.from_storage(remote, device="cpu", local_batch_size=4, sequence_length=64) as loader:
        batches = iter(loader)
        taken = [next(batches).tolist()]
        s3_server.stop()
        try:
            with pytest.raises(ConnectionError, match=r"cannot be reached"):
                while True:
                    taken.append(next(batches).tolist())
            with pytest.raises(RuntimeError, match=r"call iter\(loader\) again") as again:
                next(batches)
            assert isinstance(again.value.__cause__, ConnectionError)
        finally:
            s3_server.start()
        taken += [batch.tolist() for batch in loader]
    assert taken == expected


def _loader_batches(storage: TokenStorage) -> list[Any]:
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=4, sequence_length=64) as loader:
        return [np.asarray(batch) for batch in loader]


def test_the_index_object_is_written_and_read_through_faults(
    s3_url: str, s3_server: S3Server, faulty: FaultProxy, tmp_path: Path
) -> None:
    direct = _storage(s3_url, s3_server.endpoint, tmp_path / "direct")
    _write(direct, range(0, 12, 2))
    assert _storage(s3_url, faulty.endpoint, tmp_path / "indexer").write_index() == 6
    _write(direct, range(1, 14, 4))  # committed after the index: in its gaps and past its end
    expected = direct.snapshot()
    for attempt in range(4):  # each opening meets other faults (the proxy counts each request line's occurrences)
        storage = _storage(s3_url, faulty.endpoint, tmp_path / f"reader{attempt}")
        assert storage.snapshot() == expected
        assert storage.index_problem is None  # the index was used: a body cut short was retried, not believed
    assert sum(faulty.injected.values()) > 0
