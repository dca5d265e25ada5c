"""One snapshot per job: rank 0 takes the storage's snapshot (its shard index, or a listing) and broadcasts it.

Every rank then reads the same shards (a shard committed between two ranks' openings would
otherwise give them different sample counts: duplicated data, or a hang in a collective), and a job
of a thousand ranks costs one reading, not a thousand. The snapshot travels as a
:class:`ShardTable` (40 bytes per shard) through ``broadcast_object_list`` on the default group.
"""

from __future__ import annotations

from typing import Any

import torch

from guideloom._core.errors import GuideloomError, StorageNotFoundError
from guideloom._shards.shard_table import ShardTable
from guideloom._storage.storages import StorageBase


def in_job(rank: int, world_size: int) -> bool:
    """Whether these ranks are those of an initialised process group of more than one rank."""
    distributed = torch.distributed
    if world_size < 2 or not (distributed.is_available() and distributed.is_initialized()):
        return False
    return (distributed.get_rank(), distributed.get_world_size()) == (rank, world_size)


def job_snapshot(storage: StorageBase) -> ShardTable:
    """Rank 0's snapshot of ``storage``, received by every rank (so every rank must call this, as for a collective).

    A failure to list on rank 0 is raised on every rank. A rank that cannot see a shard of the snapshot
    (a local path that differs between machines) raises StorageNotFoundError naming it; on an object
    store every rank sees the same objects, and a shard gone later is named when it is downloaded.
    """
    distributed = torch.distributed
    message: list[Any] = [None]
    if distributed.get_rank() == 0:
        try:
            message = [storage.snapshot()]
        except GuideloomError as error:
            message = [(type(error), str(error))]
            distributed.broadcast_object_list(message, src=0)
            raise
    distributed.broadcast_object_list(message, src=0)
    received = message[0]
    if isinstance(received, tuple):
        kind, text = received
        raise kind(f"rank 0 could not list the storage: {text}")
    assert isinstance(received, ShardTable)
    if distributed.get_rank() != 0:
        _check_visible(storage, received, distributed.get_rank())
    return received


def _check_visible(storage: StorageBase, snapshot: ShardTable, rank: int) -> None:
    """StorageNotFoundError naming the first shard of rank 0's snapshot that this rank's directory lacks."""
    lacking = storage.home.unseen_shards(snapshot)  # ascending; none on an object store, which every rank sees
    if len(lacking):
        missing = int(lacking[0])
        raise StorageNotFoundError(
            f"shard {missing} of the storage at {storage.location}, which rank 0 listed for this job, is not there "
            f"on rank {rank}: every rank must see the same storage (a shared file system, or the same copy)"
        )
