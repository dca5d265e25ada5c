"""A commit is the link of a finished file to its shard name: a name already taken is another writer's
commit, unless it is this writer's own link whose success was not heard (an NFS reply lost, the call
retried)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from guideloom._shards.header import read_header
from guideloom._shards.local_commit import commit_shard
from guideloom._shards.local_listing import footer_facts
from tests.helpers.storages import make_document_storage


def test_a_link_whose_success_was_not_heard_is_this_writers_commit(tmp_path: Path) -> None:
    path = tmp_path / "documents"
    storage = make_document_storage(path, 6, 2)
    with storage.sync_reader() as reader:
        before = [reader.read(i) for i in range(6)]
    final = path / "shards" / "000000000001.shard"
    info = footer_facts(path, 1, read_header(path))
    temporary = path / "incomplete" / "retried.shard"
    temporary.parent.mkdir(exist_ok=True)
    shutil.copyfile(final, temporary)
    final.unlink()
    os.link(temporary, final)  # the server made the link; the client retries and gets EEXIST
    assert commit_shard(path, temporary, info) is True
    assert not temporary.exists()
    with storage.sync_reader() as reader:
        assert [reader.read(i) for i in range(6)] == before


def test_a_name_taken_by_another_file_is_not_committed_again(tmp_path: Path) -> None:
    path = tmp_path / "documents"
    make_document_storage(path, 6, 2)
    final = path / "shards" / "000000000001.shard"
    temporary = path / "incomplete" / "second-writer.shard"
    temporary.parent.mkdir(exist_ok=True)
    shutil.copyfile(final, temporary)  # the same bytes, another file: a rival writer of the same id
    assert commit_shard(path, temporary, footer_facts(path, 1, read_header(path))) is False
    assert not temporary.exists() and final.exists()
