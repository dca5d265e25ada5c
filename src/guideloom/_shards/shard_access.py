"""How readers and writers reach a storage's shards without knowing where it lives.

Readers index shards by their :class:`ShardInfo` and open them through a :class:`ShardSet`; writers
build shards in a local directory and hand them to a :class:`CommitTarget`. The local implementations
(``_shards.local_shards``) map the storage's own files and commit by hard link; the remote ones
(``_remote.remote_files``) download into a cache and commit by upload.
"""

from __future__ import annotations

from pathlib import Path
from typing import Protocol

import numpy as np

from guideloom._shards.field_columns import ShardColumns
from guideloom._shards.layout import ShardFile, ShardInfo
from guideloom._shards.parts import ReadPlan
from guideloom._shards.shard_table import ShardTable


class ShardSet(Protocol):
    """The shards a reader reads, in order: their facts up front, each shard opened on demand."""

    infos: ShardTable
    location: str
    max_open: int  # how many shards a reader keeps open at once
    mapped_in_place: bool  # True: shards are read where they lie, so prefetching them gains nothing

    def open(self, position: int, whole: bool = False) -> ShardFile:
        """The shard at ``position``; a remote one may be the part of it that the plan names (a `ShardPart`) unless
        ``whole``."""
        ...

    def record_lengths(self, position: int) -> np.ndarray | None:
        """A shard's record lengths read without opening it, or None: the reader opens the shard for them."""
        ...

    def open_columns(self, position: int, fields: frozenset[str]) -> ShardColumns | None:
        """The field columns of ``fields`` of the shard at ``position``, held without the shard (an object store's
        ranged reads), or None: the reader takes them from the shard it opens."""
        ...

    def release(self, position: int, shard: ShardFile) -> None: ...

    def use_plan(self, plan: ReadPlan) -> None:
        """From now on open the shards ``plan`` names as those parts of them, the others whole (where shards cannot
        be read in parts, nothing changes)."""
        ...

    def prefetch(self, positions: list[int]) -> None: ...

    def close(self) -> None: ...


class CommitTarget(Protocol):
    """Where a writer's finished shards go: ``publish`` is the commit, atomic and at most once per shard id."""

    incomplete: Path  # a local directory for shards being built

    def committed(self, shard: int) -> bool: ...

    def publish(self, temporary: Path, info: ShardInfo) -> bool: ...

    def describe(self, shard: int) -> str: ...


def first_positions(positions: np.ndarray, limit: int) -> list[int]:
    """The first ``limit`` distinct values of ``positions``, in order of first appearance."""
    seen: dict[int, None] = {}
    for position in positions.tolist():
        if position not in seen:
            seen[position] = None
            if len(seen) >= limit:
                break
    return list(seen)
