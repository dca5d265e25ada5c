"""A shard object larger than two parts is downloaded in ranged GETs side by side, each retried on its own.

The parts' smallest size is lowered so that shards of a few KiB split (at the default, 256 KiB, they would
not); every request is counted at the server, with its Range header.

On S3 only: side-by-side ranged downloads are the S3 backend's (``ranged_downloads``); gcsfs and adlfs download a
whole object with their own ``get_file``.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from guideloom import CorruptStorageError, StatefulDataLoader, TokenStorage
from guideloom._remote import ranged_parts
from tests.remote.fault_proxy import FaultProxy
from tests.remote.remote_child import shard_tokens
from tests.remote.s3_support import S3Server

PART = 1024  # the smallest part in these tests: a shard of 6 documents of 300 tokens (7 KiB) comes in 4 parts
KEY = "corpus/shards/000000000000.shard"


@pytest.fixture
def small_parts(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged_parts, "WHOLE_GET_BYTES", 0)
    monkeypatch.setattr(ranged_parts, "MIN_PART_BYTES", PART)


def _storage(url: str, endpoint: str, cache: Path, **options: Any) -> TokenStorage:
    return TokenStorage(url, storage_options={"endpoint_url": endpoint, **options}, cache_dir=cache)


def _write(url: str, s3_server: S3Server, cache: Path, shards: int = 2) -> list[list[int]]:
    """Shards of 6 documents of 300 tokens written; their documents, in order."""
    with _storage(url, s3_server.endpoint, cache).sync_writer() as writer:
        for shard in range(shards):
            for tokens in shard_tokens(shard, documents=6, length=300):
                writer.append(shard, tokens)
    return [tokens.tolist() for shard in range(shards) for tokens in shard_tokens(shard, documents=6, length=300)]


def _read_all(storage: TokenStorage) -> list[list[int]]:
    with storage.sync_reader() as reader:
        return [reader.read(index).tolist() for index in range(len(reader))]


def _object(s3_server: S3Server, bucket: str) -> bytes:
    return bytes(boto3.client("s3", endpoint_url=s3_server.endpoint).get_object(Bucket=bucket, Key=KEY)["Body"].read())


@pytest.fixture
def cut_short(s3_server: S3Server) -> Iterator[FaultProxy]:
    """Every other GET of a shard object has its body cut short."""
    proxy = FaultProxy(
        s3_server.port, {"short_body": 1.0}, max_in_a_row=1, applies=lambda method, path: path.endswith(".shard")
    ).start()
    yield proxy
    proxy.stop()


def test_a_large_shard_comes_in_ranged_parts_and_reads_back_exactly(
    small_parts: None, s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    expected = _write(s3_url, s3_server, tmp_path / "w")
    assert _read_all(_storage(s3_url, s3_server.endpoint, tmp_path / "r")) == expected
    assert s3_server.gets(bucket, ".shard") == []  # no whole-object GET of either shard
    stored = _object(s3_server, bucket)
    ranges = ranged_parts.part_ranges(len(stored))
    assert len(ranges) == ranged_parts.PARTS_AT_ONCE
    requested = sorted(byte_range for _, byte_range in s3_server.byte_ranges(bucket, KEY))
    assert requested == sorted(f"bytes={start}-{end - 1}" for start, end in ranges)
    [cached] = (tmp_path / "r").rglob("000000000000.*.shard")
    assert cached.read_bytes() == stored


def test_a_small_shard_takes_one_get(s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path) -> None:
    expected = _write(s3_url, s3_server, tmp_path / "w")  # 7 KiB shards: below two parts of the default size
    assert _read_all(_storage(s3_url, s3_server.endpoint, tmp_path / "r")) == expected
    assert s3_server.gets(bucket, ".shard") == [f"/{bucket}/{KEY}", f"/{bucket}/{KEY.replace('00.shard', '01.shard')}"]
    assert s3_server.byte_ranges(bucket, ".shard") == []


def test_a_shard_of_up_to_256_mib_is_one_get() -> None:
    for size in (1 << 20, 64 << 20, 256 << 20):
        assert ranged_parts.part_ranges(size) == [(0, size)]
    assert len(ranged_parts.part_ranges((256 << 20) + 1)) == 17  # parts of at most 16 MiB beyond


def test_the_parts_are_at_least_the_smallest_part_and_at_most_the_largest(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(ranged_parts, "WHOLE_GET_BYTES", 0)
    assert ranged_parts.part_ranges(2 * ranged_parts.MIN_PART_BYTES - 1) == [(0, 2 * ranged_parts.MIN_PART_BYTES - 1)]
    assert len(ranged_parts.part_ranges(2 * ranged_parts.MIN_PART_BYTES)) == 2
    assert len(ranged_parts.part_ranges(1 << 20)) == 4  # 4 parts of 256 KiB
    assert len(ranged_parts.part_ranges(64 << 20)) == 4  # 4 parts of 16 MiB
    huge = ranged_parts.part_ranges((1 << 30) + 5)
    assert len(huge) == 65 and max(end - start for start, end in huge) <= ranged_parts.LARGEST_PART_BYTES
    for size in (0, 1, 700_001, 3 << 20, 1 << 30):
        ranges = ranged_parts.part_ranges(size)
        assert ranges[0][0] == 0 and ranges[-1][1] == size
        assert all(end == start for (_, end), (start, _) in itertools.pairwise(ranges))


def test_a_part_cut_short_is_retried_on_its_own(
    small_parts: None,
    s3_url: str,
    bucket: str,
    s3_server: S3Server,
    cut_short: FaultProxy,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
) -> None:
    expected = _write(s3_url, s3_server, tmp_path / "w")
    storage = _storage(s3_url, cut_short.endpoint, tmp_path / "r")
    with caplog.at_level(logging.WARNING, logger="guideloom"):
        assert _read_all(storage) == expected
    assert cut_short.cut_short and storage.retry_count >= 1
    retried = [record.getMessage() for record in caplog.records if "retrying in" in record.getMessage()]
    assert retried and all(f"{s3_url}/shards/" in line and ".shard (bytes " in line for line in retried), retried
    parts = len(ranged_parts.part_ranges(len(_object(s3_server, bucket))))
    assert len(s3_server.byte_ranges(bucket, KEY)) > parts  # the parts cut short were asked for again
    assert list((tmp_path / "r").rglob("*.part")) == []


def test_a_part_that_keeps_failing_fails_the_read_naming_the_object(
    small_parts: None, s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    _write(s3_url, s3_server, tmp_path / "w")
    proxy = FaultProxy(
        s3_server.port, {"internal": 1.0}, max_in_a_row=100, applies=lambda method, path: path.endswith(".shard")
    ).start()
    try:
        storage = _storage(s3_url, proxy.endpoint, tmp_path / "r", request_attempts=2)
        with storage.sync_reader() as reader:
            with pytest.raises(ConnectionError, match=rf"downloading {s3_url}/shards/000000000000\.shard failed.*500"):
                reader.read(0)
    finally:
        proxy.stop()
    assert proxy.injected["internal"] >= 2
    assert [*(tmp_path / "r").rglob("*.shard"), *(tmp_path / "r").rglob("*.part")] == []  # nothing cached


def test_a_changed_object_is_named_by_the_checksum_check(
    small_parts: None, s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    _write(s3_url, s3_server, tmp_path / "w")
    damaged = bytearray(_object(s3_server, bucket))
    damaged[len(damaged) // 2] ^= 0x40  # a flipped bit in the middle: a part other than the first
    boto3.client("s3", endpoint_url=s3_server.endpoint).put_object(Bucket=bucket, Key=KEY, Body=bytes(damaged))
    with _storage(s3_url, s3_server.endpoint, tmp_path / "r").sync_reader() as reader:
        with pytest.raises(CorruptStorageError, match=r"shard 0 failed its checks 3 times.*their checkpoint"):
            reader.read(0)
    assert len(s3_server.byte_ranges(bucket, KEY)) == 3 * ranged_parts.PARTS_AT_ONCE  # each attempt in 4 parts


def test_a_connection_pool_smaller_than_the_parts_in_flight_serves_them_all(
    small_parts: None, s3_url: str, bucket: str, s3_server: S3Server, tmp_path: Path
) -> None:
    _write(s3_url, s3_server, tmp_path / "w", shards=8)

    def epoch(storage: TokenStorage) -> list[list[list[int]]]:
        with StatefulDataLoader.from_storage(
            storage, device="cpu", local_batch_size=4, sequence_length=64, shuffle=True, seed=1
        ) as loader:
            return [batch.tolist() for batch in loader]

    expected = epoch(_storage(s3_url, s3_server.endpoint, tmp_path / "default"))
    before = len(s3_server.byte_ranges(bucket, ".shard"))
    # Four shards prefetched at once, in four parts each: 16 requests wanting 2 connections.
    narrow = _storage(s3_url, s3_server.endpoint, tmp_path / "narrow", config_kwargs={"max_pool_connections": 2})
    assert epoch(narrow) == expected
    assert len(s3_server.byte_ranges(bucket, ".shard")[before:]) == 8 * ranged_parts.PARTS_AT_ONCE  # each once
