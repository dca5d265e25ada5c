"""A cache never holds more on disk than its limit plus one shard, downloads in flight (``.part`` files) included.

The cache directory's disk use (the blocks of every file in it) is sampled while a loader with worker processes
streams a whole epoch through a cache of one to two shards, on each service.
"""

from __future__ import annotations

import os
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from tests.remote.conftest import ServiceStorage

SHARDS = 8
SEQUENCE = 257
WINDOWED: dict[str, Any] = {"device": "cpu", "local_batch_size": 4, "sequence_length": SEQUENCE, "shuffle": True}
WINDOWED |= {"seed": 1, "shuffle_window": 1}  # the smallest window: the cache holds one to two shards
BLOCK = 4096  # a file's last block: disk use is counted in whole blocks


def _disk_use(directory: Path) -> tuple[int, int]:
    """The bytes of the blocks of the files under ``directory``, and how many files there are."""
    used = files = 0
    for root, _, names in os.walk(directory):
        for name in names:
            try:
                used += os.lstat(os.path.join(root, name)).st_blocks * 512
                files += 1
            except FileNotFoundError:
                pass  # evicted or renamed between the listing and the look
    return used, files


class DiskSampler:
    """Samples a directory's disk use in a thread until stopped; keeps the peak, less a block a file (rounding)."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            used, files = _disk_use(self.directory)
            self.peak = max(self.peak, used - BLOCK * files)
            self.samples += 1

    def __enter__(self) -> DiskSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


@pytest.fixture
def corpus(service: ServiceStorage, tmp_path: Path) -> tuple[ServiceStorage, int]:
    """A token storage of 8 shards of unequal sizes on the service, and the size of its largest shard object."""
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "writer")
    generator = np.random.default_rng(3)
    with storage.sync_writer() as writer:
        for shard in range(SHARDS):
            for _ in range(8):
                writer.append(shard, generator.integers(0, 50_000, 4000 + 1000 * shard, dtype=np.uint32))
    return service, int(storage.snapshot().rows["size"].max())


@pytest.mark.parametrize("limit_in_shards", [1.01, 1.5])
def test_an_epoch_with_workers_never_holds_more_than_the_limit_plus_one_shard(
    corpus: tuple[ServiceStorage, int], tmp_path: Path, limit_in_shards: float
) -> None:
    service, largest = corpus
    limit = int(limit_in_shards * largest)
    cache = tmp_path / "cache"
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=cache, cache_limit_bytes=limit)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # such a cache is warned about: here it is the point
        loader = StatefulDataLoader.from_storage(storage, **WINDOWED, num_workers=2)
    with DiskSampler(cache) as sampler, loader:
        batches = sum(1 for _ in loader)
    assert batches == len(loader)
    assert sampler.samples > batches  # sampled all along the epoch
    assert 0 < sampler.peak <= limit + largest
