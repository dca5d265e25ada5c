"""A document reader's batch of records (``read_many``, what the loader calls): the records ``read`` gives, in order,
whichever shards they lie in and however few stay open; a bad index or a damaged record index is an error naming it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from guideloom import CorruptStorageError, DocumentJsonFormat, DocumentStorage
from tests.helpers.shard_files import set_offset, shard_file
from tests.helpers.storages import make_document_storage


def test_a_batch_holds_the_records_read_one_by_one_across_shards(tmp_path: Path) -> None:
    make_document_storage(tmp_path / "records", count=30, shards=4)
    storage = DocumentStorage(tmp_path / "records", DocumentJsonFormat(), max_open_shards=1)  # one shard open at a time
    indices = np.random.default_rng(3).permutation(30).astype(np.int64)
    with storage.sync_reader() as reader:
        expected = [reader.read(int(index)) for index in indices]
        assert reader.read_many(indices) == expected
        assert reader.read_many(indices) == expected  # again, through the shards kept at hand


@pytest.mark.parametrize("bad", [30, -1, 99])
def test_an_index_outside_the_storage_is_named(tmp_path: Path, bad: int) -> None:
    storage = make_document_storage(tmp_path / "records", count=30, shards=4)
    with storage.sync_reader() as reader, pytest.raises(IndexError, match=rf"index {bad} is out of range .* 30 rec"):
        reader.read_many(np.array([3, bad, 7], np.int64))


def test_an_index_damaged_under_an_open_reader_names_its_shard(tmp_path: Path) -> None:
    storage = make_document_storage(tmp_path / "records", count=30, shards=3)
    with storage.sync_reader() as reader:
        reader.read_many(np.arange(30, dtype=np.int64))  # every shard opened and kept at hand
        set_offset(shard_file(tmp_path / "records", 1), 2, 10**9)  # record 2 of shard 1 now ends far past its data
        with pytest.raises(CorruptStorageError, match="shard 1 has a damaged index at record 1"):
            reader.read_many(np.array([0, 11], np.int64))
