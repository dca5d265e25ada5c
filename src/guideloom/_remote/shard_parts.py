"""A part of a shard, downloaded alone: the data a machine needs of it and the shard's tail, checked piece by piece.

A windowed epoch cuts the shards into equal machine shares, so a share begins and ends inside a shard,
and a machine needs only its part of such a boundary shard. A shard of a storage with checkpoints holds
the running CRC-32 of its data at the end of every ``checkpoint_bytes`` (docs/format.md), so the data
pieces that cover the part can be verified without the rest: a ranged read of those pieces and one of the
tail (offsets, record lengths, loss mask, checkpoints, footer) make a *part* of the shard.

A part is cached as a sparse file as large as the shard, the pieces and the tail at their own offsets,
under a name that says what it was wanted for (elements or records ``first .. stop - 1``); a reader opens
it as a `ShardPart`, mapped as a whole shard is, which says which data it holds (``held``). Readers read
only there (see ``_shards.reader``): a read outside the part opens the whole shard instead.
Storages without checkpoints, and compressed ones (an object that cannot be read by range), have no parts
(``StorageHeader.readable_in_parts``).
"""

from __future__ import annotations

import os
import zlib
from pathlib import Path

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.shard_cache import CacheEntry
from guideloom._shards.checkpoints import pieces_problem
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardFile, ShardInfo
from guideloom._shards.parts import PlannedPart
from guideloom._shards.sections import ShardSections

__all__ = ["download_part", "is_whole", "part_entry", "part_problem"]

READ_BYTES = 8 << 20  # a part's data is read by range in pieces of at most this many bytes (memory per read)


def part_entry(info: ShardInfo, wanted: PlannedPart) -> CacheEntry:
    """The cache entry of a shard's part; its size is the whole shard's until it is downloaded (what room a
    download makes at most); the cache counts a part's own blocks (see `held_bytes`)."""
    unit = "r" if wanted.in_records else "e"
    name = f"{info.id:012d}.{info.data_crc:08x}.{info.size}.{unit}{wanted.first}-{wanted.stop}.shard"
    return CacheEntry(name, info.size, info.id)


def is_whole(info: ShardInfo, wanted: PlannedPart, header: StorageHeader) -> bool:
    """Whether the part ``wanted`` names holds all the shard's data (a small shard): read it whole instead."""
    if wanted.in_records:
        return wanted.first == 0 and wanted.stop >= info.record_count
    checkpoint_bytes = header.checkpoint_bytes
    assert checkpoint_bytes is not None
    data_size = info.element_count * header.element_size
    return (
        wanted.first * header.element_size < checkpoint_bytes
        and wanted.stop * header.element_size > (data_size - 1) // checkpoint_bytes * checkpoint_bytes
    )


def download_part(
    store: ObjectStore, object_name: str, info: ShardInfo, header: StorageHeader, wanted: PlannedPart, path: Path
) -> None:
    """Write the part of the shard object ``object_name`` at ``path``: its tail, and the data pieces ``wanted``
    needs, each at its offset in a file as large as the shard (checked afterwards, by `part_problem`)."""
    data_size = info.element_count * header.element_size
    sections = ShardSections.of(info.record_count, data_size, header)
    tail_start = sections.index_start
    tail = _read(store, object_name, info, tail_start, info.size)
    offsets = np.frombuffer(tail, "<u8", info.record_count + 1) if len(tail) >= sections.index_size else None
    # A damaged tail gets no data: opening the part names it (and the download is tried again).
    sound = offsets is not None and bool((offsets[1:] >= offsets[:-1]).all()) and offsets[-1] == info.element_count
    low, high = wanted.data_range(offsets, header, data_size) if sound and offsets is not None else (0, 0)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.ftruncate(descriptor, info.size)
        os.pwrite(descriptor, tail, tail_start)
        for start in range(low, high, READ_BYTES):
            stop = min(start + READ_BYTES, high)
            os.pwrite(descriptor, _read(store, object_name, info, start, stop), start)
    finally:
        os.close(descriptor)


def _read(store: ObjectStore, object_name: str, info: ShardInfo, start: int, stop: int) -> bytes:
    raw = store.read(object_name, start, stop)
    if raw is None:
        raise CorruptStorageError(
            f"shard {info.id} vanished: {store.name_of(object_name)} was deleted from the store after this reader "
            "listed it"
        )
    if len(raw) != stop - start:
        raise CorruptStorageError(
            f"shard {info.id}: {store.name_of(object_name)} gave {len(raw)} bytes for its bytes {start}..{stop - 1}: "
            "object truncated?"
        )
    return raw


def part_problem(shard: ShardFile, wanted: PlannedPart, header: StorageHeader) -> str | None:
    """The problem with a downloaded part (its tail already checked by opening it), or None: its data pieces
    against their checkpoints, and the checkpoints and the tail against the footer's data checksum."""
    checkpoints, checkpoint_bytes = shard.checkpoints, header.checkpoint_bytes
    if checkpoints is None or checkpoint_bytes is None:
        return f"shard {shard.id} has no checkpoints ({shard.path})"
    low, high = wanted.data_range(shard.offsets, header, shard.data_size)
    problem = None
    if high > low:
        with shard.view[low:high] as view:
            problem = pieces_problem(view, low // checkpoint_bytes, checkpoints, checkpoint_bytes, shard.data_size)
    if problem is not None:
        return f"shard {shard.id}: {problem} ({shard.path})"
    # The footer's data checksum is the last checkpoint continued over the record lengths and the loss mask.
    crc = int(checkpoints[-1]) if len(checkpoints) else 0
    if shard.lengths is not None:
        crc = zlib.crc32(shard.lengths.tobytes(), crc)
    if shard.mask_bits is not None:
        crc = zlib.crc32(shard.mask_bits.tobytes(), crc)
    if crc != shard.data_crc:
        return f"shard {shard.id}: its checkpoints do not match its data checksum ({shard.path})"
    return None
