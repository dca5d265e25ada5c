"""Packed records: each sample is a row of whole records whose lengths sum to at most ``sequence_length``.

The rows of each shard are the token packing's: best-fit decreasing of the shard's record lengths
(`_windows.packing.best_fit_decreasing`), shards in ascending id. A record is never cut, so one
longer than a row is an error naming it, or, with ``long_documents="drop"``, left out of every epoch.
The packing is computed once per loader from the records' lengths (their index, never their data)
and travels to worker processes with the source.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import numpy as np

from guideloom._shards.reader import DocumentReader
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.describe import WHOLE_RECORD, SamplePieces, record_keys
from guideloom._sources.source import PinnedShards
from guideloom._windows.packing import best_fit_decreasing

__all__ = ["RECORD_LONG_DOCUMENTS", "PackedRecordSource", "RecordRows", "pack_records"]

RECORD_LONG_DOCUMENTS = ("drop",)  # what packed records may do with a record longer than a row: it is never cut


@dataclass(frozen=True)
class RecordRows:
    """Row ``r`` holds the records (global indices) ``records[row_starts[r]:row_starts[r + 1]]``, in placement
    order (longest first); ``shard_rows`` counts each shard's rows (a row never crosses a shard)."""

    row_starts: np.ndarray
    records: np.ndarray
    shard_rows: np.ndarray

    @property
    def row_count(self) -> int:
        return len(self.row_starts) - 1

    def of_rows(self, rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The records of these rows, one run after another, and how many each row holds."""
        starts, stops = self.row_starts[rows], self.row_starts[rows + 1]
        counts = stops - starts
        flat = np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()), dtype=np.int64)
        return self.records[flat], counts


def pack_records(reader: DocumentReader[Any], sequence_length: int, drop_long: bool) -> RecordRows:
    """The rows of every shard of ``reader``: its records' lengths packed best-fit decreasing, shard by shard."""
    row_starts, records, shard_rows = [np.zeros(1, np.int64)], [], []
    records_so_far = 0
    for position in range(len(reader.infos)):
        lengths = np.asarray(reader.shard_lengths(position), np.int64)
        kept = np.flatnonzero(lengths <= sequence_length)
        if len(kept) < len(lengths) and not drop_long:
            record = int(np.flatnonzero(lengths > sequence_length)[0])
            raise ValueError(
                f"record {record} of shard {reader.infos[position].id} of {reader.location} is {int(lengths[record])} "
                f"long, longer than a row of sequence_length={sequence_length}: a record is never cut, so pass a "
                'larger sequence_length, or long_documents="drop" to leave such records out'
            )
        starts, order = best_fit_decreasing(lengths[kept], sequence_length)
        records.append(kept[order] + int(reader.record_starts[position]))
        row_starts.append(starts[1:] + records_so_far)
        records_so_far += len(order)
        shard_rows.append(len(starts) - 1)
    return RecordRows(
        np.concatenate(row_starts),
        np.concatenate(records) if records else np.empty(0, np.int64),
        np.asarray(shard_rows, np.int64),
    )


class PackedRecordSource(PinnedShards[DocumentReader[Any]]):
    """Sample ``k`` is packed row ``k``: the list of its decoded records; the default collate keeps the rows."""

    kind = "packed records"

    def __init__(
        self,
        storage: Any,
        snapshot: ShardTable,
        sequence_length: int,
        drop_long: bool = False,
    ) -> None:
        super().__init__(storage, snapshot)
        self.sequence_length = sequence_length
        self.drop_long = drop_long  # long_documents="drop": records longer than a row are left out
        self._rows: RecordRows | None = None

    @property
    def rows(self) -> RecordRows:
        if self._rows is None:
            self._rows = pack_records(self.reader, self.sequence_length, self.drop_long)
        return self._rows

    @property
    def sample_count(self) -> int:
        return self.rows.row_count

    @property
    def sample_bytes(self) -> int:
        return 0

    def shard_sample_counts(self) -> np.ndarray:
        """Packed rows per shard, in storage order (what a windowed order walks; packing never crosses a shard)."""
        return self.rows.shard_rows

    def clean_cuts(self) -> None:
        """No row crosses a shard: a windowed order may put shards in any order."""
        return None

    def fetch(self, indices: np.ndarray, epoch: int) -> list[list[Any]]:
        records, counts = self.rows.of_rows(np.asarray(indices, np.int64))
        decoded = self.reader.read_many(records)
        bounds = np.concatenate([[0], np.cumsum(counts)]).tolist()
        return [decoded[start:stop] for start, stop in pairwise(bounds)]

    def prefetch(self, indices: np.ndarray, epoch: int) -> None:
        """Shards of a remote storage that these rows' records need are downloaded in the background."""
        self.reader.prefetch_records(self.rows.of_rows(np.asarray(indices, np.int64))[0])

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        records, counts = self.rows.of_rows(np.asarray(indices, np.int64))
        keys = record_keys(self.reader, records).reshape(-1, 2)
        whole = len(records)
        return self.sourced(
            SamplePieces.of(
                counts, keys[:, 0], keys[:, 1], np.zeros(whole), np.full(whole, WHOLE_RECORD), indices=records
            )
        )

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        records, counts = self.rows.of_rows(np.asarray(indices, np.int64))
        return np.concatenate([counts, record_keys(self.reader, records)]).astype(np.int64)

    def default_collate(self, samples: list[list[Any]]) -> list[list[Any]]:
        return samples

    def split_collated(self, batch: list[Any], sizes: list[int]) -> list[Any]:
        starts = np.cumsum([0, *sizes]).tolist()
        return [batch[start:stop] for start, stop in pairwise(starts)]

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        chosen = {"long_documents": "drop"} if self.drop_long else {}
        return {**super().identity(digest=digest), "sequence_length": self.sequence_length, **chosen}

    def _unset_caches(self) -> dict[str, Any]:
        return {**super()._unset_caches(), "_rows": None}  # packed from the other shards when first needed
