"""Streaming from an object store with shuffle_window: each machine downloads its share about once per epoch.

Machines are separate cache directories (as separate disks); the server counts the shard downloads.
"""

from __future__ import annotations

import collections
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, StatefulDataLoader, TokenStorage
from guideloom._remote.object_store import ObjectStore
from tests.remote.conftest import ServiceStorage

SHARDS = 40
SEQUENCE = 33


def _write_corpus(storage: TokenStorage, shards: int = SHARDS) -> None:
    generator = np.random.default_rng(11)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            for _ in range(4):
                writer.append(shard, generator.integers(0, 50_000, 500, dtype=np.uint32))


@pytest.fixture
def corpus(service: ServiceStorage, tmp_path: Path) -> tuple[str, int]:
    """The URL of a token storage of 40 equal shards, and the size of its largest shard object."""
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "writer")
    _write_corpus(storage)
    return service.url, int(storage.snapshot().rows["size"].max())


def _storage(url: str, service: ServiceStorage, cache: Path, limit: int | None) -> TokenStorage:
    return TokenStorage(url, storage_options=service.options, cache_dir=cache, cache_limit_bytes=limit)


def _downloads(service: ServiceStorage, since: int) -> collections.Counter[str]:
    """The bytes of each shard object read since the ``since``-th read of one, whole or in ranges (a shard read
    once, whole or in parts, counts its size at most)."""
    downloads: collections.Counter[str] = collections.Counter()
    for name, _, _, size in service.reads(".shard")[since:]:
        downloads[name] += size
    return downloads


def _machine_epoch(storages: list[TokenStorage], machines: int, machine: int, **options: Any) -> list[list[int]]:
    """One epoch of the ranks of one machine (one storage object each, sharing the machine's cache), in lockstep."""
    ranks_per_machine = len(storages)
    world_size = machines * ranks_per_machine
    loaders = [
        StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=4,
            sequence_length=SEQUENCE,
            shuffle=True,
            seed=7,
            rank=machine * ranks_per_machine + local,
            world_size=world_size,
            local_world_size=ranks_per_machine,
            **options,
        )
        for local, storage in enumerate(storages)
    ]
    batches: list[list[int]] = []
    try:
        for step in zip(*loaders, strict=True):
            batches.extend(batch.tolist() for batch in step)
    finally:
        for loader in loaders:
            loader.close()
    return batches


@pytest.mark.parametrize(
    ("machines", "ranks_per_machine", "workers"), [(1, 1, 0), (1, 1, 2), (2, 2, 0), (4, 1, 0), (4, 1, 2)]
)
def test_each_machine_downloads_its_share_about_once_at_a_quarter_of_the_corpus(
    service: ServiceStorage,
    tmp_path: Path,
    corpus: tuple[str, int],
    machines: int,
    ranks_per_machine: int,
    workers: int,
) -> None:
    url, largest = corpus
    cache_shards = SHARDS // 4 // machines if machines == 1 else SHARDS // machines // 2  # a quarter, or half a share
    window = cache_shards - 2 - ranks_per_machine  # the window, a shard prefetched by each rank, one downloading
    share = SHARDS / machines
    for machine in range(machines):
        cache = tmp_path / f"machine-{machine}"
        before = len(service.reads(".shard"))
        storages = [_storage(url, service, cache, cache_shards * largest) for _ in range(ranks_per_machine)]
        _machine_epoch(storages, machines, machine, shuffle_window=window, num_workers=workers)
        downloads = _downloads(service, before)
        assert max(downloads.values()) <= largest, f"machine {machine} downloaded a shard twice: {downloads}"
        # Its share, and the shards where it begins and ends (shared with the neighbours); none of another share
        # for the last, short batch either.
        assert sum(downloads.values()) <= (share + 2) * largest, f"machine {machine}: {downloads} for {share}"


def test_every_shard_is_downloaded_ahead_of_its_reader_as_slots_free(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader hints the whole epoch at once here, and the cache holds a quarter of it: each shard released
    frees the slot the next download takes, so the reader never downloads a shard itself."""
    url, largest = corpus
    downloaders: list[str] = []
    download = ObjectStore.download

    def recorded(store: ObjectStore, name: str, *arguments: Any, **options: Any) -> None:
        downloaders.append(threading.current_thread().name)
        download(store, name, *arguments, **options)

    monkeypatch.setattr(ObjectStore, "download", recorded)
    cache_shards = SHARDS // 4
    storage = _storage(url, service, tmp_path / "machine", cache_shards * largest)
    _machine_epoch([storage], 1, 0, shuffle_window=cache_shards - 3)
    assert collections.Counter(downloaders) == {"guideloom-prefetch": SHARDS}


def test_the_batches_do_not_depend_on_the_cache_or_workers(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    url, largest = corpus
    runs = []
    for run, (limit, workers) in enumerate([(None, 0), (8 * largest, 0), (8 * largest, 2)]):
        storage = _storage(url, service, tmp_path / f"cache-{run}", limit)
        runs.append(_machine_epoch([storage], 2, 1, shuffle_window=4, num_workers=workers))
    assert runs[0] == runs[1] == runs[2] and len(runs[0]) > 10


def test_a_global_shuffle_through_a_small_cache_warns_once_with_a_window_that_fits(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    url, largest = corpus
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    storage = _storage(url, service, tmp_path / "cache", 10 * largest)
    with pytest.warns(UserWarning, match=r"expect about [\d,]+ bytes downloaded per epoch .*shuffle_window=6"):
        StatefulDataLoader.from_storage(storage, **options).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per storage; and never for the windowed order
        StatefulDataLoader.from_storage(storage, **options).close()
        StatefulDataLoader.from_storage(storage, **options, shuffle_window=6).close()


def test_a_window_larger_than_the_cache_warns_with_one_that_fits(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    url, largest = corpus
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    storage = _storage(url, service, tmp_path / "cache", 10 * largest)
    with pytest.warns(UserWarning, match=r"shuffle_window=9 does not fit .* shuffle_window=6 fits"):
        StatefulDataLoader.from_storage(storage, **options, shuffle_window=9).close()


def test_a_cache_too_small_for_any_window_says_the_cache_that_holds_one(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    url, largest = corpus
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    storage = _storage(url, service, tmp_path / "cache", 2 * largest)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        StatefulDataLoader.from_storage(storage, **options, shuffle_window=1).close()
    assert [str(warning.message).split("; ", 1)[1] for warning in caught] == [
        f"no shuffle_window fits: the smallest, shuffle_window=1, needs a cache_limit_bytes of at least "
        f"{4 * largest:,} bytes (4 of the largest shards; {5 * largest:,} leave room for a second download ahead), "
        "or smaller shards (see docs/object-storage.md)"
    ]


@pytest.mark.parametrize("shuffle_window", [None, 2])
def test_a_cache_limit_below_one_shard_is_refused(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int], shuffle_window: int | None
) -> None:
    """As Mosaic refuses it: a reader holds the shard it reads, so the cache could not keep to its limit."""
    url, largest = corpus
    storage = _storage(url, service, tmp_path / "cache", largest - 1)
    with pytest.raises(ValueError, match=rf"cache_limit_bytes={largest - 1:,} is smaller than the largest shard of "):
        StatefulDataLoader.from_storage(
            storage,
            device="cpu",
            local_batch_size=4,
            sequence_length=SEQUENCE,
            shuffle=True,
            shuffle_window=shuffle_window,
        )
    assert not list((tmp_path / "cache").rglob("*.shard"))


def test_machines_with_fewer_than_20_shards_a_share_are_warned_once_with_the_shard_size_that_fits(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    """Compressed shard objects cannot be read in parts: a share's boundary shards are downloaded whole."""
    url, largest = corpus
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    options |= {"shuffle_window": 4, "rank": 0}
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # shards read in parts: a machine downloads only its part of those
        StatefulDataLoader.from_storage(
            _storage(url, service, tmp_path / "parts", SHARDS * largest), **options, world_size=4
        ).close()
    compressed = f"{service.url}-zstd"
    _write_corpus(
        TokenStorage(compressed, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd")
    )
    storage = _storage(compressed, service, tmp_path / "cache", SHARDS * largest)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # 20 shards a share: two more are 1.1x
        StatefulDataLoader.from_storage(storage, **options, world_size=2).close()
    with pytest.warns(UserWarning, match=r"about 10\.0 of its largest shards.* up to 1\.20x") as caught:
        StatefulDataLoader.from_storage(storage, **options, world_size=4).close()
    fitting = int(SHARDS * largest / 4 * (1.1 - 1) / 2)  # a twentieth of a share
    assert f"shards of at most {fitting:,} bytes keep it within 1.1x" in str(caught[0].message)
    assert caught[0].filename == __file__  # the user's line, not guideloom's
    unlimited = _storage(compressed, service, tmp_path / "unlimited", None)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # without a limit, every shard read stays cached for the next epochs
        StatefulDataLoader.from_storage(unlimited, **options, world_size=4).close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # once per storage
        StatefulDataLoader.from_storage(storage, **options, world_size=4).close()


def test_an_epoch_resumed_on_the_same_cache_downloads_each_shard_once(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int]
) -> None:
    """The shards fetched ahead when the first loader closed stay cached for the resumed one, and its window too."""
    url, largest = corpus
    before = len(service.reads(".shard"))
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    options |= {"seed": 7, "shuffle_window": SHARDS // 4 - 3}
    cache = tmp_path / "machine"
    with StatefulDataLoader.from_storage(_storage(url, service, cache, SHARDS // 4 * largest), **options) as loader:
        batches = iter(loader)
        for _ in range(len(loader) // 2):
            next(batches)
        state = loader.state_dict()
    with StatefulDataLoader.from_storage(_storage(url, service, cache, SHARDS // 4 * largest), **options) as loader:
        loader.load_state_dict(state)
        assert len(list(loader)) == len(loader) - len(loader) // 2
    downloads = _downloads(service, before)
    assert len(downloads) == SHARDS and set(downloads.values()) == {largest}, downloads


@pytest.mark.parametrize("workers", [0, 2])
def test_documents_are_downloaded_once_each_read_here_or_by_worker_processes(
    service: ServiceStorage, tmp_path: Path, workers: int
) -> None:
    """With worker processes the loader's process only hints, and learns from the cache how far they read."""
    writer = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / "w"
    )
    with writer.sync_writer() as records:
        for index in range(SHARDS * 10):
            records.append(index // 10, {"id": index, "text": "x" * 200})
    largest = int(writer.snapshot().rows["size"].max())
    before = len(service.reads(".shard"))
    storage = DocumentStorage(
        service.url,
        DocumentJsonFormat(),
        storage_options=service.options,
        cache_dir=tmp_path / "machine",
        cache_limit_bytes=SHARDS // 4 * largest,
    )
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "shuffle": True, "seed": 7}
    options |= {"shuffle_window": SHARDS // 4 - 3, "num_workers": workers}
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        read = [record["id"] for batch in loader for record in batch]
        retries = loader.metrics()["retries"]
    assert sorted(read) == list(range(SHARDS * 10))
    rows = writer.snapshot().rows
    sizes = {
        f"corpus/shards/{shard:012d}.shard": size
        for shard, size in zip(rows["id"].tolist(), rows["size"].tolist(), strict=True)
    }
    downloads = _downloads(service, before)
    # A download retried (a read timed out on a loaded machine) comes twice: no more than the metrics count.
    twice = {name for name, size in downloads.items() if size == 2 * sizes[name]}
    assert len(twice) <= retries, (retries, downloads)
    assert downloads == {name: size * (2 if name in twice else 1) for name, size in sizes.items()}


@pytest.mark.parametrize("workers", [0, 2])
def test_two_epochs_in_one_loader_download_each_shard_once_an_epoch(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, int], workers: int
) -> None:
    """Across the epoch boundary the hints run on into the next epoch's order: nothing of either is fetched twice."""
    url, largest = corpus
    before = len(service.reads(".shard"))
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
    options |= {"seed": 7, "shuffle_window": SHARDS // 4 - 3, "num_workers": workers}
    storage = _storage(url, service, tmp_path / "machine", SHARDS // 4 * largest)
    with StatefulDataLoader.from_storage(storage, **options) as loader:
        epochs = [[batch.tolist() for batch in loader] for _ in range(2)]
    assert epochs[0] != epochs[1] and len(epochs[0]) == len(epochs[1])
    downloads = _downloads(service, before)
    assert len(downloads) == SHARDS and set(downloads.values()) == {2 * largest}, downloads
