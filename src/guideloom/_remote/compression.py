"""Compressed shard objects: one zstd frame of the shard's (shuffled) data and index, then its plain footer.

The footer stays plain so that a listing whose marker is missing can still index the shard from one
small ranged read, as for an uncompressed object. A download is decompressed as it streams into the
cache's temporary file, which then holds the plain shard, byte for byte the writer's local file, and
is checked against that shard's checksums before it becomes visible.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import IO, Any, Protocol

import numpy as np

from guideloom._core.errors import FormatMismatchError
from guideloom._shards.footer import FOOTER
from guideloom._shards.header import COMPRESSIONS, StorageHeader
from guideloom._shards.layout import ShardInfo
from guideloom._shards.sections import ShardSections

DEFAULT_LEVEL = 3
_CHUNK = 4 << 20
SHUFFLE_BLOCK = 1 << 20  # bytes regrouped at once (a multiple of every element size)


class StoragePlace(Protocol):
    """Where a storage lives, as far as compression cares (a ``_storage.locations.Location`` is one)."""

    @property
    def name(self) -> str: ...

    @property
    def is_remote(self) -> bool: ...


class DamagedDownload(Exception):
    """A downloaded object that cannot be decoded: counted as a failed check, downloaded again."""


def check_compression(compression: object, level: object, location: StoragePlace) -> tuple[str | None, int]:
    """Validate the storages' ``compression`` and ``compression_level``; a local path refuses compression.

    A local storage's shards are mapped in place, so compressing them would cost a decompressed copy
    of each: only a storage on an object store (``location.is_remote``) compresses its shard objects.
    """
    if compression is not None and not isinstance(compression, str):
        raise TypeError(f"compression must be a str or None, got {type(compression).__name__}")
    if compression is not None and compression not in COMPRESSIONS:
        raise ValueError(f"compression must be one of {COMPRESSIONS} or None, got {compression!r}")
    if isinstance(level, bool) or not isinstance(level, int):
        raise TypeError(f"compression_level must be an int, got {type(level).__name__}")
    if not 1 <= level <= 22:
        raise ValueError(f"compression_level must be from 1 to 22 (zstd's levels), got {level}")
    if compression is not None and not location.is_remote:
        raise ValueError(
            f"compression applies to storages on object stores (a URL), but path is a local path: {location.name!r} "
            "(local shards are mapped in place, uncompressed)"
        )
    return compression, level


def recorded_compression(header: StorageHeader, location: StoragePlace) -> str | None:
    """The compression a storage's header records; a local copy of a compressed storage's objects is refused."""
    if header.compression is not None and not location.is_remote:
        raise FormatMismatchError(
            f"the storage at {location.name} records compression {header.compression!r}: its shards are compressed "
            "objects of an object store, read through the store's URL"
        )
    return header.compression


def _zstandard() -> Any:
    try:
        import zstandard
    except ImportError:  # pragma: no cover - depends on the installed extras
        raise ImportError("compression='zstd' needs zstandard: pip install 'guideloom[remote]'") from None
    return zstandard


def shuffle_plan(record_count: int, data_size: int, element_size: int, body_size: int) -> list[tuple[int, int]]:
    """The blocks of a plain shard (all but its footer) as compressed: (bytes, element width) each.

    Within a block, the bytes are regrouped by their position in the element (all first bytes, then
    all second bytes, ...), as Blosc's shuffle does: the high bytes of token ids and of offsets are
    mostly zero, and zstd then stores them almost for free. Data, padding, index and what follows
    (record lengths, a loss mask, checkpoints) up to ``body_size`` (the shard without its footer) are
    blocks of their own, at most SHUFFLE_BLOCK bytes.
    """
    sections = ShardSections.of(record_count, data_size)
    regions = [
        (data_size, element_size),
        (sections.index_start - data_size, 1),
        (sections.index_size, 8),
        (body_size - sections.lengths_start, 1),
    ]
    return [
        (min(SHUFFLE_BLOCK, length - start), width)
        for length, width in regions
        for start in range(0, length, SHUFFLE_BLOCK)
    ]


def _regroup(block: bytes, width: int, forward: bool) -> bytes:
    if width == 1:
        return block
    grid = np.frombuffer(block, np.uint8).reshape((-1, width) if forward else (width, -1))
    return grid.T.tobytes()


def compress_shard(source: Path, destination: Path, level: int, element_size: int) -> None:
    """Write the object of a compressed shard: a zstd frame of its shuffled blocks, then the plain footer."""
    zstandard = _zstandard()
    size = source.stat().st_size
    compressor = zstandard.ZstdCompressor(level=level)
    with open(source, "rb") as plain, open(destination, "wb") as packed:
        plain.seek(size - FOOTER.size)
        footer = plain.read()
        record_count, data_size = FOOTER.unpack(footer)[4:6]
        plain.seek(0)
        with compressor.stream_writer(packed, size=size - FOOTER.size, write_size=_CHUNK, closefd=False) as frame:
            for length, width in shuffle_plan(record_count, data_size, element_size, size - FOOTER.size):
                frame.write(_regroup(plain.read(length), width, forward=True))
        packed.write(footer)


class ShardDecoder:
    """Decompresses a compressed shard object's bytes, as they arrive, into the plain shard in ``file``.

    ``info`` (the listing's counts) and ``element_size`` give the blocks to put back in order.
    """

    def __init__(self, file: IO[bytes], info: ShardInfo, element_size: int) -> None:
        self._file = file
        self._decompressor = _zstandard().ZstdDecompressor().decompressobj()
        self._footer = b""
        data_size = info.element_count * element_size
        self._plan = shuffle_plan(info.record_count, data_size, element_size, info.size - FOOTER.size)[::-1]
        self._pending = bytearray()

    def write(self, chunk: bytes) -> None:
        if self._decompressor.eof:
            self._footer += chunk
        else:
            try:
                self._pending += self._decompressor.decompress(chunk)
            except Exception as error:  # zstandard.ZstdError: not a frame, or a damaged one
                raise DamagedDownload(f"it is not a valid zstd frame ({error})") from None
            while self._plan and len(self._pending) >= self._plan[-1][0]:
                length, width = self._plan.pop()
                self._file.write(_regroup(bytes(self._pending[:length]), width, forward=False))
                del self._pending[:length]
            if self._decompressor.eof:
                self._footer += self._decompressor.unused_data
        if len(self._footer) > FOOTER.size:
            raise DamagedDownload(f"more than {FOOTER.size} bytes follow its zstd frame")

    def finish(self) -> None:
        """Append the footer; an object whose frame, blocks or footer are incomplete is damaged."""
        if not self._decompressor.eof or len(self._footer) != FOOTER.size or self._plan or self._pending:
            raise DamagedDownload("its zstd frame or its footer is incomplete, or it holds other sizes than listed")
        self._file.write(self._footer)


def upload_source(shard: Path, compression: str | None, level: int, element_size: int) -> Path:
    """The file to upload for a shard: the shard itself, or its compressed object next to it."""
    if compression is None:
        return shard
    packed = shard.with_name(f"{shard.name}.zst")
    try:
        compress_shard(shard, packed, level, element_size)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(packed)
        raise
    return packed
