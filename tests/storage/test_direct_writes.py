"""An import's writer puts the shards' data past the page cache: the same shard files, not left in the cache."""

from __future__ import annotations

import ctypes
import errno
import fcntl
import mmap
import os
import time
import zlib
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import guideloom._shards.writer
from guideloom import DocumentStorage
from guideloom._core.checksums import crc32
from guideloom._shards import direct_writes
from guideloom._storage.storages import bulk_writer
from tests.helpers.storages import RawFormat

PAGE = mmap.PAGESIZE


def records_of(sizes: list[int], seed: int = 0) -> list[bytes]:
    rng = np.random.default_rng(seed)
    return [rng.integers(0, 256, size, dtype=np.uint8).tobytes() for size in sizes]


def write(path: Path, shards: list[tuple[int, bytes]], direct: bool) -> DocumentStorage[bytes, bytes]:
    storage = DocumentStorage(path, RawFormat())
    with bulk_writer(storage) if direct else storage.sync_writer() as writer:
        for shard, record in shards:
            writer.append(shard, record)
    return storage


def shard_files(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted((path / "shards").iterdir())}


def cached_fraction(path: Path, start: int, stop: int) -> float:
    """The fraction of the file's pages ``[start, stop)`` that the page cache holds now (``mincore``)."""
    libc = ctypes.CDLL(None, use_errno=True)
    with open(path, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_COPY) as mapping:
        pages = (stop - start) // PAGE
        address = ctypes.addressof(ctypes.c_char.from_buffer(mapping)) + start
        held = (ctypes.c_ubyte * pages)()
        if libc.mincore(ctypes.c_void_p(address), ctypes.c_size_t(pages * PAGE), held) != 0:
            raise OSError(ctypes.get_errno(), "mincore failed")
        fraction = sum(page & 1 for page in held) / pages
        return fraction


@settings(max_examples=25, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 5 * PAGE), min_size=1, max_size=30),
    shard_choices=st.lists(st.integers(0, 3), min_size=30, max_size=30),
)
def test_the_shard_files_are_those_written_through_the_page_cache(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], shard_choices: list[int]
) -> None:
    shards = list(zip(shard_choices, records_of(sizes), strict=False))
    directory = tmp_path_factory.mktemp("direct")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(direct_writes, "STAGE_BYTES", 2 * PAGE)  # records cross buffers, and fill several
        patch.setattr(guideloom._shards.writer, "MAX_OPEN_FILES", 2)  # shards are closed and reopened meanwhile
        storage = write(directory / "direct", shards, direct=True)
    write(directory / "cached", shards, direct=False)
    assert shard_files(directory / "direct") == shard_files(directory / "cached")
    assert storage.verify() == []


def test_records_larger_than_the_buffers_and_a_batch_packed_at_once_read_back(tmp_path: Path) -> None:
    records = records_of([3 * direct_writes.STAGE_BYTES + 5, 0, 17, direct_writes.STAGE_BYTES])
    storage = DocumentStorage(tmp_path / "records", RawFormat())
    with bulk_writer(storage) as writer:
        writer.append(0, records[0])
        sizes = [len(record) for record in records[1:]]
        writer.append_encoded(0, np.frombuffer(b"".join(records[1:]), np.uint8), sizes)
    with storage.sync_reader() as reader:
        assert [reader.read(index) for index in range(4)] == records
    assert storage.verify() == []


def test_the_data_is_not_left_in_the_page_cache(tmp_path: Path) -> None:
    stage = direct_writes.STAGE_BYTES
    for direct, at_most, at_least in [(True, 0.05, 0.0), (False, 1.0, 0.95)]:
        storage = write(tmp_path / str(direct), [(0, record) for record in records_of([stage] * 3)], direct)
        (shard,) = (storage.path / "shards").iterdir()
        assert at_least <= cached_fraction(shard, 0, 3 * stage) <= at_most, f"direct={direct}"


def test_a_file_system_that_refuses_o_direct_gets_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = [(shard, record) for shard, record in enumerate(records_of([direct_writes.STAGE_BYTES + 9, 100] * 2))]
    write(tmp_path / "cached", shards, direct=False)
    real_open = os.open

    def refusing(path: str | Path, flags: int, mode: int = 0o777) -> int:
        if flags & direct_writes.DIRECT:
            if flags & os.O_CREAT:
                os.close(real_open(path, flags & ~direct_writes.DIRECT, mode))  # as Linux: created, then refused
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_open(path, flags, mode)

    monkeypatch.setattr(os, "open", refusing)
    storage = write(tmp_path / "refused", shards, direct=True)
    monkeypatch.undo()
    assert shard_files(tmp_path / "refused") == shard_files(tmp_path / "cached")
    assert storage.verify() == []


def test_a_file_system_that_opens_with_o_direct_but_refuses_its_writes_gets_the_same_files(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shards = [(0, record) for record in records_of([direct_writes.STAGE_BYTES + 9, 100, 3 * direct_writes.STAGE_BYTES])]
    write(tmp_path / "cached", shards, direct=False)
    real_pwrite, refused = os.pwrite, []

    def refusing(descriptor: int, data: memoryview, offset: int) -> int:
        if fcntl.fcntl(descriptor, fcntl.F_GETFL) & direct_writes.DIRECT:
            refused.append(offset)
            raise OSError(errno.EINVAL, "Invalid argument")
        return real_pwrite(descriptor, data, offset)

    monkeypatch.setattr(os, "pwrite", refusing)
    storage = write(tmp_path / "refused", shards, direct=True)
    monkeypatch.undo()
    assert refused == [0]  # the first write is refused; the others go through the cache
    assert shard_files(tmp_path / "refused") == shard_files(tmp_path / "cached")
    assert storage.verify() == []


def test_a_failed_background_write_commits_nothing_and_says_why(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(descriptor: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    storage = DocumentStorage(tmp_path / "records", RawFormat())
    with pytest.raises(OSError, match="No space left on device"):
        with bulk_writer(storage) as writer:
            writer.append(0, records_of([direct_writes.STAGE_BYTES * 2])[0])
    monkeypatch.undo()
    assert storage.committed_shards() == []
    assert not any((storage.path / "incomplete").iterdir())


def test_a_write_that_failed_while_appending_goes_on_is_raised_by_a_later_append(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def full(descriptor: int, data: memoryview, offset: int) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "pwrite", full)
    storage = DocumentStorage(tmp_path / "records", RawFormat())
    with pytest.raises(OSError, match="No space left on device"):
        with bulk_writer(storage) as writer:
            writer.append(0, bytes(direct_writes.STAGE_BYTES))  # its buffer's write fails in the background
            time.sleep(0.3)
            writer.append(0, bytes(direct_writes.STAGE_BYTES))  # the next hand-off finds the failure
    monkeypatch.undo()
    assert storage.committed_shards() == []
    assert not any((storage.path / "incomplete").iterdir())


def test_a_writer_left_by_an_error_waits_for_the_write_under_way_before_closing_the_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_pwrite, failures = os.pwrite, []

    def slow(descriptor: int, data: memoryview, offset: int) -> int:
        time.sleep(0.3)  # the writer is left meanwhile
        try:
            return real_pwrite(descriptor, data, offset)
        except OSError as error:  # a descriptor closed under it (or reused: another file written)
            failures.append(error)
            raise

    monkeypatch.setattr(os, "pwrite", slow)
    storage = DocumentStorage(tmp_path / "records", RawFormat())
    with pytest.raises(KeyError):
        with bulk_writer(storage) as writer:
            writer.append(0, records_of([direct_writes.STAGE_BYTES + 1])[0])  # one buffer handed off
            raise KeyError("the caller's own error")
    monkeypatch.undo()
    assert failures == []
    assert not any((storage.path / "incomplete").iterdir())


def test_zlib_ng_and_zlib_give_the_same_checksums() -> None:
    data = records_of([1 << 20])[0]
    assert crc32(data) == zlib.crc32(data)
    assert crc32(data[1000:], crc32(data[:1000])) == zlib.crc32(data)
