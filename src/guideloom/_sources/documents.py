"""The source of a document storage: one decoded record per sample."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from guideloom._shards.parts import PlannedPart
from guideloom._shards.reader import DocumentReader
from guideloom._sources.describe import SamplePieces, record_keys, record_pieces
from guideloom._sources.source import PinnedShards, spans_in_shards


class DocumentSource(PinnedShards[DocumentReader[Any]]):
    """One decoded record per sample; the default collate keeps the list as it is."""

    kind = "documents"

    @property
    def sample_count(self) -> int:
        return len(self.reader)

    @property
    def sample_bytes(self) -> int:
        return 0

    def shard_sample_counts(self) -> np.ndarray:
        """Records per shard, in storage order (what a windowed order walks), from the snapshot alone."""
        return self.snapshot.rows["record_count"].astype(np.int64)

    def clean_cuts(self) -> None:
        """No record crosses a shard: a windowed order may put shards in any order."""
        return None

    def sample_parts(self, first: int, stop: int) -> dict[int, PlannedPart]:
        """The records ``first .. stop - 1`` of each shard they are in."""
        counts = self.snapshot.rows["record_count"].astype(np.int64)
        return spans_in_shards(counts, first, stop, in_records=True)

    def fetch(self, indices: np.ndarray, epoch: int) -> list[Any]:
        return self.reader.read_many(indices)

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        return self.sourced(record_pieces(self.reader, indices))

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return record_keys(self.reader, indices)

    @property
    def measures_samples(self) -> bool:
        """Records know their lengths (``batch_tokens`` counts them)."""
        return True

    def sample_lengths(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        """The lengths of the records at these indices (what ``batch_tokens`` counts): those their format
        recorded, else their sizes in bytes; read from the index of the shards they lie in, never decoded."""
        return record_lengths_at(self.reader, indices)

    def default_collate(self, samples: list[Any]) -> list[Any]:
        return samples

    def split_collated(self, batch: list[Any], sizes: list[int]) -> list[Any]:
        starts = np.cumsum([0, *sizes]).tolist()
        return [batch[start:stop] for start, stop in pairwise(starts)]


def record_lengths_at(reader: DocumentReader[Any], indices: np.ndarray) -> np.ndarray:
    """The lengths (int64) of the records at these global indices, shard by shard (only theirs opened)."""
    indices = np.asarray(indices, np.int64)
    positions = np.searchsorted(reader.record_starts, indices, side="right") - 1
    records = indices - reader.record_starts[positions]
    lengths = np.empty(len(indices), np.int64)
    by_shard = np.argsort(positions, kind="stable")
    for group in np.split(by_shard, np.flatnonzero(np.diff(positions[by_shard])) + 1) if len(indices) else []:
        position, chosen = int(positions[group[0]]), records[group]
        if reader.header.record_lengths or not reader.shard_set.mapped_in_place:  # the chosen ones only
            lengths[group] = reader.shard_lengths(position)[chosen]
        else:  # their sizes, without a pass over the whole mapped shard's offsets
            offsets = reader.shard(position).offsets
            lengths[group] = offsets[chosen + 1].astype(np.int64) - offsets[chosen].astype(np.int64)
    return lengths
