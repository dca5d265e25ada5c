"""Crash safety and concurrent writers: killed writers, parallel processes, racing commits."""

from __future__ import annotations

import multiprocessing
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from guideloom import DocumentPickleFormat, DocumentStorage, ShardExistsError, TokenStorage

KILLED_WRITER = """
import sys
from pathlib import Path
import guideloom._shards.shard_in_progress
from guideloom import DocumentPickleFormat, DocumentStorage

# the kill lands while shard 3 is checksummed and flushed
guideloom._shards.shard_in_progress.BACKGROUND_CHUNK = 16 * 1024
path, ready = Path(sys.argv[1]), Path(sys.argv[2])
with DocumentStorage(path, DocumentPickleFormat()).sync_writer() as writer:
    for shard in range(3):
        for record in range(10):
            writer.append(shard, (shard, record))
        writer.commit(shard)
    record = 0
    while True:
        writer.append(3, (3, record, b"x" * 1000))
        record += 1
        if record == 100:
            ready.write_text("ready")
"""


@pytest.fixture(scope="module")
def killed_storage(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A storage whose writer committed shards 0..2, was appending to shard 3 and got SIGKILL."""
    directory = tmp_path_factory.mktemp("killed")
    path, ready = directory / "storage", directory / "ready"
    process = subprocess.Popen([sys.executable, "-c", textwrap.dedent(KILLED_WRITER), str(path), str(ready)])
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert process.poll() is None, "the writer died before it was killed"
            assert time.monotonic() < deadline, "the writer never became ready"
            time.sleep(0.01)
        time.sleep(0.05)
    finally:
        process.send_signal(signal.SIGKILL)
        process.wait(timeout=30)
    assert process.returncode == -signal.SIGKILL
    return path


@pytest.fixture
def killed(killed_storage: Path, tmp_path: Path) -> Path:
    """A private copy of the killed writer's storage (file times kept)."""
    return Path(shutil.copytree(killed_storage, tmp_path / "storage"))


def test_killed_writer_leaves_exactly_the_committed_shards(killed: Path) -> None:
    storage = DocumentStorage(killed, DocumentPickleFormat())
    with storage.sync_reader() as reader:
        assert [shard.id for shard in reader.shards] == [0, 1, 2]
        assert list(reader) == [(shard, record) for shard in range(3) for record in range(10)]
    assert storage.verify() == []


def test_leftovers_of_a_killed_writer_are_ignored_then_cleaned(killed: Path) -> None:
    storage = DocumentStorage(killed, DocumentPickleFormat())
    leftovers = sorted(os.listdir(killed / "incomplete"))
    assert leftovers, "the killed writer should have left its shard 3 in incomplete/"
    assert storage.clean_leftovers() == []  # too young for the default age
    removed = storage.clean_leftovers(older_than=0)
    assert sorted(path.name for path in removed) == leftovers
    assert os.listdir(killed / "incomplete") == []
    with storage.sync_reader() as reader:
        assert len(reader) == 30


def test_shard_of_a_killed_writer_can_be_written_afresh(killed: Path) -> None:
    storage = DocumentStorage(killed, DocumentPickleFormat())
    with storage.sync_writer() as writer:
        writer.append(3, "fresh")
    with storage.sync_reader() as reader:
        assert len(reader) == 31
        assert reader.read(30) == "fresh"
    assert storage.verify() == []


def test_killed_header_writer_leaves_no_header(storage_path: Path) -> None:
    """A header temp file left in incomplete/ does not make a storage; the next writer creates it."""
    (storage_path / "incomplete").mkdir(parents=True)
    (storage_path / "incomplete" / "guideloom.json.dead").write_bytes(b'{"kind": "tok')
    storage = TokenStorage(storage_path)
    with storage.sync_writer() as writer:
        writer.append(0, [1])
    with storage.sync_reader() as reader:
        assert reader.read(0).tolist() == [1]


# --- processes writing one storage -------------------------------------------------------------------

WRITERS = 4


def write_disjoint_shards(path: str, worker: int, barrier: Any) -> None:
    barrier.wait(timeout=60)  # every process creates the header at the same moment
    with DocumentStorage(Path(path), DocumentPickleFormat()).sync_writer() as writer:
        for round_ in range(5):
            for shard in range(worker, 4 * WRITERS, WRITERS):
                writer.append(shard, (shard, round_))


def write_the_same_shard(path: str, worker: int, barrier: Any) -> None:
    with DocumentStorage(Path(path), DocumentPickleFormat()).sync_writer() as writer:
        writer.append(7, ("worker", worker))
        barrier.wait(timeout=60)  # both have written, now both commit
        try:
            writer.close()
        except ShardExistsError:
            sys.exit(3)


def run_processes(target: Any, path: Path, count: int) -> list[int | None]:
    # fork keeps these tests fast (a spawned child would import torch through guideloom); the
    # children only touch files, so forking the test process is safe.
    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    barrier = context.Barrier(count)
    processes = [context.Process(target=target, args=(str(path), worker, barrier)) for worker in range(count)]
    for process in processes:
        process.start()
    for process in processes:
        process.join(timeout=120)
    return [process.exitcode for process in processes]


@pytest.mark.timeout(180)
def test_parallel_processes_write_disjoint_shards(storage_path: Path) -> None:
    assert run_processes(write_disjoint_shards, storage_path, WRITERS) == [0] * WRITERS
    storage = DocumentStorage(storage_path, DocumentPickleFormat())
    with storage.sync_reader() as reader:
        assert list(reader) == [(shard, round_) for shard in range(4 * WRITERS) for round_ in range(5)]
    assert storage.verify() == []
    assert os.listdir(storage_path / "incomplete") == []


@pytest.mark.timeout(180)
def test_processes_racing_for_one_shard_one_wins(storage_path: Path) -> None:
    assert sorted(run_processes(write_the_same_shard, storage_path, 2)) == [0, 3]
    with DocumentStorage(storage_path, DocumentPickleFormat()).sync_reader() as reader:
        assert len(reader) == 1
        assert reader.read(0) in [("worker", 0), ("worker", 1)]
    assert os.listdir(storage_path / "incomplete") == []
