"""The byte layout of a shard file, computed in one place: where each section begins and how long it is.

A shard is ``data | padding to 8 bytes | offsets | record lengths | loss mask | checkpoints | field columns |
footer``; the record lengths, loss mask, checkpoints and field columns are there only where the storage's header
calls for them (see docs/format.md). The field columns' size is the one thing the counts do not give: it is the
file's size less the rest (their table, just before the footer, says how it divides). Every reader of a shard's
bytes (the mapped shard, a remote shard's tail, a part of a shard, a compressed shard's blocks) asks
`ShardSections` instead of adding the sizes up itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from guideloom._shards.checkpoints import checkpoints_size
from guideloom._shards.field_columns import table_size
from guideloom._shards.footer import FOOTER
from guideloom._shards.header import StorageHeader
from guideloom._shards.loss_masks import padded_mask_size

__all__ = ["ShardSections", "padded"]


def padded(size: int) -> int:
    """``size`` rounded up to a multiple of 8 bytes (where each section after the data begins)."""
    return (size + 7) // 8 * 8


@dataclass(frozen=True)
class ShardSections:
    """Where the sections of a shard lie, in bytes from the file's start; each ends where the next begins."""

    data_size: int
    index_start: int  # the record offsets (uint64, one more than the records): the data padded to 8 bytes
    lengths_start: int  # the record lengths (int64 each), where the header records lengths
    mask_start: int  # the packed loss mask padded to 8 bytes, in a masked storage
    checkpoints_start: int  # the checkpoints (uint32 a piece) padded to 8 bytes, where the header gives them
    columns_start: int  # the field columns and their table, where the header names field columns
    footer_start: int
    size: int  # the whole file

    @classmethod
    def of(
        cls, record_count: int, data_size: int, header: StorageHeader | None = None, columns_size: int = 0
    ) -> ShardSections:
        """The sections of a shard with ``record_count`` records and ``data_size`` bytes of data under ``header``
        (None: data, offsets and footer only), whose field columns (with their table) take ``columns_size`` bytes."""
        lengths = mask = checkpoints = 0
        if header is not None:
            lengths = 8 * record_count if header.record_lengths else 0
            mask = padded_mask_size(data_size // header.element_size) if header.loss_mask else 0
            if header.checkpoint_bytes is not None:
                checkpoints = checkpoints_size(data_size, header.checkpoint_bytes)
        index_start = padded(data_size)
        lengths_start = index_start + 8 * (record_count + 1)
        mask_start = lengths_start + lengths
        checkpoints_start = mask_start + mask
        columns_start = checkpoints_start + checkpoints
        footer_start = columns_start + columns_size
        return cls(
            data_size,
            index_start,
            lengths_start,
            mask_start,
            checkpoints_start,
            columns_start,
            footer_start,
            footer_start + FOOTER.size,
        )

    @classmethod
    def of_file(cls, record_count: int, data_size: int, header: StorageHeader, file_size: int) -> ShardSections | None:
        """The sections of a shard file of ``file_size`` bytes with these counts: its field columns take what the
        rest leaves; None where that cannot be (a file too short, or larger than a shard without columns is)."""
        sections = cls.of(record_count, data_size, header)
        extra = file_size - sections.size
        if extra == 0 and not header.field_columns:
            return sections
        if not header.field_columns or extra < table_size(len(header.field_columns)) or extra % 8:
            return None
        return cls.of(record_count, data_size, header, extra)

    @property
    def index_size(self) -> int:
        return self.lengths_start - self.index_start

    @property
    def tail_size(self) -> int:
        """Bytes from the record offsets to the end (what a reader of the records' facts downloads): the tail."""
        return self.size - self.index_start
