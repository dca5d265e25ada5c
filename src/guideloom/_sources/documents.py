"""The source of a document storage: one decoded record per sample."""

from __future__ import annotations

from itertools import pairwise
from typing import Any

import numpy as np

from guideloom._shards.reader import DocumentReader
from guideloom._sources.describe import SamplePieces, record_keys, record_pieces
from guideloom._sources.source import PinnedShards


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

    def fetch(self, indices: np.ndarray, epoch: int) -> list[Any]:
        return self.reader.read_many(indices)

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        return record_pieces(self.reader, indices)

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return record_keys(self.reader, indices)

    def default_collate(self, samples: list[Any]) -> list[Any]:
        return samples

    def split_collated(self, batch: list[Any], sizes: list[int]) -> list[Any]:
        starts = np.cumsum([0, *sizes]).tolist()
        return [batch[start:stop] for start, stop in pairwise(starts)]
