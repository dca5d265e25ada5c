"""One footer codec: what ``shard_footer`` writes, ``decode_footer`` reads back; any damage reads as none."""

from __future__ import annotations

import pytest

from guideloom._shards.footer import FOOTER, Footer, decode_footer, shard_footer
from guideloom._shards.header import LAYOUT_VERSION, StorageHeader

HEADER = StorageHeader("tokens", dtype="uint16")


def test_a_footer_reads_back_as_written() -> None:
    written = shard_footer(7, 3, 40, 0xDEADBEEF, 0x12345678, HEADER)
    assert len(written) == FOOTER.size
    assert decode_footer(written) == Footer(
        LAYOUT_VERSION, HEADER.footer_flags, 7, 3, 40, 0xDEADBEEF, 0x12345678, HEADER.checksum
    )


@pytest.mark.parametrize("position", [0, 20, FOOTER.size - 12, FOOTER.size - 1])
def test_a_flipped_byte_anywhere_is_a_damaged_footer(position: int) -> None:
    damaged = bytearray(shard_footer(7, 3, 40, 0xDEADBEEF, 0x12345678, HEADER))
    damaged[position] ^= 0x01
    assert decode_footer(bytes(damaged)) is None
