"""The packing of a shard, cached on disk and mapped, so it is built once per shard and row length.

The cache is derived data: a file named by a digest of the shard's document
offsets and the row length, in ``$GUIDELOOM_CACHE_DIR`` (default: the user's
cache directory, ``~/.cache/guideloom``). It is written to a temporary file and
renamed into place, so readers never see a partial one; a missing, damaged or
foreign file is rebuilt. Where no cache can be written the packing is kept in
memory. Mapping the file keeps the packing in the page cache, not in the
process's own memory, and lets worker processes share it.
"""

from __future__ import annotations

import contextlib
import hashlib
import mmap
import os
import struct
import tempfile
import warnings
import zlib
from pathlib import Path

import numpy as np

from guideloom._shards.reader import TokenReader
from guideloom._windows.packing import ShardPacking, pack_shard

MAGIC = b"GLPACK01"
HEADER = struct.Struct("<8sQQQ16sI")  # magic, capacity, rows, pieces, offsets digest, payload crc
_warned_unwritable: set[Path] = set()


def cache_directory() -> Path:
    """Where packings are cached: ``$GUIDELOOM_CACHE_DIR``, else ``$XDG_CACHE_HOME/guideloom``, else ``~/.cache``."""
    configured = os.environ.get("GUIDELOOM_CACHE_DIR")
    if configured:
        return Path(configured)
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "guideloom"


def offsets_digest(offsets: np.ndarray, capacity: int, long_documents: str = "split") -> bytes:
    """Identifies what a packing depends on: the document lengths (via their offsets), the row length and what
    becomes of longer documents (``"split"`` adds nothing, so caches written before the choice existed stay valid)."""
    digest = hashlib.blake2b(np.ascontiguousarray(offsets, "<u8").tobytes(), digest_size=16)
    digest.update(struct.pack("<Q", capacity))
    if long_documents != "split":
        digest.update(long_documents.encode())
    return digest.digest()


def load_or_build(offsets: np.ndarray, capacity: int, long_documents: str = "split") -> ShardPacking:
    """The packing of a shard with these document offsets: from the cache if it holds a sound one, else built."""
    digest = offsets_digest(offsets, capacity, long_documents)
    path = cache_directory() / "packing" / f"{digest.hex()}-{capacity}.pack"
    cached = _load(path, digest, capacity)
    if cached is not None:
        return cached
    packing = pack_shard(offsets, capacity, long_documents)
    try:
        _store(path, digest, capacity, packing)
    except OSError as error:
        if path.parent not in _warned_unwritable:
            _warned_unwritable.add(path.parent)
            warnings.warn(
                f"cannot cache document packings in {path.parent} ({error}); set GUIDELOOM_CACHE_DIR to a "
                "writable directory to build them once",
                RuntimeWarning,
                stacklevel=3,
            )
        return packing
    return _load(path, digest, capacity) or packing


def row_counts_directory() -> Path:
    return cache_directory() / "packing"


def load_or_count_rows(reader: TokenReader, capacity: int, long_documents: str = "split") -> np.ndarray:
    """How many packed rows each of the reader's shards makes (int64): cached per snapshot and row length.

    Counting packs every shard once (one at a time, each through the reader's bounded set of open
    shards); the counts are then one small file named by a digest of the storage's location, its
    shards' facts and the row length, so later loaders of the same snapshot read 8 bytes per shard.
    """
    rows = reader.infos.rows
    digest = hashlib.blake2b(reader.location.encode(), digest_size=16)
    for field in ("id", "record_count", "element_count", "data_crc"):
        digest.update(np.ascontiguousarray(rows[field]).tobytes())
    digest.update(struct.pack("<Q", capacity) + long_documents.encode())
    path = row_counts_directory() / f"rows-{digest.hexdigest()}.counts"
    with contextlib.suppress(OSError, ValueError):
        raw = path.read_bytes()
        counts = np.frombuffer(raw, "<i8", offset=8)
        if len(counts) == len(rows) and struct.unpack("<I", raw[:4])[0] == zlib.crc32(raw[8:]):
            return counts.astype(np.int64)
    counts = np.array(
        [
            pack_shard(reader.shard(position).offsets, capacity, long_documents).row_count
            for position in range(len(rows))
        ],
        np.int64,
    )
    payload = counts.astype("<i8").tobytes()
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as file:
                file.write(struct.pack("<II", zlib.crc32(payload), 0) + payload)
            os.replace(temporary, path)
        finally:
            Path(temporary).unlink(missing_ok=True)
    return counts


def _store(path: Path, digest: bytes, capacity: int, packing: ShardPacking) -> None:
    payload = b"".join(
        np.ascontiguousarray(array, "<i8").tobytes()
        for array in (packing.row_starts, packing.piece_starts, packing.piece_lengths)
    )
    header = HEADER.pack(MAGIC, capacity, packing.row_count, len(packing.piece_starts), digest, zlib.crc32(payload))
    path.parent.mkdir(parents=True, exist_ok=True)
    descriptor, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(descriptor, "wb") as file:  # no fsync: derived data, checked by its CRC when loaded
            file.write(header)
            file.write(payload)
        os.replace(temporary, path)
    except BaseException:
        Path(temporary).unlink(missing_ok=True)
        raise


def _load(path: Path, digest: bytes, capacity: int) -> ShardPacking | None:
    """The mapped packing at ``path``, or None if it is missing or not exactly the one asked for."""
    try:
        with open(path, "rb") as file:
            size = os.fstat(file.fileno()).st_size
            if size < HEADER.size:
                return None
            mapping = mmap.mmap(file.fileno(), size, access=mmap.ACCESS_READ)
    except (OSError, ValueError):
        return None
    magic, found_capacity, rows, pieces, found_digest, crc = HEADER.unpack(mapping[: HEADER.size])
    sound = (
        magic == MAGIC
        and found_capacity == capacity
        and found_digest == digest
        and size == HEADER.size + 8 * (rows + 1 + 2 * pieces)
        and zlib.crc32(memoryview(mapping)[HEADER.size :]) == crc
    )
    if not sound:
        mapping.close()
        return None
    row_starts = np.frombuffer(mapping, "<i8", rows + 1, HEADER.size)
    piece_starts = np.frombuffer(mapping, "<i8", pieces, HEADER.size + 8 * (rows + 1))
    piece_lengths = np.frombuffer(mapping, "<i8", pieces, HEADER.size + 8 * (rows + 1 + pieces))
    return ShardPacking(row_starts, piece_starts, piece_lengths)
