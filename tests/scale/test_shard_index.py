"""Opening a storage reads one small index (``shards.index``), never every shard, and lists nothing if it is current.

The shard file under its name is the commit; the index is derived. A storage whose index is absent
(0.2), of 0.3, stale or damaged is read from its listing and the footers the index cannot give, and
gets a new index; a record that disagrees with its shard is refused when the shard is opened.
"""

from __future__ import annotations

import errno
import gc
import os
import signal
import subprocess
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from guideloom import CorruptStorageError, ShardExistsError, StatefulDataLoader, TokenStorage
from guideloom._shards import freshness, local_commit, local_listing
from guideloom._shards import index as index_module
from guideloom._shards.index import HEADER, INDEX_NAME, PREAMBLE, encode_index, read_index
from guideloom._shards.shard_table import RECORD, ShardTable
from tests.scale.many_shards import document_shards, token_shards


def mapped_shards() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith(".shard"))


def batches(storage: TokenStorage, **arguments: object) -> list[list[int]]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=5, sequence_length=8, shuffle=True, seed=4, **arguments
    ) as loader:
        return [batch.tolist() for batch in loader]


def test_a_closing_writer_leaves_an_index_of_its_shards(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    with storage.sync_writer() as writer:
        writer.append(3, np.arange(10))
        writer.append(1, np.arange(4))
        writer.append(1, np.arange(5))
    contents = read_index(storage_path)
    assert contents.problem is None and contents.stamp is not None and contents.table.ids.tolist() == [1, 3]
    by_id = {info.id: (info.record_count, info.element_count) for info in contents.table}
    assert by_id == {1: (2, 9), 3: (1, 10)}


def test_construction_and_state_open_no_shard(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 2_000)
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=8) as loader:
        assert len(loader) == 2_000 and mapped_shards() == 0
        state = loader.state_dict()
        assert mapped_shards() == 0
        next(iter(loader))
        assert mapped_shards() == 1
    with StatefulDataLoader.from_storage(storage, device="cpu", local_batch_size=2, sequence_length=8) as fresh:
        fresh.load_state_dict(state)
        assert mapped_shards() == 0


def test_a_storage_without_an_index_opens_the_same_and_gets_one(tmp_path: Path) -> None:
    indexed = batches(token_shards(tmp_path / "indexed", 40))
    old = token_shards(tmp_path / "old", 40, indexed=False)  # as guideloom 0.2 wrote it
    assert not (tmp_path / "old" / INDEX_NAME).exists()
    assert batches(old) == indexed
    contents = read_index(tmp_path / "old")  # written when first opened
    assert contents.problem is None and contents.table.ids.tolist() == list(range(40))
    assert batches(old) == indexed


def test_an_index_that_cannot_be_written_does_not_stop_readers_or_writers(tmp_path: Path) -> None:
    storage = document_shards(tmp_path / "documents", 5, indexed=False)
    (tmp_path / "documents" / INDEX_NAME).mkdir()  # as unwritable as a read-only file system, even for root
    with storage.sync_writer() as writer:
        writer.append(5, {"id": 10})
    with storage.sync_reader() as reader:
        assert [reader.read(i) for i in range(len(reader))] == [{"id": i} for i in range(11)]


def test_an_index_cut_short_is_bypassed_and_rebuilt(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    index.write_bytes(index.read_bytes()[:-7])
    assert "its header counts 6 shards" in str(read_index(tmp_path / "tokens").problem)
    assert batches(storage) == expected
    assert read_index(tmp_path / "tokens").problem is None  # rebuilt from the listing and the footers


def test_a_damaged_record_is_named_and_its_shard_read_from_its_footer(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    raw = bytearray(index.read_bytes())
    raw[HEADER.size + RECORD.itemsize * 2 + 9] ^= 0x40  # shard 2's record count, under its checksums
    index.write_bytes(bytes(raw))
    assert read_index(tmp_path / "tokens").problem == "its records are out of order or unsound"
    assert batches(storage) == expected


def test_a_record_that_disagrees_with_its_shard_is_refused_when_the_shard_is_opened(tmp_path: Path) -> None:
    token_shards(tmp_path / "tokens", 4)
    token_shards(tmp_path / "other", 4, tokens_per_document=9, indexed=False)
    other_shard = tmp_path / "other" / "shards" / "000000000002.shard"
    (tmp_path / "tokens" / "shards" / "000000000002.shard").write_bytes(other_shard.read_bytes())  # rewritten
    with TokenStorage(tmp_path / "tokens").sync_reader() as reader, pytest.raises(CorruptStorageError, match="shard 2"):
        reader.read(4)


def test_shards_committed_later_are_not_seen_by_an_open_reader(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 3)
    with storage.sync_reader() as reader:
        with storage.sync_writer() as writer:
            writer.append(7, np.arange(5))
        assert len(reader) == 6
    with storage.sync_reader() as reader:
        assert len(reader) == 7 and reader.read(6).tolist() == list(range(5))


def test_crafted_names_beside_the_shards_leave_the_listing_sorted_and_exact(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 12)
    expected = batches(storage)
    shards = tmp_path / "tokens" / "shards"
    for name in ("00000000000\u0661.shard", "000000000003.shard.tmp", "x" * 18):
        (shards / name).write_bytes((shards / "000000000003.shard").read_bytes())
    assert batches(storage) == expected


KILLED_AFTER_THE_LINK = """
import os, signal, sys
import numpy as np
import guideloom._shards.local_commit as local_commit
from guideloom import TokenStorage

def killed(*arguments, **keywords):
    os.kill(os.getpid(), signal.SIGKILL)  # the shard is linked into shards/, the directory not yet fsynced

with TokenStorage(sys.argv[1]).sync_writer() as writer:
    writer.append(6, np.arange(6, dtype=np.uint32))
    local_commit.fsync_directory = killed
    writer.commit(6)
"""


def test_a_writer_killed_right_after_its_link_committed_its_shard(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    killed = run_python(KILLED_AFTER_THE_LINK, tmp_path / "tokens")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert storage.committed_shards() == list(range(7))
    with storage.sync_reader() as reader:
        assert reader.read(12).tolist() == [0, 1, 2, 3, 4, 5]
    assert storage.verify() == []
    with pytest.raises(ShardExistsError, match="shard 6"), storage.sync_writer() as writer:
        writer.append(6, np.arange(3))


def test_a_name_taken_in_shards_is_a_committed_shard_for_writers(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 2)
    token_shards(tmp_path / "other", 3)
    os.link(tmp_path / "other" / "shards" / "000000000002.shard", tmp_path / "tokens" / "shards" / "000000000002.shard")
    with pytest.raises(ShardExistsError, match="shard 2"), storage.sync_writer() as writer:
        writer.append(2, np.arange(3))
    assert storage.committed_shards() == [0, 1, 2]


def test_a_current_index_is_all_a_reader_reads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    storage = token_shards(tmp_path / "tokens", 5)
    expected = batches(storage)  # the first reader may list once, and leaves an index that proves itself current
    monkeypatch.setattr(local_listing, "listed_shard_ids", lambda path: pytest.fail("a current index was listed again"))
    assert storage.committed_shards() == [0, 1, 2, 3, 4]
    assert batches(storage) == expected


def test_a_shard_linked_in_by_hand_is_committed(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 5)
    batches(storage)
    token_shards(tmp_path / "other", 10)
    os.link(tmp_path / "other" / "shards" / "000000000009.shard", tmp_path / "tokens" / "shards" / "000000000009.shard")
    assert storage.committed_shards() == [0, 1, 2, 3, 4, 9]  # the index does not record it: it is stale now


def test_a_damaged_index_counts_every_listed_shard(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    index = tmp_path / "tokens" / INDEX_NAME
    raw = bytearray(index.read_bytes()[: -RECORD.itemsize])  # shard 5 is left out
    raw[HEADER.size + RECORD.itemsize + 9] ^= 0x40  # and shard 1's record is damaged
    index.write_bytes(bytes(raw))
    assert storage.committed_shards() == [0, 1, 2, 3, 4, 5]
    contents = read_index(tmp_path / "tokens")
    assert contents.problem is None and contents.table.ids.tolist() == [0, 1, 2, 3, 4, 5]


def test_clean_removes_unfinished_files_and_never_a_shard(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    unfinished = tmp_path / "tokens" / "incomplete" / "000000000006.shard.dead-writer"
    unfinished.write_bytes(b"half a shard")
    assert storage.clean_leftovers(older_than=3600) == []  # younger than that: left alone
    assert storage.clean_leftovers(older_than=0) == [unfinished]
    assert storage.committed_shards() == list(range(6)) and len(os.listdir(tmp_path / "tokens" / "shards")) == 6


def test_a_commit_whose_shard_cannot_be_made_durable_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 3)
    expected = batches(storage)

    def failing(descriptor: int) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "fsync", failing)
    with pytest.raises(OSError, match="Input/output error"), storage.sync_writer() as writer:
        writer.append(3, np.arange(4))
    monkeypatch.undo()
    assert not (tmp_path / "tokens" / "shards" / "000000000003.shard").exists()
    assert os.listdir(tmp_path / "tokens" / "incomplete") == []
    assert storage.committed_shards() == [0, 1, 2] and batches(storage) == expected


def test_a_commit_whose_directory_fsync_fails_says_the_shard_is_committed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 3)

    def failing(path: Path) -> None:
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(local_commit, "fsync_directory", failing)
    with pytest.raises(OSError, match="shard 3 is committed"), storage.sync_writer() as writer:
        writer.append(3, np.arange(4))
    monkeypatch.undo()
    assert storage.committed_shards() == [0, 1, 2, 3]
    with pytest.raises(ShardExistsError, match="shard 3"), storage.sync_writer() as writer:
        writer.append(3, np.arange(4))


def test_a_shard_committed_while_a_reader_rebuilds_the_index_is_seen_by_the_next(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 5, indexed=False)  # a 0.2 storage: the first reader indexes it
    listed = local_listing.listed_shard_ids

    def list_then_commit(path: Path) -> np.ndarray:
        ids = listed(path)
        with storage.sync_writer() as writer:  # after the reader listed, before its index is in place
            writer.append(9, np.arange(3, dtype=np.uint32))
        return ids

    monkeypatch.setattr(local_listing, "listed_shard_ids", list_then_commit)
    assert storage.committed_shards() == [0, 1, 2, 3, 4]  # the reader's snapshot: what it listed
    monkeypatch.undo()
    assert storage.committed_shards() == [0, 1, 2, 3, 4, 9]  # its index did not prove itself current


def test_an_index_made_in_the_same_clock_tick_as_a_commit_proves_nothing(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 4)
    storage.committed_shards()
    contents = read_index(tmp_path / "tokens")
    assert contents.stamp is not None and freshness.is_current(contents, tmp_path / "tokens")
    same_tick = replace(contents.stamp, listed_after=max(contents.stamp.mtime_ns, contents.stamp.ctime_ns))
    (tmp_path / "tokens" / INDEX_NAME).write_bytes(encode_index(ShardTable(contents.table.rows[:3]), same_tick))
    assert not freshness.is_current(read_index(tmp_path / "tokens"), tmp_path / "tokens")
    assert storage.committed_shards() == [0, 1, 2, 3]


def test_an_index_of_guideloom_0_3_is_read_from_the_listing_and_replaced(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    rows = read_index(tmp_path / "tokens").table.rows
    index.write_bytes(PREAMBLE + rows[:4].tobytes())  # 0.3: shards 4 and 5 were strays, now they are committed
    assert read_index(tmp_path / "tokens").stamp is None
    assert batches(storage) == expected
    assert read_index(tmp_path / "tokens").stamp is not None


def test_an_index_without_any_header_is_named_and_replaced(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    index.write_bytes(read_index(tmp_path / "tokens").table.rows.tobytes())  # as the first 0.3 build wrote it
    assert read_index(tmp_path / "tokens").problem == "it has no header"
    assert batches(storage) == expected
    assert read_index(tmp_path / "tokens").problem is None


def index_mappings() -> int:
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith(INDEX_NAME))


def test_a_large_index_is_mapped_while_a_loader_reads_and_let_go_when_it_closes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 300)
    expected = batches(storage)
    monkeypatch.setattr(index_module, "MAPPED_SIZE", RECORD.itemsize * 100)  # as for 26,000 shards and more
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=5, sequence_length=8, shuffle=True, seed=4
    ) as loader:
        assert index_mappings() == 1
        assert [batch.tolist() for batch in loader] == expected
    gc.collect()
    assert index_mappings() == 0


def test_the_index_header_is_two_records_long_as_the_format_says(tmp_path: Path) -> None:
    token_shards(tmp_path / "tokens", 3)
    assert HEADER.size == 2 * RECORD.itemsize
    assert (tmp_path / "tokens" / INDEX_NAME).stat().st_size == HEADER.size + 3 * RECORD.itemsize
