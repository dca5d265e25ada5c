"""Parts of shards: a machine whose windowed share begins or ends inside a shard downloads only its part of it.

Machines are separate cache directories; the server's log says which bytes of which shard object each one
downloaded. The shards hold about 500 KiB of tokens each, a checkpoint every 4 KiB.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import CorruptStorageError, DocumentJsonFormat, DocumentStorage, StatefulDataLoader, TokenStorage
from guideloom._remote.shard_cache import ShardCache
from guideloom._shards.checkpoints import CHECKPOINT_BYTES
from guideloom._shards.parts import PlannedPart, ReadPlan
from tests.remote.conftest import ServiceStorage

SHARDS, TOKENS = 10, 130_000  # uint32 tokens a shard: about 500 KiB; shares of 2.5 shards
SEQUENCE = 2049  # windows run on into the next shard by up to 8 KiB: more than a piece


def _tokens(shard: int) -> np.ndarray:
    return np.random.default_rng(shard).integers(0, 50_000, TOKENS, dtype=np.uint32)


@pytest.fixture
def corpus(service: ServiceStorage, tmp_path: Path) -> tuple[str, Path]:
    """The same token storage on the object store and on local disk."""
    local = TokenStorage(tmp_path / "local")
    remote = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "writer")
    for storage in (local, remote):
        with storage.sync_writer() as writer:
            for shard in range(SHARDS):
                writer.append(shard, _tokens(shard))
    return service.url, tmp_path / "local"


def _bytes_by_shard(service: ServiceStorage, since: int) -> collections.Counter[int]:
    """Bytes of each shard object (by id) downloaded since the ``since``-th read of one (whole or ranged)."""
    got: collections.Counter[int] = collections.Counter()
    for name, _, _, size in service.reads(".shard")[since:]:
        got[int(name.rsplit("/", 1)[1].removesuffix(".shard"))] += size
    return got


def _log_position(service: ServiceStorage) -> int:
    return len(service.reads(".shard"))


def _loader(storage: Any, machines: int, rank: int, ranks: int = 1, **options: Any) -> StatefulDataLoader:
    return StatefulDataLoader.from_storage(
        storage,
        device="cpu",
        local_batch_size=4,
        sequence_length=SEQUENCE,
        shuffle=True,
        seed=5,
        shuffle_window=2,
        rank=rank,
        world_size=machines * ranks,
        local_world_size=ranks,
        **options,
    )


def _machine_batches(storages: list[Any], machines: int, machine: int, **options: Any) -> list[np.ndarray]:
    """The batches of one machine's ranks (a storage object each), read in lockstep."""
    ranks = len(storages)
    loaders = [
        _loader(storage, machines, machine * ranks + local, ranks, **options) for local, storage in enumerate(storages)
    ]
    try:
        return [batch.numpy() for step in zip(*loaders, strict=True) for batch in step]
    finally:
        for loader in loaders:
            loader.close()


@pytest.mark.parametrize(("machines", "ranks", "workers"), [(4, 1, 0), (4, 1, 2), (2, 2, 0)])
def test_each_machine_downloads_its_share_and_only_its_part_of_the_shards_it_shares(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, Path], machines: int, ranks: int, workers: int
) -> None:
    """A machine's ranks share its cache: they name the same parts, and download each once."""
    url, local = corpus
    size = int(TokenStorage(local).snapshot().rows["size"].max())
    for machine in range(machines):
        since = _log_position(service)
        cache = tmp_path / f"machine-{machine}"
        remote = [TokenStorage(url, storage_options=service.options, cache_dir=cache) for _ in range(ranks)]
        batches = _machine_batches(remote, machines, machine, num_workers=workers)
        expected = _machine_batches([TokenStorage(local) for _ in range(ranks)], machines, machine)
        assert len(batches) == len(expected) and all(map(np.array_equal, batches, expected))
        downloaded = _bytes_by_shard(service, since)
        share = sum(len(batch) for batch in batches) * SEQUENCE * 4  # the bytes of its tokens
        parts = [shard for shard, count in downloaded.items() if count < size]
        assert len(parts) <= 3, downloaded  # the shards it shares: where its share begins and ends, or runs into
        # Each of those is its part, in whole pieces, and the shard's tail (a few hundred bytes here).
        assert sum(downloaded.values()) <= share + 2 * (CHECKPOINT_BYTES + 4096), (downloaded, share)
        assert max(downloaded.values()) <= size, downloaded  # nothing twice


def test_a_read_outside_the_planned_part_reads_the_whole_shard(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, Path]
) -> None:
    url, local = corpus
    size = int(TokenStorage(local).snapshot().rows["size"].max())
    storage = TokenStorage(url, storage_options=service.options, cache_dir=tmp_path / "machine")
    with storage.open_reader() as reader, TokenStorage(local).open_reader() as expected:
        reader.shard_set.use_plan(ReadPlan.of({3: PlannedPart(0, 4096, in_records=False)}))  # 16 KiB of tokens
        early = 3 * TOKENS // SEQUENCE + 1  # a window early in shard 3: in the part
        late = (4 * TOKENS - 2 * SEQUENCE) // SEQUENCE  # near the shard's end: outside it
        since = _log_position(service)
        part = -(-16384 // CHECKPOINT_BYTES) * CHECKPOINT_BYTES + size - 4 * TOKENS  # its pieces and the tail
        for window, downloaded in [(early, part), (late, size)]:
            got, wanted = (np.empty((1, SEQUENCE), np.uint32) for _ in range(2))
            reader.read_windows(np.array([window]), SEQUENCE, got)
            expected.read_windows(np.array([window]), SEQUENCE, wanted)
            assert np.array_equal(got, wanted)
            assert _bytes_by_shard(service, since) == {3: downloaded}  # the part, then the shard
            since = _log_position(service)


def test_a_part_whose_piece_was_damaged_on_the_store_is_named(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, Path]
) -> None:
    url, _ = corpus
    key = "shards/000000000005.shard"
    damaged = bytearray(service.object_bytes(key))
    damaged[3 * CHECKPOINT_BYTES + 17] ^= 1
    service.put_object(key, bytes(damaged))
    storage = TokenStorage(url, storage_options=service.options, cache_dir=tmp_path / "machine")
    with storage.open_reader() as reader:
        reader.shard_set.use_plan(ReadPlan.of({5: PlannedPart(2 * CHECKPOINT_BYTES // 4, TOKENS, in_records=False)}))
        with pytest.raises(CorruptStorageError, match=rf"shard 5.*data bytes {3 * CHECKPOINT_BYTES}\.\."):
            reader.read_tokens(5 * TOKENS + TOKENS - 10, 5 * TOKENS + TOKENS)


def test_each_machine_reads_only_its_part_of_the_documents_it_shares(service: ServiceStorage, tmp_path: Path) -> None:
    machines, per_shard = 2, 300
    writer = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / "w"
    )
    with writer.sync_writer() as records:
        for index in range(5 * per_shard):
            records.append(index // per_shard, {"id": index, "text": "x" * 1000})
    rows = writer.snapshot().rows
    sizes = dict(zip(rows["id"].tolist(), rows["size"].tolist(), strict=True))
    read, shared = [], []
    for machine in range(machines):
        since = _log_position(service)
        storage = DocumentStorage(
            service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path / f"m{machine}"
        )
        options: dict[str, Any] = {"device": "cpu", "local_batch_size": 5, "shuffle": True, "seed": 2}
        options |= {"shuffle_window": 2, "rank": machine, "world_size": machines}
        with StatefulDataLoader.from_storage(storage, **options) as loader:
            mine = [record["id"] for batch in loader for record in batch]
        read += mine
        downloaded = _bytes_by_shard(service, since)
        shared.append([shard for shard, count in downloaded.items() if count < sizes[shard]])
        assert sum(downloaded.values()) <= len(mine) * 1030 + 2 * CHECKPOINT_BYTES + 5 * 4096, downloaded
    assert sorted(read) == list(range(5 * per_shard))
    assert len(shared[0]) == 1 and shared[0] == shared[1]  # the shard where the two shares meet, a part each


def test_the_cache_counts_a_part_by_the_bytes_it_holds(tmp_path: Path) -> None:
    cache = ShardCache(tmp_path, None)
    (tmp_path / "000000000001.0000abcd.9000000.e0-100.shard").write_bytes(b"")
    with open(tmp_path / "000000000001.0000abcd.9000000.e0-100.shard", "r+b") as part:
        part.truncate(9_000_000)
        part.seek(4_000_000)
        part.write(b"x" * 8192)
    (tmp_path / "000000000002.0000abcd.5000.shard").write_bytes(b"y" * 5000)
    assert 8192 <= cache.cached_bytes() - 5000 <= 8192 + 65536  # the part's blocks, not its 9 MB


def test_the_read_plan_travels_with_the_work_and_leaves_nothing_in_the_cache(
    service: ServiceStorage, tmp_path: Path, corpus: tuple[str, Path]
) -> None:
    """Worker processes read their machine's parts from the plan sent with each batch: the cache directory holds
    shards, parts of shards and their locks, nothing of a loader's plan."""
    url, _ = corpus
    cache = tmp_path / "machine-1"
    storage = TokenStorage(url, storage_options=service.options, cache_dir=cache)
    since = _log_position(service)
    seen: set[str] = set()
    with _loader(storage, machines=4, rank=1, num_workers=2) as loader:
        for _ in loader:
            seen |= {str(path.relative_to(cache)) for path in cache.rglob("*") if path.is_file()}
    size = int(storage.snapshot().rows["size"].max())
    assert any(count < size for count in _bytes_by_shard(service, since).values())  # parts read
    strays = {name for name in seen if not name.endswith((".shard", ".lock", ".part"))}
    assert not strays and not any(name.startswith("plans") for name in seen), strays
