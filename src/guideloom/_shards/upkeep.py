"""Looking after a local storage: verifying every committed shard (and the strays beside them), cleaning up.

What ``storage.verify()`` and ``storage.clean_leftovers()`` do for a local path (an object store's
storage has its own, in ``_remote.remote_files``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

from guideloom._core.errors import CorruptStorageError, FormatMismatchError
from guideloom._shards.files import LocalShards, clean_incomplete
from guideloom._shards.layout import INCOMPLETE_DIR, ShardFile, StorageHeader, verify_shards
from guideloom._shards.local_commit import remove_strays, stray_shards
from guideloom._shards.snapshot import local_snapshot


def verify_local(path: Path, header: StorageHeader, progress: Callable[[int], None] | None) -> list[str]:
    """Recompute every committed shard's checksums; the problems found, each naming its shard."""
    problems: list[str] = []
    return verify_shards(_each_shard(path, header, problems), progress, problems)


def _each_shard(path: Path, header: StorageHeader, problems: list[str]) -> Iterator[ShardFile]:
    """Each committed shard, opened in turn and closed after; one that cannot be opened is a problem, as is a
    stray (see ``stray_shards``) that is not a sound shard of its name."""
    shards = LocalShards(path, header, local_snapshot(path, header), 1)
    for position in range(len(shards.infos)):
        try:
            shard = shards.open(position)  # the file, and that it holds what the index says
        except (CorruptStorageError, FormatMismatchError) as error:
            problems.append(str(error))  # a shard that cannot even be opened is one more problem
            continue
        try:
            yield shard
        finally:
            shard.close()
    for stray in stray_shards(path):  # not part of the storage, but a damaged one is a bad file all the same
        try:
            opened = ShardFile(path, stray, header)
        except (CorruptStorageError, FormatMismatchError) as error:
            problems.append(f"{error} (a stray: no commit recorded shard {stray})")
            continue
        opened.close()


def clean_local(path: Path, older_than: float) -> list[Path]:
    """Delete what dead writers left, untouched for ``older_than`` seconds: files in ``incomplete/``, and strays."""
    return [*clean_incomplete(path / INCOMPLETE_DIR, older_than), *remove_strays(path, older_than)]
