"""Records streamed from an object store with shuffle_window, the server counting the shard downloads of each
machine (a cache directory each, as separate disks).

Packed records: once the loader has packed the rows (which reads every shard's record lengths), each machine
downloads its share about once per epoch through a cache of a quarter of the corpus (or half its share).
Batches by budget: every rank plans every machine's batches from the lengths of their records, read from the
shard objects' tails, so each machine downloads its share once per epoch and every shard's tail once (see
docs/object-storage.md); over compressed shard objects it downloads the shards themselves.
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
from tests.remote.conftest import ServiceStorage

SHARDS = 40
PER_SHARD = 30
LENGTHS = record_lengths(SHARDS * PER_SHARD, seed=9, longest=100)
PACKED: dict[str, Any] = {"pack_documents": True, "sequence_length": 256, "local_batch_size": 2}


@pytest.fixture
def corpus(service: ServiceStorage, tmp_path: Path) -> tuple[str, int]:
    """The URL of a document storage of 40 shards of 30 records, and the size of its largest shard object."""
    storage = DocumentStorage(service.url, RawFormat(), storage_options=service.options, cache_dir=tmp_path / "writer")
    with storage.sync_writer() as writer:
        for index, length in enumerate(LENGTHS):
            writer.append(index // PER_SHARD, record(index, length))
    return service.url, int(storage.snapshot().rows["size"].max())


def ids(samples: list[Any]) -> list[int]:
    """The records of a batch (packed rows flattened), by id."""
    flat = [data for sample in samples for data in (sample if isinstance(sample, list) else [sample])]
    return [identifier(data) for data in flat]


def machine_loaders(
    url: str, service: ServiceStorage, cache: Path, limit: int, machines: int, machine: int, ranks: int, **options: Any
) -> list[StatefulDataLoader]:
    """One machine's ranks, a storage object each, sharing the machine's cache."""
    return [
        StatefulDataLoader.from_storage(
            DocumentStorage(
                url, RawFormat(), storage_options=service.options, cache_dir=cache, cache_limit_bytes=limit
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
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int], machines: int, ranks: int
) -> None:
    url, largest = corpus
    rows = DocumentStorage(url, RawFormat(), storage_options=service.options, cache_dir=tmp_path / "s").snapshot().rows
    sizes = dict(zip(rows["id"].tolist(), rows["size"].tolist(), strict=True))
    cache_shards = SHARDS // 4 if machines == 1 else SHARDS // machines // 2  # a quarter, or half a share
    window = cache_shards - 2 - ranks  # the window, a shard prefetched by each rank, one downloading
    read: list[int] = []
    for machine in range(machines):
        cache, limit = tmp_path / f"machine-{machine}", cache_shards * largest
        loaders = machine_loaders(url, service, cache, limit, machines, machine, ranks, shuffle_window=window, **PACKED)
        before = len(service.reads(".shard"))  # (after the packing)
        read += [index for step in zip(*loaders, strict=True) for batch in step for index in batch]
        for loader in loaders:
            loader.close()
        downloads, _ = shard_reads(service, before, sizes)
        assert max(downloads.values()) == 1, f"machine {machine} downloaded a shard twice: {downloads}"
        assert sum(downloads.values()) <= 1.1 * SHARDS / machines + 1, f"machine {machine}: {downloads}"
    assert sorted(set(read)) == list(range(len(LENGTHS)))  # every record, each machine its own share


BUDGET_SHARDS, BUDGET_PER_SHARD = 16, 400  # shards larger than the lengths a stream reads ahead (256)
BUDGET = 8000  # records of up to 2,000 bytes: about 8 a batch
SMALL_SHARES = r".*a share begins and ends inside shards"  # the warning of shares under 20 shards


def write_large_shards(url: str, service: ServiceStorage, cache: Path, compression: str | None = None) -> int:
    """A document storage of 16 shards of 400 records of up to 2,000 bytes; the size of its largest shard."""
    storage = DocumentStorage(
        url, RawFormat(), storage_options=service.options, cache_dir=cache, compression=compression
    )
    lengths = record_lengths(BUDGET_SHARDS * BUDGET_PER_SHARD, seed=10, longest=2000)
    with storage.sync_writer() as writer:
        for index, length in enumerate(lengths):
            writer.append(index // BUDGET_PER_SHARD, record(index, length))
    return int(storage.snapshot().rows["size"].max())


@pytest.fixture
def large_shards(service: ServiceStorage, tmp_path: Path) -> tuple[str, int]:
    """The URL of the storage of ``write_large_shards`` and the size of its largest shard object."""
    url = f"{service.url}-large"
    return url, write_large_shards(url, service, tmp_path / "writer")


def shard_reads(
    service: ServiceStorage, since: int, sizes: dict[int, int]
) -> tuple[collections.Counter[int], collections.Counter[int]]:
    """How many reads of each shard's object (by id) since the ``since``-th the service answered: whole (as many
    bytes as the shard holds), and of a range (its tail)."""
    whole: collections.Counter[int] = collections.Counter()
    ranges: collections.Counter[int] = collections.Counter()
    for name, _, _, size in service.reads(".shard")[since:]:
        shard = int(name.rsplit("/", 1)[1].removesuffix(".shard"))
        (whole if size == sizes[shard] else ranges)[shard] += 1
    return whole, ranges


@pytest.mark.parametrize(("machines", "ranks"), [(1, 1), (2, 1), (4, 1), (2, 2)])
def test_by_budget_each_machine_downloads_its_share_and_the_lengths_tails(
    service: ServiceStorage, tmp_path: Path, large_shards: tuple[str, int], machines: int, ranks: int
) -> None:
    url, largest = large_shards
    rows = DocumentStorage(url, RawFormat(), storage_options=service.options, cache_dir=tmp_path).snapshot().rows
    sizes = dict(zip(rows["id"].tolist(), rows["size"].tolist(), strict=True))
    tails = rows["size"] - (rows["element_count"] + 7) // 8 * 8  # offsets and footer (no lengths recorded)
    tail_sizes = dict(zip(rows["id"].tolist(), tails.tolist(), strict=True))
    window = 2
    cache_shards = window + 2 + ranks  # its own window, a shard prefetched by each rank, one downloading
    read: list[int] = []
    for machine in range(machines):
        before = len(service.reads(".shard"))
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # the cache fits: no warning
            warnings.filterwarnings("ignore", SMALL_SHARES)  # but the shares are a few shards
            loaders = machine_loaders(
                url,
                service,
                tmp_path / f"machine-{machine}",
                cache_shards * largest,
                machines,
                machine,
                ranks,
                shuffle_window=window,
                batch_tokens=BUDGET,
            )
        machine_read = [index for step in zip(*loaders, strict=True) for batch in step for index in batch]
        for loader in loaders:
            loader.close()
        read += machine_read
        downloads, tails = shard_reads(service, before, sizes)
        share = {index // BUDGET_PER_SHARD for index in machine_read}
        # the last step's padding repeats a record or two from the epoch's start: their shard may come again
        padding = {index // BUDGET_PER_SHARD for index, count in collections.Counter(machine_read).items() if count > 1}
        assert set(downloads) == share, f"machine {machine} read shards of other machines: {downloads}"
        assert all(count == 1 or shard in padding for shard, count in downloads.items()), f"{downloads}"
        assert max(tails.values()) == 1  # each shard's lengths read once by the machine, whatever its ranks
        share_bytes = sum(sizes[shard] for shard in share)
        tails_bytes = sum(tail_sizes[shard] for shard in tails)
        downloaded = sum(sizes[shard] * count for shard, count in downloads.items())
        assert downloaded + tails_bytes <= 1.1 * share_bytes + largest * len(padding)
        assert tails_bytes <= 0.05 * share_bytes  # every machine's lengths: 16 bytes a record, not its data
    assert sorted(set(read)) == list(range(BUDGET_SHARDS * BUDGET_PER_SHARD))


def test_by_budget_over_compressed_shards_a_cache_short_of_every_machines_window_warns(
    service: ServiceStorage, tmp_path: Path
) -> None:
    largest = write_large_shards(service.url, service, tmp_path / "writer", compression="zstd")
    with pytest.warns(UserWarning, match=r"every machine's window from its compressed shards.*shuffle_window=2 fits"):
        (loader,) = machine_loaders(
            service.url, service, tmp_path / "cache", 9 * largest, 2, 0, 1, shuffle_window=3, batch_tokens=BUDGET
        )
    loader.close()


def test_by_budget_lengths_from_the_tails_need_only_the_machines_own_window_in_the_cache(
    service: ServiceStorage, tmp_path: Path, large_shards: tuple[str, int]
) -> None:
    url, largest = large_shards
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        warnings.filterwarnings("ignore", SMALL_SHARES)
        (loader,) = machine_loaders(
            url, service, tmp_path / "cache", 6 * largest, 4, 0, 1, shuffle_window=3, batch_tokens=BUDGET
        )
    loader.close()
