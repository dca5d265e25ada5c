"""``guideloom clean`` beside live loaders sharing a machine's cache: it removes what dead processes left, never a
download in progress."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import StatefulDataLoader, TokenStorage
from guideloom._remote.remote_files import check_download
from guideloom._remote.shard_cache import ShardCache, clean_part_files, writing
from tests.remote.conftest import ServiceStorage

SHARDS, TOKENS, SEQUENCE = 12, 250_000, 4097


def _read_all(storage: Any, rank: int, world_size: int) -> list[np.ndarray]:
    options: dict[str, Any] = {"device": "cpu", "local_batch_size": 8, "sequence_length": SEQUENCE, "shuffle": True}
    options |= {"seed": 3, "shuffle_window": 2, "rank": rank, "world_size": world_size, "local_world_size": 2}
    with StatefulDataLoader.from_storage(storage, num_workers=2, **options) as loader:
        return [batch.numpy() for batch in loader]


@pytest.mark.parametrize("service", ["s3"], indirect=True)
def test_clean_in_a_loop_beside_loaders_sharing_a_cache_fails_none_of_them(
    service: ServiceStorage, tmp_path: Path
) -> None:
    """On S3 only: its subject is the machine's cache shared by processes (the same code for every service), and
    its ranks and workers are among the costliest process trees of the suite."""
    local = TokenStorage(tmp_path / "local")
    remote = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "writer")
    rng = np.random.default_rng(0)
    shards = [rng.integers(0, 50_000, TOKENS, dtype=np.uint32) for _ in range(SHARDS)]
    for storage in (local, remote):
        with storage.sync_writer() as writer:
            for shard, tokens in enumerate(shards):
                writer.append(shard, tokens)
    limit = 6 * TOKENS * 4  # a few shards: downloads go on all epoch
    # The loaders and the command share the default cache directory of the URL (GUIDELOOM_CACHE_DIR). The command
    # runs now and then; in between, its sweep of the cache's downloads runs as fast as it can.
    cleaning = f"""
import os
from pathlib import Path
from guideloom._cli import main
from guideloom._remote.shard_cache import clean_part_files
while True:
    main(["clean", {service.url!r}, "--older-than", "0", "--storage-options", {json.dumps(service.options)!r}])
    for _ in range(20):
        for directory, _, _ in os.walk(os.environ["GUIDELOOM_CACHE_DIR"]):
            clean_part_files(Path(directory), 0)
"""
    cleaner = subprocess.Popen([sys.executable, "-u", "-c", cleaning], stdout=subprocess.PIPE, text=True)
    try:
        assert cleaner.stdout is not None and cleaner.stdout.readline().startswith("removed")  # cleaning already
        for rank in range(2):  # two ranks of one machine, one after the other, each with two workers
            storage = TokenStorage(service.url, storage_options=service.options, cache_limit_bytes=limit)
            got, expected = _read_all(storage, rank, 2), _read_all(local, rank, 2)
            assert len(got) == len(expected) and all(map(np.array_equal, got, expected))
        assert cleaner.poll() is None, "the cleaning loop stopped"
    finally:
        cleaner.kill()
        cleaner.wait()


def test_a_slow_download_survives_clean_in_a_loop(tmp_path: Path) -> None:
    """The cache's ``.part`` file of a download in progress is left alone by ``clean`` in another process however
    often it runs (without that, each of the download's attempts lost its file: "shard 0 vanished")."""
    storage = TokenStorage(tmp_path / "storage")
    with storage.sync_writer() as writer:
        writer.append(0, np.arange(300_000, dtype=np.uint32))
    shard_file = next((tmp_path / "storage" / "shards").iterdir())
    info, header = storage.snapshot()[0], storage.header_for_reading()
    cache = ShardCache(tmp_path / "cache", None)
    cache.directory.mkdir()

    def download(part: Path) -> None:  # a slow link: the shard in 20 pieces
        content = shard_file.read_bytes()
        with open(part, "wb") as file:
            for start in range(0, len(content), len(content) // 20 + 1):
                file.write(content[start : start + len(content) // 20 + 1])
                file.flush()
                time.sleep(0.02)

    sweeping = f"""
from pathlib import Path
from guideloom._remote.shard_cache import clean_part_files
print("sweeping", flush=True)
while True:
    clean_part_files(Path({str(cache.directory)!r}), 0)
"""
    sweeper = subprocess.Popen([sys.executable, "-u", "-c", sweeping], stdout=subprocess.PIPE, text=True)
    try:
        assert sweeper.stdout is not None and sweeper.stdout.readline() == "sweeping\n"
        lease = cache.acquire(cache.entry_for(info), download, lambda part: check_download(part, info, header, "x"))
        assert lease.path.read_bytes() == shard_file.read_bytes()
        lease.release()
    finally:
        sweeper.kill()
        sweeper.wait()


def test_clean_removes_a_dead_downloads_part_file_and_leaves_a_live_ones(tmp_path: Path) -> None:
    (tmp_path / "000000000001.0000abcd.100.shard.dead.part").write_bytes(b"left by a killed process")
    live = tmp_path / "000000000002.0000abcd.100.shard.live.part"
    with writing(live):
        live.write_bytes(b"being downloaded")
        assert clean_part_files(tmp_path, older_than=0) == [tmp_path / "000000000001.0000abcd.100.shard.dead.part"]
        assert live.exists()
    assert clean_part_files(tmp_path, older_than=0) == [live]
