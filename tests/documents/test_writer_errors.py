"""A record the format cannot pack: an error naming shard and record, and what leaving the writer by it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from guideloom import DocumentJsonFormat, DocumentStorage, GuideloomError, RecordPackError, TokenStorage


def test_an_unpackable_record_names_its_shard_and_index_and_writes_nothing(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with storage.sync_writer() as writer:
        writer.append(7, {"id": 0})
        writer.append(7, {"id": 1})
        with pytest.raises(RecordPackError) as raised:
            writer.append(7, {"id": 2, "raw": b"\x00"})
        writer.append(7, {"id": 3})  # the writer goes on: nothing of the bad record was written
    message = str(raised.value)
    assert "record 2 of shard 7" in message
    assert "TypeError: Object of type bytes is not JSON serializable" in message
    assert isinstance(raised.value.__cause__, TypeError)
    assert isinstance(raised.value, TypeError | ValueError | GuideloomError)
    with storage.sync_reader() as reader:
        assert list(reader) == [{"id": 0}, {"id": 1}, {"id": 3}]


def test_the_first_record_of_a_new_shard_is_record_0(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with storage.sync_writer() as writer:
        with pytest.raises(RecordPackError, match=r"record 0 of shard 3: ValueError: Out of range float"):
            writer.append(3, {"x": float("nan")})
    assert storage.committed_shards() == []  # no empty shard was left behind


def test_a_token_the_dtype_cannot_hold_names_shard_and_record_too(tmp_path: Path) -> None:
    storage = TokenStorage(tmp_path / "tokens", "uint8")
    with storage.sync_writer() as writer:
        writer.append(1, [1, 2])
        with pytest.raises(RecordPackError, match=r"record 1 of shard 1: .*300"):
            writer.append(1, [1, 300])


def test_the_rolling_writer_names_the_record_in_the_shard_being_filled(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with storage.sync_writer(shard_size=2 * len(b'{"id":0}')) as writer:
        for index in range(3):
            writer.append({"id": index})
        with pytest.raises(RecordPackError, match=r"record 1 of the shard being filled .*record 3 appended"):
            writer.append({"id": b"3"})


def test_leaving_a_writer_by_an_error_discards_its_open_shards_and_says_so(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with pytest.raises(RecordPackError) as raised:
        with storage.sync_writer() as writer:
            writer.append(0, {"id": 0})
            writer.commit(0)  # complete: committed for good
            writer.append(1, {"id": 1})
            writer.append(2, {"id": 2})
            writer.append(2, {"id": b"3"})
    assert storage.committed_shards() == [0]
    assert any("discarded shards [1, 2]" in note and "committed before: [0]" in note for note in raised.value.__notes__)
    assert not list((tmp_path / "docs" / "incomplete").iterdir())


def test_leaving_the_rolling_writer_by_an_error_commits_what_was_appended(tmp_path: Path) -> None:
    storage = DocumentStorage(tmp_path / "docs", DocumentJsonFormat())
    with pytest.raises(RecordPackError) as raised:
        with storage.sync_writer(shard_size=2 * len(b'{"id":0}')) as writer:
            for index in range(5):
                writer.append({"id": index if index != 3 else b"3"})
    assert writer.committed_records == 3
    assert any("committed the first 3 of the 3 records" in note for note in raised.value.__notes__)
    with storage.sync_reader() as reader:
        assert list(reader) == [{"id": 0}, {"id": 1}, {"id": 2}]
