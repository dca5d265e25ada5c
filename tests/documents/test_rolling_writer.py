"""Writing without choosing ids: storage.sync_writer(shard_size=...) rolls over to new shards and claims their ids."""

from __future__ import annotations

import multiprocessing
import tempfile
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from guideloom import DocumentJsonFormat, DocumentStorage, ShardExistsError, TokenStorage
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.rolling_writer import RollingWriter
from tests.helpers.storages import RawFormat, make_document_storage

RECORD_BYTES = len(b'{"w":0,"i":000}')


def record(writer: int, index: int) -> dict[str, int]:
    return {"w": writer, "i": index + 100}  # i + 100: every record has the same size


def test_a_shard_is_committed_as_soon_as_it_holds_shard_size_bytes(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with storage.sync_writer(shard_size=3 * RECORD_BYTES) as writer:
        for index in range(7):
            writer.append(record(0, index))
            if index == 2:
                assert storage.committed_shards() == [0]  # full: committed before the writer closes
        assert (writer.committed_shards, writer.committed_records, writer.appended_records) == ([0, 1], 6, 7)
    assert storage.committed_shards() == [0, 1, 2]
    with storage.sync_reader() as reader:
        assert list(reader) == [record(0, index) for index in range(7)]
        assert [reader.shard(position).record_count for position in range(3)] == [3, 3, 1]


def test_shard_size_takes_bytes_or_a_size_text(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    assert storage.sync_writer(shard_size="256MiB").shard_size == 256 << 20
    assert storage.sync_writer(shard_size="1KB").shard_size == 1000
    assert storage.sync_writer(shard_size=4096).shard_size == 4096
    with pytest.raises(ValueError, match="shard_size"):
        storage.sync_writer(shard_size="big")
    with pytest.raises(ValueError, match="shard_size"):
        storage.sync_writer(shard_size=0)
    with pytest.raises(TypeError, match="shard_size"):
        storage.sync_writer(shard_size=2.5)  # type: ignore[call-overload]


def test_each_writer_takes_its_own_call(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with storage.sync_writer(shard_size="1MiB") as rolling:
        with pytest.raises(TypeError, match=r"picks shard ids itself.*writer\.append\(data\)"):
            rolling.append(0, {"a": 1})  # type: ignore[call-arg]
    with storage.sync_writer() as naming:
        with pytest.raises(TypeError, match=r"writer\.append\(shard, data\).*shard_size"):
            naming.append({"a": 1})  # type: ignore[call-arg]
    assert storage.committed_shards() == []


def test_ids_start_after_the_highest_committed_shard(tmp_path: Path) -> None:
    storage = make_document_storage(tmp_path / "docs", count=4, shards=2)
    with storage.sync_writer() as writer:
        writer.append(41, {"id": 4})
    with storage.sync_writer(shard_size=1) as writer:
        writer.append({"id": 5})
        writer.append({"id": 6})
    assert storage.committed_shards() == [0, 1, 41, 42, 43]


def test_ids_taken_by_other_writers_meanwhile_are_skipped(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    first, second = storage.sync_writer(shard_size=1), storage.sync_writer(shard_size=1)
    first.append(record(1, 0))  # claims shard 0
    second.append(record(2, 0))  # starts after the highest committed: shard 1
    with storage.sync_writer() as naming:
        naming.append(2, record(3, 0))  # a writer that names its shards takes 2
    first.append(record(1, 1))  # 1 and 2 are taken: the id after the highest committed, 3
    second.append(record(2, 1))
    first.close()
    second.close()
    assert (first.committed_shards, second.committed_shards) == ([0, 3], [1, 4])
    with pytest.raises(ShardExistsError):
        with storage.sync_writer() as naming:
            naming.append(3, record(3, 1))


def test_a_claim_refused_under_a_stale_listing_moves_on_and_relabels_the_shard(tmp_path: Path) -> None:
    """A writer whose listing missed two commits (made just after it listed) is refused twice, then claims 2."""
    storage = make_document_storage(tmp_path / "docs", count=2, shards=2)  # shards 0 and 1
    encoder = RecordEncoder(storage.encode, None)
    stale = RollingWriter(storage.commit_target(), storage.create(), encoder, 1, lambda: -1)
    stale.append({"id": 2})
    stale.close()
    assert stale.committed_shards == [2]
    with storage.sync_reader() as reader:
        assert list(reader) == [{"id": 0}, {"id": 1}, {"id": 2}]
    assert storage.verify() == []


def test_token_storages_roll_over_too_with_their_loss_masks(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens", "uint16", loss_mask=True)
    documents = [np.arange(start, start + 5, dtype=np.uint16) for start in range(0, 50, 5)]
    with storage.sync_writer(shard_size="20B") as writer:  # two documents of 10 bytes a shard
        for number, tokens in enumerate(documents):
            writer.append(tokens, loss_mask=[number % 2] * 5)
        with pytest.raises(ValueError, match="loss_mask is required"):
            writer.append(documents[0])
    assert storage.committed_shards() == [0, 1, 2, 3, 4]
    with storage.sync_reader() as reader:
        assert [reader.read(index).tolist() for index in range(len(reader))] == [doc.tolist() for doc in documents]
        assert [bool(reader.loss_mask(index).all()) for index in range(len(reader))] == [False, True] * 5


def _write_concurrently(path: str, writer_number: int, count: int, start: Any) -> list[int]:
    storage = DocumentStorage(path, DocumentJsonFormat())
    start.wait()
    with storage.sync_writer(shard_size=2 * RECORD_BYTES) as writer:
        for index in range(count):
            writer.append(record(writer_number, index))
    return writer.committed_shards


def test_writers_in_several_processes_at_once_commit_every_record_once(tmp_path: Path) -> None:
    writers, count = 4, 60
    DocumentStorage(tmp_path / "docs", DocumentJsonFormat()).create()
    context = multiprocessing.get_context("spawn")
    with context.Manager() as manager, context.Pool(writers) as pool:
        start = manager.Barrier(writers)
        arguments = [(str(tmp_path / "docs"), number, count, start) for number in range(writers)]
        claimed = pool.starmap(_write_concurrently, arguments)
    assert sorted(shard for shards in claimed for shard in shards) == list(range(writers * count // 2))
    with DocumentStorage(tmp_path / "docs", DocumentJsonFormat()).sync_reader() as reader:
        read = list(reader)
    assert sorted(read, key=lambda item: (item["w"], item["i"])) == [
        record(number, index) for number in range(writers) for index in range(count)
    ]
    for number in range(writers):  # each writer's records in the order it appended them
        assert [item for item in read if item["w"] == number] == [record(number, index) for index in range(count)]


def test_writers_in_threads_at_once_commit_every_record_once(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    storage.create()
    start = threading.Barrier(3)
    threads = [
        threading.Thread(target=_write_concurrently, args=(str(tmp_path / "docs"), number, 40, start))
        for number in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert storage.committed_shards() == list(range(60))
    with storage.sync_reader() as reader:
        assert sorted((item["w"], item["i"]) for item in reader) == [
            (number, index + 100) for number in range(3) for index in range(40)
        ]


@settings(max_examples=40, deadline=None)
@given(sizes=st.lists(st.integers(0, 50), max_size=40), shard_size=st.integers(1, 120))
def test_shards_cut_where_they_reach_shard_size_and_keep_the_order(sizes: list[int], shard_size: int) -> None:
    payloads = [bytes([index % 256]) * size for index, size in enumerate(sizes)]
    with tempfile.TemporaryDirectory() as directory:
        storage = DocumentStorage(Path(directory), RawFormat())
        with storage.sync_writer(shard_size=shard_size) as writer:
            for payload in payloads:
                writer.append(payload)
        with storage.sync_reader() as reader:
            assert list(reader) == payloads
            shards = [reader.shard(position) for position in range(len(reader.infos))]
            for number, shard in enumerate(shards):
                last_size = int(shard.offsets[-1] - shard.offsets[-2])
                assert shard.record_count > 0
                assert shard.data_size - last_size < shard_size  # not full before its last record
                assert shard.data_size >= shard_size or number == len(shards) - 1  # full, or the last one
