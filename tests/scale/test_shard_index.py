"""Opening a storage reads one small index (``shards.index``), never every shard, and lists nothing.

A commit's record in the index is its commit point. A storage without a complete index (a 0.2
storage, a torn or damaged record) is read from its listing and footers once, and gets a complete
index; a record that disagrees with its shard is refused when the shard is opened.
"""

from __future__ import annotations

import fcntl
import gc
import os
import signal
import subprocess
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from guideloom import CorruptStorageError, ShardExistsError, StatefulDataLoader, TokenStorage
from guideloom._cli import main
from guideloom._shards import index as index_module
from guideloom._shards import snapshot
from guideloom._shards.index import INDEX_NAME, PREAMBLE, read_index
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


def test_a_writer_s_commit_records_the_shard_in_the_index(storage_path: Path) -> None:
    storage = TokenStorage(storage_path)
    with storage.sync_writer() as writer:
        writer.append(3, np.arange(10))
        writer.append(1, np.arange(4))
        writer.append(1, np.arange(5))
    contents = read_index(storage_path)
    assert contents.complete and contents.table.ids.tolist() == [1, 3]
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
    assert contents.complete and contents.table.ids.tolist() == list(range(40))
    assert batches(old) == indexed


def test_an_index_that_cannot_be_written_does_not_stop_readers_or_writers(tmp_path: Path) -> None:
    storage = document_shards(tmp_path / "documents", 5, indexed=False)
    (tmp_path / "documents" / INDEX_NAME).mkdir()  # as unwritable as a read-only file system, even for root
    with storage.sync_writer() as writer:
        writer.append(5, {"id": 10})
    with storage.sync_reader() as reader:
        assert [reader.read(i) for i in range(len(reader))] == [{"id": i} for i in range(11)]


def test_a_torn_record_at_the_end_is_ignored(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    with open(tmp_path / "tokens" / INDEX_NAME, "ab") as index:
        index.write(b"\x07" * (RECORD.itemsize // 2))  # an append being copied in, or torn by a power cut
    assert read_index(tmp_path / "tokens").complete  # no commit: its fsync never returned
    assert batches(storage) == expected
    with storage.sync_writer() as writer:  # the next append lands out of step: that index is no longer complete
        writer.append(6, np.arange(4))
    assert not read_index(tmp_path / "tokens").complete
    assert storage.committed_shards() == list(range(7))
    assert read_index(tmp_path / "tokens").complete  # replaced by a complete one


def test_a_damaged_record_is_ignored_and_its_shard_read_from_its_footer(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    raw = bytearray(index.read_bytes())
    raw[len(PREAMBLE) + RECORD.itemsize * 2 + 9] ^= 0x40  # shard 2's record count, under its checksum
    index.write_bytes(bytes(raw))
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


KILLED_BETWEEN_LINK_AND_RECORD = """
import os, signal, sys
import numpy as np
import guideloom._shards.local_commit as local_commit
from guideloom import TokenStorage

def killed(*arguments, **keywords):
    os.kill(os.getpid(), signal.SIGKILL)  # the shard is linked into shards/, its record not yet written

with TokenStorage(sys.argv[1]).sync_writer() as writer:
    writer.append(6, np.arange(6, dtype=np.uint32))
    local_commit.append_records = killed
    writer.commit(6)
"""


def test_a_shard_whose_writer_was_killed_before_its_record_is_not_committed(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    killed = run_python(KILLED_BETWEEN_LINK_AND_RECORD, tmp_path / "tokens")
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert (tmp_path / "tokens" / "shards" / "000000000006.shard").exists()  # a stray: linked, never committed
    assert storage.committed_shards() == list(range(6))
    assert batches(storage) == expected
    assert storage.verify() == []


def test_the_next_commit_of_a_stray_s_id_replaces_it(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]]
) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    assert run_python(KILLED_BETWEEN_LINK_AND_RECORD, tmp_path / "tokens").returncode == -signal.SIGKILL
    with storage.sync_writer() as writer:
        writer.append(6, np.arange(100, 103))
    with storage.sync_reader() as reader:
        assert len(reader) == 13 and reader.read(12).tolist() == [100, 101, 102]


def test_a_commit_in_progress_is_not_taken_for_a_stray(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 2)
    linked = tmp_path / "tokens" / "shards" / "000000000002.shard"
    os.link(tmp_path / "tokens" / "shards" / "000000000001.shard", linked)
    descriptor = os.open(linked, os.O_RDONLY)
    fcntl.flock(descriptor, fcntl.LOCK_EX)  # as its writer holds it between the link and the record
    try:
        with pytest.raises(ShardExistsError, match="shard 2"), storage.sync_writer() as writer:
            writer.append(2, np.arange(3))
    finally:
        os.close(descriptor)
    assert storage.committed_shards() == [0, 1]


def test_a_complete_index_is_all_a_reader_reads(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 5)
    expected = batches(storage)
    shards = tmp_path / "tokens" / "shards"
    os.link(shards / "000000000004.shard", shards / "000000000009.shard")  # a file the index does not record
    assert storage.committed_shards() == [0, 1, 2, 3, 4]
    assert batches(storage) == expected


def test_a_damaged_index_counts_every_listed_shard(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    index = tmp_path / "tokens" / INDEX_NAME
    raw = bytearray(index.read_bytes()[: -RECORD.itemsize])  # shard 5 is left a stray
    raw[len(PREAMBLE) + RECORD.itemsize + 9] ^= 0x40  # and shard 1's record is damaged
    index.write_bytes(bytes(raw))
    assert storage.committed_shards() == [0, 1, 2, 3, 4, 5]  # the listing cannot tell the stray from shard 1
    contents = read_index(tmp_path / "tokens")
    assert contents.complete and contents.table.ids.tolist() == [0, 1, 2, 3, 4, 5]


def test_strays_are_named_by_inspect_and_removed_by_clean(
    tmp_path: Path, run_python: Callable[..., subprocess.CompletedProcess[str]], capsys: pytest.CaptureFixture[str]
) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    assert run_python(KILLED_BETWEEN_LINK_AND_RECORD, tmp_path / "tokens").returncode == -signal.SIGKILL
    assert storage.stray_shards() == [6]
    assert main(["inspect", str(tmp_path / "tokens")]) == 0
    assert "1 shard file in shards/ that no commit recorded (first: 6)" in capsys.readouterr().out
    assert storage.clean_leftovers(older_than=3600) == []  # younger than that: left alone
    stray = tmp_path / "tokens" / "shards" / "000000000006.shard"
    assert stray in storage.clean_leftovers(older_than=0)
    assert not stray.exists() and storage.stray_shards() == [] and storage.committed_shards() == list(range(6))


def test_a_commit_whose_record_cannot_be_written_whole_fails_and_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 3)
    expected = batches(storage)
    write = os.write
    monkeypatch.setattr(os, "write", lambda descriptor, data: write(descriptor, data[:17]))  # as on a full disk
    with pytest.raises(OSError, match="only 17 of 40 bytes"), storage.sync_writer() as writer:
        writer.append(3, np.arange(4))
    monkeypatch.undo()
    assert not (tmp_path / "tokens" / "shards" / "000000000003.shard").exists()
    assert storage.committed_shards() == [0, 1, 2] and batches(storage) == expected


def test_a_shard_committed_while_a_reader_rebuilds_the_index_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    storage = token_shards(tmp_path / "tokens", 5, indexed=False)  # a 0.2 storage: the first reader indexes it
    replace = snapshot.replace_index

    def commit_then_replace(path: Path, table: ShardTable) -> None:
        with storage.sync_writer() as writer:  # after the reader listed, before its index is in place
            writer.append(9, np.arange(3, dtype=np.uint32))
        replace(path, table)

    monkeypatch.setattr(snapshot, "replace_index", commit_then_replace)
    assert storage.committed_shards() == [0, 1, 2, 3, 4]  # the reader's snapshot: what it listed
    monkeypatch.undo()
    contents = read_index(tmp_path / "tokens")
    assert contents.complete and contents.table.ids.tolist() == [0, 1, 2, 3, 4, 9]  # it listed again after


def test_an_index_without_its_preamble_is_read_from_the_listing_and_replaced(tmp_path: Path) -> None:
    storage = token_shards(tmp_path / "tokens", 6)
    expected = batches(storage)
    index = tmp_path / "tokens" / INDEX_NAME
    index.write_bytes(index.read_bytes()[len(PREAMBLE) :])  # as the first 0.3 build wrote it: records only
    assert not read_index(tmp_path / "tokens").complete
    assert batches(storage) == expected
    assert index.read_bytes()[: len(PREAMBLE)] == PREAMBLE and read_index(tmp_path / "tokens").complete


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
