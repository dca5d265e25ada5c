"""A committed shard file's bytes: where it lies, its footer field by field, damaged footers and record offsets."""

from __future__ import annotations

import struct
import zlib
from pathlib import Path
from typing import Any

from guideloom._shards.layout import FOOTER

FOOTER_FIELDS = (
    "magic",
    "version",
    "flags",
    "shard",
    "record_count",
    "data_size",
    "data_crc",
    "index_crc",
    "header_crc",
)

# Names that are not exactly 12 ASCII digits + ".shard": a storage never reads such a file, even a valid shard.
CRAFTED_SHARD_NAMES = (
    "000000000001.shard.evil",
    "000000000001.shard\n",
    "000000000001.shard\r",
    "00000000000\u0661.shard",  # ARABIC-INDIC DIGIT ONE: a digit to \d, not to a file system
    "00000000000\uff11.shard",  # FULLWIDTH DIGIT ONE
    "0000000000001.shard",
    "00000000001.shard",
    "1.shard",
    "-00000000001.shard",
    " 00000000001.shard",
    "000000000001.SHARD",
    ".000000000001.shard",
    "000000000001.shard~",
    "000000000001.shard.tmp",
    "..000000000001.shard",
)


def shard_file(path: Path, shard: int = 1) -> Path:
    """The committed file of ``shard`` in the storage at ``path``."""
    return path / "shards" / f"{shard:012d}.shard"


def footer_fields(file: Path) -> list[Any]:
    """The shard file's footer, field by field (in the order of :data:`FOOTER_FIELDS`)."""
    return list(FOOTER.unpack(file.read_bytes()[-FOOTER.size :]))


def with_footer(data: bytes, fields: list[Any]) -> bytes:
    """Shard bytes with another footer whose own checksum is recomputed, as a buggy writer would leave them."""
    body = FOOTER.pack(*fields)[: FOOTER.size - 12]
    return data[: -FOOTER.size] + body + struct.pack("<I", zlib.crc32(body)) + bytes(8)


def rewrite_footer(file: Path, **changes: Any) -> None:
    """Change footer fields of a shard file (by name) and recompute the footer's own checksum."""
    fields = footer_fields(file)
    for key, value in changes.items():
        fields[FOOTER_FIELDS.index(key)] = value
    file.write_bytes(with_footer(file.read_bytes(), fields))


def set_offset(file: Path, position: int, value: int) -> None:
    """Overwrite entry ``position`` of a shard file's record index (the 8-byte offsets after the padded data)."""
    data = bytearray(file.read_bytes())
    data_size = FOOTER.unpack(bytes(data[-FOOTER.size :]))[FOOTER_FIELDS.index("data_size")]
    struct.pack_into("<Q", data, (data_size + 7) // 8 * 8 + 8 * position, value)
    file.write_bytes(bytes(data))
