"""Records streamed from an object store with shuffle_window, the server counting the shard downloads of each
machine (a cache directory each, as separate disks).

Packed records: once the loader has packed the rows (which reads every shard's record lengths), each machine
downloads its share about once per epoch through a cache of a quarter of the corpus (or half its share).
Batches by budget: every rank plans every machine's batches from the lengths of their records, so each machine
downloads every shard once per epoch through a cache of every machine's window (see docs/object-storage.md).
"""

from __future__ import annotations

import collections
import warnings
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentStorage, StatefulDataLoader
from tests.documents.records import identifier, record, record_lengths
from tests.helpers.storages import RawFormat
from tests.remote.s3_support import S3Server

SHARDS = 40
PER_SHARD = 30
LENGTHS = record_lengths(SHARDS * PER_SHARD, seed=9, longest=100)
PACKED: dict[str, Any] = {"pack_documents": True, "sequence_length": 256, "local_batch_size": 2}


@pytest.fixture
def corpus(s3_url: str, s3_server: S3Server, tmp_path: Path) -> tuple[str, int]:
    """The URL of a document storage of 40 shards of 30 records, and the size of its largest shard object."""
    storage = DocumentStorage(s3_url, RawFormat(), storage_options=s3_server.options, cache_dir=tmp_path / "writer")
    with storage.sync_writer() as writer:
        for index, length in enumerate(LENGTHS):
            writer.append(index // PER_SHARD, record(index, length))
    return s3_url, int(storage.snapshot().rows["size"].max())


def ids(samples: list[Any]) -> list[int]:
    """The records of a batch (packed rows flattened), by id."""
    flat = [data for sample in samples for data in (sample if isinstance(sample, list) else [sample])]
    return [identifier(data) for data in flat]


def machine_loaders(
    url: str, s3_server: S3Server, cache: Path, limit: int, machines: int, machine: int, ranks: int, **options: Any
) -> list[StatefulDataLoader]:
    """One machine's ranks, a storage object each, sharing the machine's cache."""
    return [
        StatefulDataLoader.from_storage(
            DocumentStorage(
                url, RawFormat(), storage_options=s3_server.options, cache_dir=cache, cache_limit_bytes=limit
            ),
            ids,
            device="cpu",
            shuffle=True,
            seed=3,
            rank=machine * ranks + local,
            world_size=machines * ranks,
            local_world_size=ranks,
            **options,
        )
        for local in range(ranks)
    ]


@pytest.mark.parametrize(("machines", "ranks"), [(1, 1), (2, 2), (4, 1)])
def test_each_machine_downloads_its_share_about_once_an_epoch(
    s3_server: S3Server, tmp_path: Path, corpus: tuple[str, int], machines: int, ranks: int
) -> None:
    url, largest = corpus
    bucket = url.removeprefix("s3://").split("/")[0]
    cache_shards = SHARDS // 4 if machines == 1 else SHARDS // machines // 2  # a quarter, or half a share
    window = cache_shards - 2 - ranks  # the window, a shard prefetched by each rank, one downloading
    read: list[int] = []
    for machine in range(machines):
        cache, limit = tmp_path / f"machine-{machine}", cache_shards * largest
        loaders = machine_loaders(
            url, s3_server, cache, limit, machines, machine, ranks, shuffle_window=window, **PACKED
        )
        before = len(s3_server.gets(bucket, ".shard"))  # (after the packing)
        read += [index for step in zip(*loaders, strict=True) for batch in step for index in batch]
        for loader in loaders:
            loader.close()
        downloads = collections.Counter(s3_server.gets(bucket, ".shard")[before:])
        assert max(downloads.values()) == 1, f"machine {machine} downloaded a shard twice: {downloads}"
        assert sum(downloads.values()) <= 1.1 * SHARDS / machines + 1, f"machine {machine}: {downloads}"
    assert sorted(set(read)) == list(range(len(LENGTHS)))  # every record, each machine its own share


BUDGET_SHARDS, BUDGET_PER_SHARD = 16, 400  # shards larger than the lengths a stream reads ahead (256)


@pytest.fixture
def large_shards(s3_url: str, s3_server: S3Server, tmp_path: Path) -> tuple[str, int]:
    """The URL of a document storage of 16 shards of 400 records, and the size of its largest shard object."""
    url = f"{s3_url}-large"
    storage = DocumentStorage(url, RawFormat(), storage_options=s3_server.options, cache_dir=tmp_path / "writer")
    lengths = record_lengths(BUDGET_SHARDS * BUDGET_PER_SHARD, seed=10, longest=100)
    with storage.sync_writer() as writer:
        for index, length in enumerate(lengths):
            writer.append(index // BUDGET_PER_SHARD, record(index, length))
    return url, int(storage.snapshot().rows["size"].max())


@pytest.mark.parametrize("machines", [1, 2])
def test_by_budget_each_machine_downloads_each_shard_at_most_once(
    s3_server: S3Server, tmp_path: Path, large_shards: tuple[str, int], machines: int
) -> None:
    url, largest = large_shards
    bucket = url.removeprefix("s3://").split("/")[0]
    window = 2
    cache_shards = machines * (window + 2) + 1  # every machine's window and the shards after them
    read: list[int] = []
    for machine in range(machines):
        cache = tmp_path / f"machine-{machine}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the cache fits: no warning
            (loader,) = machine_loaders(
                url,
                s3_server,
                cache,
                cache_shards * largest,
                machines,
                machine,
                1,
                shuffle_window=window,
                batch_tokens=300,
            )
        before = len(s3_server.gets(bucket, ".shard"))
        with loader:
            read += [index for batch in loader for index in batch]
        downloads = collections.Counter(s3_server.gets(bucket, ".shard")[before:])
        assert max(downloads.values()) == 1, f"machine {machine} downloaded a shard twice: {downloads}"
        assert sum(downloads.values()) <= 1.1 * BUDGET_SHARDS + 1  # the corpus, its share only with one machine
    assert sorted(set(read)) == list(range(BUDGET_SHARDS * BUDGET_PER_SHARD))


def test_by_budget_a_cache_short_of_every_machines_window_warns_with_a_window_that_fits(
    s3_server: S3Server, tmp_path: Path, large_shards: tuple[str, int]
) -> None:
    url, largest = large_shards
    with pytest.warns(UserWarning, match=r"reads the record lengths of every machine's window.*shuffle_window=2 fits"):
        (loader,) = machine_loaders(
            url, s3_server, tmp_path / "cache", 9 * largest, 2, 0, 1, shuffle_window=3, batch_tokens=300
        )
    loader.close()
