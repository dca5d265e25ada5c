"""The shard files this process has mapped: what a file truncated under a reader can be named by.

Reading a mapped page past the end of a file that shrank raises SIGBUS, which Python cannot turn into
an exception: the process dies. So ``ShardFile`` records each mapping here while it is open, and

* ``check_mapped()`` compares every mapping's length with its file's size now (one ``fstat`` each,
  through the descriptor ``mmap`` keeps, about a microsecond): a shard truncated before a batch is
  read is a ``CorruptStorageError`` naming it; one truncated while the batch is read still kills;
* a listener (set in loader worker processes) is told whenever the set changes, so that the process
  that sees a worker die of SIGBUS can name the shards it had mapped (``_loading.worker_deaths``).
"""

from __future__ import annotations

import mmap
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from guideloom._core.errors import CorruptStorageError


class MappedShard(NamedTuple):
    shard: int
    path: Path
    size: int  # bytes mapped: the file's size when it was opened


# By id() of the mapping, held weakly: a shard file dropped without close() is still unmapped when collected.
_mapped: dict[int, tuple[MappedShard, weakref.ref[mmap.mmap]]] = {}
_listener: Callable[[list[MappedShard]], None] | None = None


def track(shard: int, path: Path, mapping: mmap.mmap) -> None:
    key = id(mapping)
    _mapped[key] = (MappedShard(shard, path, len(mapping)), weakref.ref(mapping, lambda _: _forget(key)))
    if _listener is not None:
        _listener(mapped_shards())


def untrack(mapping: mmap.mmap) -> None:
    _forget(id(mapping))


def _forget(key: int) -> None:
    if _mapped.pop(key, None) is not None and _listener is not None:
        _listener(mapped_shards())


def mapped_shards() -> list[MappedShard]:
    """The shards mapped now, in the order they were opened."""
    return [entry for entry, _ in _mapped.values()]


def listen(listener: Callable[[list[MappedShard]], None] | None) -> None:
    """Call ``listener`` with the mapped shards now and whenever they change (None: stop)."""
    global _listener
    _listener = listener
    if listener is not None:
        listener(mapped_shards())


def check_mapped() -> None:
    """CorruptStorageError naming the mapped shards whose files are shorter now than when they were mapped."""
    truncated = []
    for entry, reference in list(_mapped.values()):
        mapping = reference()
        if mapping is None:
            continue
        try:
            size = mapping.size()  # fstat of the mapped file itself, even if its name now names another
        except (OSError, ValueError):  # closed meanwhile
            continue
        if size < entry.size:
            truncated.append(f"shard {entry.shard} ({entry.path}: {size} of its {entry.size} bytes)")
    if truncated:
        raise CorruptStorageError(
            f"{'a shard was' if len(truncated) == 1 else 'shards were'} truncated under this reader: "
            f"{', '.join(truncated)}; committed shards never change, so the storage was damaged: run guideloom verify"
        )
