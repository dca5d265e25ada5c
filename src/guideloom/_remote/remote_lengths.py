"""A remote shard's record lengths without its data: one ranged read of the object's tail, kept on disk.

A shard object ends with its record offsets, its record lengths (where the storage records them) and
its footer, all after the data (docs/format.md), and the listing already says how large the data is.
So a planner that needs only lengths (``batch_tokens``, packed records) reads ``offsets | lengths |
checkpoints | footer`` with one ranged GET instead of downloading the shard. The tail is checked as opening the
shard checks it: the footer's checksum, flags, header and counts (which must be the listing's, so a
replaced shard is never read as the listed one), the offsets' checksum and order, no negative
length. The lengths themselves have no checksum of their own in a shard (the data checksum covers
them after the data), so a length changed in the object is caught only when the shard is verified.

The lengths found are kept in the machine's cache directory, ``lengths/<id>.<data crc>.<size>.lengths``
(a replaced shard has another name), with a checksum of their own: written to a unique ``.part`` file
and renamed into place under an exclusive ``flock`` per shard, so every process of a machine shares
them and a machine reads each shard's tail at most once, ever. They are not counted in
``cache_limit_bytes`` (16 bytes a record are fetched, 8 kept). A shard already in the cache gives its
lengths from there. Compressed shard objects cannot be read by range: for them (and for masked token
storages, whose tails hold the loss mask) the shard is opened as before.
"""

from __future__ import annotations

import contextlib
import errno
import os
import struct
import uuid
import zlib
from collections import OrderedDict
from pathlib import Path

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._remote.object_store import ObjectStore
from guideloom._remote.shard_cache import DOWNLOAD_ATTEMPTS, ShardCache, clean_part_files, exclusive_lock, writing
from guideloom._shards.footer import FOOTER, Footer, decode_footer
from guideloom._shards.header import LAYOUT_VERSION, StorageHeader
from guideloom._shards.index_check import index_problem
from guideloom._shards.layout import SHARDS_DIR, ShardFile, ShardInfo, shard_file_name
from guideloom._shards.record_lengths import lengths_problem, sizes_as_lengths
from guideloom._shards.sections import ShardSections

# What follows a side file's lengths: a magic, the record count and the CRC-32 of the lengths' bytes.
SIDE_TRAILER = struct.Struct("<8sQI4x")
SIDE_MAGIC = b"GLOOMLN1"
REMEMBERED = 64  # shards whose lengths a process keeps in memory (planners ask for the same shards often)


class RemoteLengths:
    """The record lengths of one remote storage's shards, read from their objects' tails and kept on disk."""

    def __init__(self, store: ObjectStore, header: StorageHeader, cache: ShardCache, directory: Path) -> None:
        self.store = store
        self.header = header
        self.cache = cache
        self.directory = directory
        self.ranged = header.compression is None and not header.loss_mask
        self._remembered: OrderedDict[int, np.ndarray] = OrderedDict()

    def of(self, info: ShardInfo) -> np.ndarray | None:
        """The shard's record lengths (int64, read-only), without downloading its data; None where its tail
        cannot be read by range (the caller then opens the shard)."""
        if not self.ranged:
            return None
        lengths = self._remembered.get(info.id)
        if lengths is None:
            lengths = self._side_file(info)
            if lengths is None:
                lengths = self._from_cached_shard(info)
            if lengths is None:
                lengths = self._fetched(info)
            lengths.flags.writeable = False
            self._remembered[info.id] = lengths
            while len(self._remembered) > REMEMBERED:
                self._remembered.popitem(last=False)
        self._remembered.move_to_end(info.id)
        return lengths

    def path_for(self, info: ShardInfo) -> Path:
        """The side file of a shard's lengths, named as its cached copy is: by id, data checksum and size."""
        return self.directory / f"{info.id:012d}.{info.data_crc:08x}.{info.size}.lengths"

    def _side_file(self, info: ShardInfo) -> np.ndarray | None:
        """The lengths kept on disk, or None if there are none (or they are damaged: they are read again)."""
        try:
            raw = self.path_for(info).read_bytes()
        except FileNotFoundError:
            return None
        if len(raw) != 8 * info.record_count + SIDE_TRAILER.size:
            return None
        magic, count, crc = SIDE_TRAILER.unpack_from(raw, len(raw) - SIDE_TRAILER.size)
        body = memoryview(raw)[: 8 * info.record_count]
        if magic != SIDE_MAGIC or count != info.record_count or zlib.crc32(body) != crc:
            return None
        return np.frombuffer(raw, "<i8", info.record_count)

    def _from_cached_shard(self, info: ShardInfo) -> np.ndarray | None:
        """The lengths of the shard's copy in the cache, if it is there (it is held while they are copied)."""
        lease = self.cache.hold(self.cache.entry_for(info))
        if lease is None:
            return None
        try:
            shard = ShardFile(lease.path.parent, info.id, self.header, file=lease.path)
            try:
                return np.array(shard.record_lengths(), "<i8")
            finally:
                shard.close()
        finally:
            lease.release()

    def _fetched(self, info: ShardInfo) -> np.ndarray:
        """The lengths from the shard object's tail, read once per machine (one process reads, the others wait)."""
        final = self.path_for(info)
        with exclusive_lock(self.directory, final.name):
            lengths = self._side_file(info)  # another process read them meanwhile
            if lengths is None:
                lengths = self._read_tail(info)
                self._keep(final, lengths)
            return lengths

    def _read_tail(self, info: ShardInfo) -> np.ndarray:
        name = f"{SHARDS_DIR}/{shard_file_name(info.id)}"
        start = ShardSections.of(info.record_count, info.element_count * self.header.element_size).index_start
        problem = ""
        for _ in range(DOWNLOAD_ATTEMPTS):
            try:
                raw = self.store.read(name, start, info.size)
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                problem = "the object ends before its tail begins: it was truncated or replaced since it was listed"
                continue  # the range is not satisfiable (416)
            if raw is None:
                raise CorruptStorageError(
                    f"shard {info.id} vanished: {self.store.name_of(name)} was deleted from the store after this "
                    "reader listed it"
                )
            found = tail_lengths(raw, info, self.header)
            if isinstance(found, np.ndarray):
                return found
            problem = found
        where = f"{self.store.name_of(name)}, read {DOWNLOAD_ATTEMPTS} times"
        raise CorruptStorageError(f"shard {info.id} has a damaged tail ({where}): {problem}")

    def _keep(self, final: Path, lengths: np.ndarray) -> None:
        """Write the side file: a unique part file renamed into place (a torn one fails its checksum)."""
        body = np.ascontiguousarray(lengths, "<i8").tobytes()
        part = final.with_name(f"{final.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.part")
        try:
            with writing(part):
                part.write_bytes(body + SIDE_TRAILER.pack(SIDE_MAGIC, len(lengths), zlib.crc32(body)))
                os.rename(part, final)
        except OSError:  # a full or read-only cache: the lengths are still good, only not kept
            with contextlib.suppress(OSError):
                os.unlink(part)


def clean_lengths(directory: Path, older_than: float) -> list[Path]:
    """Delete side files that dead processes left half written (``.part`` files untouched for ``older_than`` that
    no live process is writing)."""
    return clean_part_files(directory, older_than)


def listed_footer_problem(footer: Footer | None, info: ShardInfo, header: StorageHeader) -> str | None:
    """What is wrong with a shard object's footer, read alone, given the shard's listed facts; None if sound."""
    if footer is None:
        return "its footer is damaged"
    if footer.version != LAYOUT_VERSION or footer.flags != header.footer_flags or footer.header_crc != header.checksum:
        return "its footer was not written under this storage's header"
    listed = (info.id, info.record_count, info.element_count * header.element_size, info.data_crc)
    if (footer.shard, footer.record_count, footer.data_size, footer.data_crc) != listed:
        return "its footer does not match the listing: the shard was replaced"
    return None


def tail_lengths(raw: bytes, info: ShardInfo, header: StorageHeader) -> np.ndarray | str:
    """The record lengths in a shard's tail (its bytes from the offsets on), checked as opening the shard
    checks them, or what is wrong with it."""
    records = info.record_count
    sections = ShardSections.of_file(records, info.element_count * header.element_size, header, info.size)
    if sections is None or len(raw) != sections.tail_size:
        return f"its tail is {len(raw)} bytes, not the {sections and sections.tail_size} the listing gives"
    footer = decode_footer(raw[-FOOTER.size :])
    problem = listed_footer_problem(footer, info, header)
    if footer is None or problem is not None:
        return problem or "its footer is damaged"
    index = memoryview(raw)[: sections.index_size]
    offsets = np.frombuffer(raw, "<u8", records + 1)
    problem = index_problem(index, offsets, footer.index_crc, info.element_count)
    if problem is not None:
        return f"its record index is damaged: {problem}"
    if not header.record_lengths:
        return np.array(sizes_as_lengths(offsets))
    lengths = np.frombuffer(raw, "<i8", records, sections.lengths_start - sections.index_start).copy()
    problem = lengths_problem(lengths)
    return lengths if problem is None else f"its record lengths are damaged: {problem}"
