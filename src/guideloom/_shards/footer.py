"""A shard's footer, its last 64 bytes: written by :func:`shard_footer`, decoded only by :func:`decode_footer`."""

from __future__ import annotations

import struct
import zlib
from typing import NamedTuple

from guideloom._shards.header import LAYOUT_VERSION, StorageHeader

FOOTER = struct.Struct("<8sIIQQQIIII8x")
FOOTER_MAGIC = b"GLOOMSH1"


class Footer(NamedTuple):
    """The fields of a sound footer (see docs/format.md)."""

    version: int
    flags: int
    shard: int
    record_count: int
    data_size: int
    data_crc: int
    index_crc: int
    header_crc: int


def shard_footer(
    shard: int, record_count: int, data_size: int, data_crc: int, index_crc: int, header: StorageHeader
) -> bytes:
    """A shard's last 64 bytes: its id, counts, checksums and flags."""
    body = FOOTER.pack(
        FOOTER_MAGIC,
        LAYOUT_VERSION,
        header.footer_flags,
        shard,
        record_count,
        data_size,
        data_crc,
        index_crc,
        header.checksum,
        0,
    )
    footer_crc = zlib.crc32(body[: FOOTER.size - 12])
    return body[: FOOTER.size - 12] + struct.pack("<I", footer_crc) + bytes(8)


def decode_footer(raw: bytes | memoryview) -> Footer | None:
    """The footer in ``raw`` (exactly ``FOOTER.size`` bytes); None if it is damaged (magic, checksum, padding)."""
    magic, version, flags, shard, record_count, data_size, data_crc, index_crc, header_crc, footer_crc = FOOTER.unpack(
        raw
    )
    if magic != FOOTER_MAGIC or zlib.crc32(raw[: FOOTER.size - 12]) != footer_crc or any(raw[FOOTER.size - 8 :]):
        return None
    return Footer(version, flags, shard, record_count, data_size, data_crc, index_crc, header_crc)
