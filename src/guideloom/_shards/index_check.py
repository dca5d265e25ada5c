"""The check of a shard's record index when the shard is opened: its checksum, then its offsets' order.

The offsets are ``record_count + 1`` little-endian uint64 values. A damaged index must never reach a
reader as wrong document boundaries, a NumPy error or a read outside the data, so every open checks
the CRC-32 the footer holds for it (any flipped bit) and that the offsets start at 0, never decrease
and end at the data's size (vectorised, in blocks, so the temporary memory stays small). Its cost is
stated in docs/reliability.md.
"""

from __future__ import annotations

import zlib

import numpy as np

BLOCK = 1 << 20  # offsets compared at once


def index_problem(index: memoryview, offsets: np.ndarray, index_crc: int, element_count: int) -> str | None:
    """What is wrong with a shard's record index (its bytes and those bytes as offsets), or None."""
    if zlib.crc32(index) != index_crc:
        return "its checksum does not match"
    if int(offsets[0]) != 0 or int(offsets[-1]) != element_count:
        return f"its offsets run from {int(offsets[0])} to {int(offsets[-1])}, not from 0 to {element_count}"
    for start in range(0, len(offsets) - 1, BLOCK):
        block = offsets[start : start + BLOCK + 1]
        decreasing = np.flatnonzero(block[1:] < block[:-1])
        if decreasing.size:
            return f"its offsets decrease at record {start + int(decreasing[0]) + 1}"
    return None
