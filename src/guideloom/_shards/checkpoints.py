"""Checkpoints: the running CRC-32 of a shard's data at the end of every piece of ``checkpoint_bytes``.

A shard of a storage whose header gives ``checkpoint_bytes`` (P) holds, after its record lengths and
loss mask, ``ceil(data_size / P)`` little-endian uint32: checkpoint ``k`` is the CRC-32 of the data's
first ``min((k + 1) * P, data_size)`` bytes (footer flag 4), then zeros up to a multiple of 8. So a
reader that holds only pieces ``i .. j-1`` (an object store's ranged read) verifies them alone: the
CRC-32 of their bytes, continued from checkpoint ``i - 1`` (0 for the first piece), is checkpoint
``j - 1``. The last checkpoint is the CRC-32 of the whole data, as the footer's data checksum begins.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from guideloom._core.checksums import crc32

CHECKPOINTS_FLAG = 4  # the footer flag of a shard that holds checkpoints
CHECKPOINT_BYTES = 4096  # the piece size of new storages: a page
MIN_CHECKPOINT_BYTES = 4096
MAX_CHECKPOINT_BYTES = 2**26


def valid_checkpoint_bytes(value: object) -> bool:
    """Whether a header's ``checkpoint_bytes`` is usable: an int, a power of two from 4096 to 2**26."""
    return type(value) is int and MIN_CHECKPOINT_BYTES <= value <= MAX_CHECKPOINT_BYTES and value & (value - 1) == 0


def checkpoint_count(data_size: int, checkpoint_bytes: int) -> int:
    """How many checkpoints a shard with ``data_size`` bytes of data holds: one per piece, the last maybe short."""
    return -(-data_size // checkpoint_bytes)


def checkpoints_size(data_size: int, checkpoint_bytes: int) -> int:
    """Bytes the checkpoints of ``data_size`` bytes of data take in a shard, with their padding to 8 bytes."""
    return (4 * checkpoint_count(data_size, checkpoint_bytes) + 7) // 8 * 8


def running_checkpoints(
    data: bytes | memoryview, checkpoint_bytes: int, crc: int = 0, start: int = 0
) -> tuple[list[int], int]:
    """``crc`` continued over ``data``, which begins at data offset ``start``: the checkpoints of the pieces that
    end inside ``data`` (at multiples of ``checkpoint_bytes``), and the CRC-32 at its end.

    A writer calls it on each new stretch of data in order; the data's short last piece gets its checkpoint
    from :func:`closing_checkpoints` once the data is complete.
    """
    checkpoints: list[int] = []
    with memoryview(data) as raw, raw.cast("B") as view:
        position, end = 0, len(view)
        while position < end:
            piece_end = min(end, position + checkpoint_bytes - (start + position) % checkpoint_bytes)
            with view[position:piece_end] as piece:
                crc = crc32(piece, crc)
            position = piece_end
            if (start + position) % checkpoint_bytes == 0:
                checkpoints.append(crc)
    return checkpoints, crc


def closing_checkpoints(data_size: int, checkpoint_bytes: int, data_crc: int) -> list[int]:
    """The checkpoint of the data's short last piece, ``data_crc`` (the CRC-32 of all the data), if it has one."""
    return [data_crc] if data_size % checkpoint_bytes else []


def checkpoints_of(data: bytes | memoryview, checkpoint_bytes: int | None) -> list[int]:
    """Every checkpoint of a shard's whole ``data`` (none in a storage without checkpoints: ``checkpoint_bytes``
    None), for code that holds the data at once (tests, benchmarks); writers use :func:`running_checkpoints`."""
    if checkpoint_bytes is None:
        return []
    checkpoints, crc = running_checkpoints(data, checkpoint_bytes)
    return checkpoints + closing_checkpoints(memoryview(data).nbytes, checkpoint_bytes, crc)


def checkpoints_section(checkpoints: Sequence[int] | np.ndarray) -> bytes:
    """A shard's checkpoints section: the checkpoints as little-endian uint32, then zeros up to 8 bytes."""
    section = np.asarray(checkpoints, dtype="<u4").tobytes()
    return section + bytes(-len(section) % 8)


def piece_range(piece: int, checkpoint_bytes: int, data_size: int) -> str:
    """Piece ``piece``'s data bytes, first and last, in words (for messages)."""
    return f"data bytes {piece * checkpoint_bytes}..{min((piece + 1) * checkpoint_bytes, data_size) - 1}"


def pieces_problem(
    data: memoryview | bytes, first_piece: int, checkpoints: np.ndarray, checkpoint_bytes: int, data_size: int
) -> str | None:
    """What is wrong with ``data``, the bytes of the pieces from ``first_piece`` on (the last may be the data's short
    last piece), checked against the shard's ``checkpoints``: the first piece that does not match, else None.

    A ``data`` that ends inside a piece (neither at a multiple of ``checkpoint_bytes`` nor at ``data_size``) or runs
    past the data is a problem too: it cannot be checked.
    """
    if not 0 <= first_piece < len(checkpoints) or len(checkpoints) != checkpoint_count(data_size, checkpoint_bytes):
        raise ValueError(
            f"piece {first_piece} is not among the {len(checkpoints)} checkpoints of {data_size} bytes of data "
            f"in pieces of {checkpoint_bytes}"
        )
    start = first_piece * checkpoint_bytes
    with memoryview(data) as raw, raw.cast("B") as view:
        stop = start + len(view)
        if stop > data_size or (stop % checkpoint_bytes and stop != data_size) or stop == start:
            return f"{len(view)} bytes from data byte {start} do not end where a piece ends"
        crc = int(checkpoints[first_piece - 1]) if first_piece else 0
        found, crc = running_checkpoints(view, checkpoint_bytes, crc, start)
    found += closing_checkpoints(stop, checkpoint_bytes, crc) if stop == data_size else []
    expected = checkpoints[first_piece : first_piece + len(found)].tolist()
    for piece, (computed, stored) in enumerate(zip(found, expected, strict=True), first_piece):
        if computed != stored:
            return f"{piece_range(piece, checkpoint_bytes, data_size)} do not match their checkpoint"
    return None
