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


def record_lengths_at(reader: DocumentReader[object], indices: np.ndarray) -> np.ndarray:
    """The lengths (int64) of the records at these global indices, opening only the shards they lie in."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(reader.record_starts, indices, side="right") - 1
    records = indices - reader.record_starts[positions]
    lengths = np.empty(len(indices), np.int64)
    by_shard = np.argsort(positions, kind="stable")
    cuts = np.flatnonzero(np.diff(positions[by_shard])) + 1
    for group in np.split(by_shard, cuts) if len(indices) else []:
        offsets = reader.shard(int(positions[group[0]])).offsets
        chosen = records[group]
        lengths[group] = offsets[chosen + 1].astype(np.int64) - offsets[chosen].astype(np.int64)
    return lengths
