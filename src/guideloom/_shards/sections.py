"""The byte layout of a shard file, computed in one place: where each section begins and how long it is.

A shard is ``data | padding to 8 bytes | offsets | record lengths | loss mask | checkpoints | footer``; the
record lengths, loss mask and checkpoints are there only where the storage's header calls for them (see
docs/format.md). Every reader of a shard's bytes (the mapped shard, a remote shard's tail, a part of a shard,
a compressed shard's blocks) asks `ShardSections` instead of adding the sizes up itself.
"""

from __future__ import annotations

from dataclasses import dataclass

from guideloom._shards.checkpoints import checkpoints_size
from guideloom._shards.footer import FOOTER
from guideloom._shards.header import StorageHeader
from guideloom._shards.loss_masks import padded_mask_size

__all__ = ["ShardSections", "padded"]


def padded(size: int) -> int:
    """``size`` rounded up to a multiple of 8 bytes (where each section after the data begins)."""
    return (size + 7) // 8 * 8


@dataclass(frozen=True)
class ShardSections:
    """Where the sections of a shard with ``record_count`` records and ``data_size`` bytes of data lie."""

    record_count: int
    data_size: int
    lengths_size: int  # int64 per record, where the header records lengths
    mask_size: int  # the packed loss mask with its padding, in a masked storage
    checkpoints_size: int  # uint32 per piece with its padding, where the header gives checkpoint_bytes

    @classmethod
    def of(cls, record_count: int, data_size: int, header: StorageHeader | None = None) -> ShardSections:
        """The sections of such a shard under ``header`` (None: data, offsets and footer only)."""
        if header is None:
            return cls(record_count, data_size, 0, 0, 0)
        lengths = 8 * record_count if header.record_lengths else 0
        mask = padded_mask_size(data_size // header.element_size) if header.loss_mask else 0
        checkpoint_bytes = header.checkpoint_bytes
        checkpoints = 0 if checkpoint_bytes is None else checkpoints_size(data_size, checkpoint_bytes)
        return cls(record_count, data_size, lengths, mask, checkpoints)

    @property
    def index_start(self) -> int:
        """Where the record offsets begin: the data padded to 8 bytes. The shard's *tail* begins here."""
        return padded(self.data_size)

    @property
    def index_size(self) -> int:
        return 8 * (self.record_count + 1)

    @property
    def lengths_start(self) -> int:
        return self.index_start + self.index_size

    @property
    def mask_start(self) -> int:
        return self.lengths_start + self.lengths_size

    @property
    def checkpoints_start(self) -> int:
        return self.mask_start + self.mask_size

    @property
    def footer_start(self) -> int:
        return self.checkpoints_start + self.checkpoints_size

    @property
    def size(self) -> int:
        """Bytes of the whole shard file."""
        return self.footer_start + FOOTER.size

    @property
    def tail_size(self) -> int:
        """Bytes from the record offsets to the end (what a reader of the records' facts downloads)."""
        return self.size - self.index_start
