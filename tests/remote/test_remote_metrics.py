"""A loader's metrics (requests, bytes, cache use, waits) against what the service's proxy counted it answered."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, TokenStorage
from tests.remote.conftest import ServiceStorage

SHARDS = 12


def _served(service: ServiceStorage, since: int) -> tuple[int, int]:
    """The requests the service's proxy answered about the storage's bucket since its record ``since``, and the
    bytes of objects they carried (whole objects, or the ranges asked for)."""
    requests = service.requests()[since:]
    carried = sum(
        size for method, path, status, _, size in requests if service.service.is_object_read(method, path, status)
    )
    return len(requests), carried


def _requests_counted(service: ServiceStorage, counted: int, answered: int) -> None:
    """The loader's count of requests is the service's: those its client sends on its own included."""
    assert counted == answered, f"{counted} requests counted, {answered} answered by {service.name}"


def _token_storage(url: str, service: ServiceStorage, cache: Path, limit: int | None = None) -> TokenStorage:
    return TokenStorage(url, storage_options=service.options, cache_dir=cache, cache_limit_bytes=limit)


def test_the_requests_and_bytes_of_a_cold_epoch_are_those_the_server_answered(
    service: ServiceStorage, tmp_path: Path
) -> None:
    writer = _token_storage(service.url, service, tmp_path / "writer")
    with writer.sync_writer() as shards:
        for shard in range(SHARDS):
            shards.append(shard, np.arange(shard, shard + 2000, dtype=np.uint32))
    storage = _token_storage(service.url, service, tmp_path / "cache")  # (its header read: before the loader)
    since = len(service.requests())
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": 33, "shuffle": True}
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        for _ in loader:
            pass
        metrics = loader.metrics()
        by_storage = loader.storage_metrics()
    requests, carried = _served(service, since)
    assert metrics["bytes_downloaded"] == carried
    assert metrics["cache_misses"] == SHARDS and metrics["cache_evictions"] == 0 and metrics["retries"] == 0
    assert by_storage[service.url]["requests"] == metrics["requests"] and list(by_storage) == [service.url]
    assert metrics["wait_seconds"] > 0
    _requests_counted(service, metrics["requests"], requests)


@pytest.mark.parametrize("workers", [0, 2])
def test_worker_processes_counts_reach_the_loader(service: ServiceStorage, tmp_path: Path, workers: int) -> None:
    """Documents are read by the worker processes: what they asked of the server and the cache is in the metrics."""
    writer = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / "w"
    )
    with writer.sync_writer() as records:
        for index in range(SHARDS * 10):
            records.append(index // 10, {"id": index, "text": "x" * 200})
    largest = int(writer.snapshot().rows["size"].max())
    storage = DocumentStorage(
        service.url,
        DocumentJsonFormat(),
        storage_options=service.options,
        cache_dir=tmp_path / "machine",
        cache_limit_bytes=SHARDS // 3 * largest,
    )
    since = len(service.requests())
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "shuffle": True, "seed": 7}
    options |= {"shuffle_window": SHARDS // 3 - 2, "num_workers": workers}
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        read = [record["id"] for batch in loader for record in batch]
        metrics = loader.metrics()
    assert sorted(read) == list(range(SHARDS * 10))
    requests, carried = _served(service, since)
    assert metrics["bytes_downloaded"] == carried
    assert metrics["cache_misses"] == SHARDS  # each shard downloaded once
    _requests_counted(service, metrics["requests"], requests)
    assert metrics["cache_hits"] >= SHARDS  # and found there by its readers (each worker that reads it), fetched ahead
    assert metrics["cache_evictions"] > 0  # a third of the corpus fits


def test_metrics_are_logged_at_the_interval_asked(
    service: ServiceStorage, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    writer = _token_storage(service.url, service, tmp_path / "writer")
    with writer.sync_writer() as shards:
        shards.append(0, np.arange(2000, dtype=np.uint32))
    storage = _token_storage(service.url, service, tmp_path / "cache")
    with caplog.at_level(logging.INFO, logger="guideloom"):
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=4, sequence_length=33, log_metrics_every=0
        ) as loader:
            batches = len(list(loader))
    logged = [record.getMessage() for record in caplog.records if "loader metrics" in record.getMessage()]
    assert len(logged) == batches and "bytes_downloaded=" in logged[-1] and "wait_seconds=" in logged[-1]


def test_a_shard_read_whole_costs_one_get(service: ServiceStorage, tmp_path: Path) -> None:
    """1 MiB shards (4 ranged GETs each before): one GET each, and the loader's metrics say so."""
    writer = _token_storage(service.url, service, tmp_path / "writer")
    with writer.sync_writer() as shards:
        for shard in range(4):
            shards.append(shard, np.arange(shard, shard + (1 << 18), dtype=np.uint32))
    storage = _token_storage(service.url, service, tmp_path / "cache")
    since, reads = len(service.requests()), len(service.reads(".shard"))
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": 2049, "shuffle": True}
    with StatefulDataLoader.from_storage(storage, **options, shuffle_window=2) as loader:
        batches = sum(1 for _ in loader)
        metrics = loader.metrics()
    shard_gets = [name for name, _, _, _ in service.reads(".shard")[reads:]]
    assert batches > 0 and sorted(shard_gets) == sorted(set(shard_gets)) and len(shard_gets) == 4
    assert metrics["cache_misses"] == 4
    _requests_counted(service, metrics["requests"], len(service.requests()[since:]))
