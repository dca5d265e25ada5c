"""The length of each record of a document storage, read from the shards' record index, never decoded.

A record's length is the cost unit batches by budget and packed records count: the byte size of
its encoded data (the difference of the offsets in its shard's record index).
"""

from __future__ import annotations

import numpy as np

from guideloom._shards.reader import DocumentReader


def shard_record_lengths(reader: DocumentReader[object], position: int) -> np.ndarray:
    """The lengths (int64) of the records of the shard at ``position`` of ``reader``."""
    return np.diff(reader.shard(position).offsets.astype(np.int64))


def record_lengths(reader: DocumentReader[object]) -> np.ndarray:
    """The lengths (int64) of every record of ``reader``, by global index (opens each shard once)."""
    parts = [shard_record_lengths(reader, position) for position in range(len(reader.infos))]
    return np.concatenate(parts) if parts else np.empty(0, np.int64)
