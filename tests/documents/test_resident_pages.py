"""A document reader gives back the mapped pages of the records it read, so they are not counted as its memory."""

from __future__ import annotations

import mmap
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from guideloom import DocumentStorage, StatefulDataLoader
from guideloom._shards import resident_pages, shard_in_progress
from tests.helpers.storages import RawFormat

RECORD = 64 * 1024
RECORDS = 256  # 16 MiB in one shard
LIMIT = 1024 * 1024
SLACK = 4 * LIMIT  # the pages read since the last release, and those the kernel maps around each one read


def resident_bytes(shard: Path) -> int:
    """This process's resident bytes of the mappings of ``shard`` (from /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        fields = line.split()
        if fields and "-" in fields[0] and len(fields) >= 5:  # a mapping's first line: range, perms, offset, dev, inode
            inside = len(fields) >= 6 and fields[5] == str(shard)
        elif inside and fields[0] == "Rss:":
            total += int(fields[1]) * 1024
    return total


@pytest.fixture
def storage(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> DocumentStorage[bytes, bytes]:
    monkeypatch.setattr(resident_pages, "RELEASE_BYTES", LIMIT)
    # Written in pieces of 256 KiB, the shard is held in folios of at most that (a fault maps no more), so the
    # bound shows at this small scale; the writer's 2 MiB pieces make folios twice the limit.
    monkeypatch.setattr(shard_in_progress, "WRITE_BUFFER", 256 * 1024)
    storage = DocumentStorage(tmp_path / "records", RawFormat())
    with storage.sync_writer() as writer:
        for index in range(RECORDS):
            writer.append(0, bytes([index]) * RECORD)
    return storage


def stacked(records: list[bytes]) -> np.ndarray:
    return np.stack([np.frombuffer(record, np.uint8) for record in records])


def shard_path(storage: DocumentStorage[bytes, bytes]) -> Path:
    return (Path(storage.path) / "shards" / "000000000000.shard").resolve()


def test_reading_every_record_leaves_at_most_the_limit_resident(storage: DocumentStorage[bytes, bytes]) -> None:
    with storage.sync_reader() as reader:
        for index in range(RECORDS):
            assert reader.read(index)[:1] == bytes([index])
        resident = resident_bytes(shard_path(storage))
    assert 0 < resident <= SLACK  # without the release: all 16 MiB


def test_records_read_before_a_release_still_hold_their_bytes(storage: DocumentStorage[bytes, bytes]) -> None:
    with storage.sync_reader() as reader:
        views = [reader.read_encoded(index)[0] for index in range(RECORDS)]  # released several times meanwhile
        assert all(bytes(view) == bytes([index]) * RECORD for index, view in enumerate(views))
        for view in views:
            view.release()


def test_a_loader_epoch_in_the_main_process_leaves_at_most_the_limit_resident(
    storage: DocumentStorage[bytes, bytes],
) -> None:
    with StatefulDataLoader.from_storage(storage, stacked, device="cpu", local_batch_size=8, shuffle=True) as loader:
        sums = sorted(int(batch[:, 0].astype(np.int64).sum()) for batch in loader)
        assert sum(sums) == sum(range(RECORDS))
        assert resident_bytes(shard_path(storage)) <= SLACK


def test_shards_mapping_no_more_than_the_limit_keep_their_pages(
    storage: DocumentStorage[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    # Records of 64 KiB are large: their bound, a sixteenth of the limit, is a little more than the shard maps.
    monkeypatch.setattr(resident_pages, "RELEASE_BYTES", 16 * RECORD * (RECORDS + 16))
    with storage.sync_reader() as reader:
        for _ in range(3):  # twice the limit read: a release would leave the records before it unmapped
            for index in range(RECORDS):
                assert reader.read(index)[:1] == bytes([index])
        assert resident_bytes(shard_path(storage)) >= RECORD * RECORDS  # nothing refaulted: every page stays mapped


@pytest.mark.parametrize(("record", "releases"), [(1024, 4), (64 * 1024, 64)])
def test_large_records_are_given_back_after_every_sixteenth_of_the_limit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, record: int, releases: int
) -> None:
    """Small records share folios, which a release would only fault in again; a large record's own are worth it."""
    released: list[object] = []
    monkeypatch.setattr(resident_pages, "release_pages", released.append)
    (tmp_path / "shard").write_bytes(bytes(2 * LIMIT))  # maps more than either bound
    with (tmp_path / "shard").open("rb") as file, mmap.mmap(file.fileno(), 0, prot=mmap.PROT_READ) as mapping:
        shard = SimpleNamespace(mapping=mapping)
        pages = resident_pages.ResidentPages(LIMIT)
        for _ in range(4 * LIMIT // record):
            pages.settle([shard])
            pages.add(record, 1)
        pages.settle([shard])
    assert len(released) == releases
