"""The writer checksums and flushes large shards in a background thread: the same bytes, failures surface."""

from __future__ import annotations

import errno
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import guideloom._shards.shard_in_progress
import guideloom._shards.writer
from guideloom import DocumentPickleFormat, DocumentStorage, TokenStorage

NO_BACKGROUND = 1 << 62  # a chunk no shard reaches: everything is checksummed at commit


def shard_files(path: Path) -> dict[str, bytes]:
    return {file.name: file.read_bytes() for file in sorted((path / "shards").iterdir())}


def write_tokens(path: Path, documents: list[tuple[int, np.ndarray]]) -> TokenStorage:
    storage = TokenStorage(path, "uint16")
    with storage.sync_writer() as writer:
        for shard, tokens in documents:
            writer.append(shard, tokens)
    return storage


def documents_of(sizes: list[int], shards: list[int]) -> list[tuple[int, np.ndarray]]:
    rng = np.random.default_rng(len(sizes))
    return [(shard, rng.integers(0, 2**16, size, dtype=np.uint16)) for size, shard in zip(sizes, shards, strict=True)]


@settings(max_examples=30, deadline=None)
@given(
    sizes=st.lists(st.integers(0, 3000), min_size=1, max_size=40),
    shard_choices=st.lists(st.integers(0, 3), min_size=40, max_size=40),
    chunk=st.integers(1, 10_000),
)
def test_shard_bytes_do_not_depend_on_the_background_chunk(
    tmp_path_factory: pytest.TempPathFactory, sizes: list[int], shard_choices: list[int], chunk: int
) -> None:
    documents = documents_of(sizes, shard_choices[: len(sizes)])
    directory = tmp_path_factory.mktemp("chunks")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(guideloom._shards.shard_in_progress, "BACKGROUND_CHUNK", NO_BACKGROUND)
        write_tokens(directory / "at-commit", documents)
        patch.setattr(guideloom._shards.shard_in_progress, "BACKGROUND_CHUNK", chunk)
        patch.setattr(guideloom._shards.writer, "MAX_OPEN_FILES", 2)  # shards are closed and reopened meanwhile
        storage = write_tokens(directory / "background", documents)
    assert shard_files(directory / "background") == shard_files(directory / "at-commit")
    assert storage.verify() == []


def test_large_document_shards_verify_and_read_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(guideloom._shards.shard_in_progress, "BACKGROUND_CHUNK", 4096)
    records = [(index, b"x" * (index % 700)) for index in range(2000)]
    storage = DocumentStorage(tmp_path / "records", DocumentPickleFormat())
    with storage.sync_writer() as writer:
        for index, record in enumerate(records):
            writer.append(index % 2, record)
        writer.commit(0)
    with storage.sync_reader() as reader:
        assert list(reader) == records[0::2] + records[1::2]
    assert storage.verify() == []


def failing_sync(path: Path, start: int, stop: int, crc: int, sync: bool, *checkpointing: Any) -> Any:
    if sync:
        raise OSError(errno.EIO, "Input/output error (injected)")
    return real_checksum(path, start, stop, crc, sync, *checkpointing)


real_checksum = guideloom._shards.shard_in_progress._file_checksum


@pytest.fixture
def failing_disk(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> TokenStorage:
    """A token storage whose writers' background flushes fail, every KiB."""
    monkeypatch.setattr(guideloom._shards.shard_in_progress, "BACKGROUND_CHUNK", 1024)
    monkeypatch.setattr(guideloom._shards.shard_in_progress, "_file_checksum", failing_sync)
    return TokenStorage(tmp_path / "tokens", "uint32")


def test_a_failed_background_flush_fails_the_commit_and_publishes_nothing(
    tmp_path: Path, failing_disk: TokenStorage
) -> None:
    writer = failing_disk.sync_writer()
    with pytest.raises(OSError, match="injected"):
        for _ in range(100):  # the failure surfaces at a later append, or at the commit
            writer.append(0, np.arange(1000, dtype=np.uint32))
        writer.commit(0)
    writer.close(commit=False)
    assert list((tmp_path / "tokens" / "shards").iterdir()) == []
    assert list((tmp_path / "tokens" / "incomplete").iterdir()) == []


def test_a_shard_whose_background_flush_failed_is_never_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing_disk: TokenStorage
) -> None:
    """Even if the caller catches the failure and goes on appending, the shard cannot be committed."""
    storage = failing_disk
    with storage.sync_writer() as writer:
        failures = 0
        for _ in range(100):
            try:
                writer.append(0, np.arange(1000, dtype=np.uint32))
            except OSError:
                failures += 1
        assert failures >= 1
        # the disk works again
        monkeypatch.setattr(guideloom._shards.shard_in_progress, "_file_checksum", real_checksum)
        with pytest.raises(OSError, match="shard 0 cannot be committed: writing it failed earlier"):
            writer.commit(0)
        writer.append(1, [1, 2, 3])  # other shards are unaffected
    assert [file.name for file in (tmp_path / "tokens" / "shards").iterdir()] == ["000000000001.shard"]
    assert storage.verify() == []


def test_the_same_shard_appended_to_after_another_goes_to_the_right_file(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens", "uint32")
    with storage.sync_writer() as writer:
        for shard in (0, 0, 1, 0, np.int64(1), 1):  # the fast path for a repeated shard must not mix them up
            writer.append(shard, [int(shard)])
    with storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [[0], [0], [0], [1], [1], [1]]
