"""Opening a shard file: a file that changes while it is opened is refused as corrupt, never another error."""

from __future__ import annotations

import gc
import mmap
import os
from pathlib import Path
from typing import Any

import pytest

from guideloom import CorruptStorageError
from tests.helpers.shard_files import shard_file
from tests.helpers.storages import make_document_storage


def test_a_shard_truncated_between_its_size_check_and_its_mapping_is_corrupt(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process truncating the file after the size was read: mmap checks the size again and raises
    ValueError, which a loader's worker would pass on as it is; it must be the CorruptStorageError of a
    truncated shard (the hardening test of shards truncated under worker processes hit this window)."""
    path = tmp_path / "documents"
    storage = make_document_storage(path, 6, 1)
    real_mmap = mmap.mmap

    def truncated_first(descriptor: int, length: int, **options: Any) -> mmap.mmap:
        os.truncate(shard_file(path, 0), 0)  # deterministically inside the window
        return real_mmap(descriptor, length, **options)

    with storage.sync_reader() as reader:
        monkeypatch.setattr(mmap, "mmap", truncated_first)
        with pytest.raises(CorruptStorageError, match=r"shard 0 is truncated"):
            reader.read(0)


def test_a_reader_dropped_without_closing_unmaps_its_shards(tmp_path: Path) -> None:
    """The registry of mapped shards (which names a shard truncated under a worker) must not keep a mapping
    alive: a reader that is only garbage-collected still gives its shards' mappings back."""
    storage = make_document_storage(tmp_path / "documents", 6, 3)
    reader = storage.sync_reader()
    reader.read(0), reader.read(5)
    assert _mapped_shard_files(tmp_path) > 0
    del reader
    gc.collect()
    assert _mapped_shard_files(tmp_path) == 0


def _mapped_shard_files(under: Path) -> int:
    """The mappings of shard files under ``under`` (another test's leftovers in the same process are not counted)."""
    with open("/proc/self/maps") as maps:
        return sum(1 for line in maps if line.rstrip().endswith(".shard") and str(under) in line)
