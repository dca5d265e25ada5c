"""The source of packed documents (``pack_documents=True``): whole documents placed into rows of ``S`` tokens.

Batches are a dict of ``input_ids``, ``position_ids``, ``labels``, ``cu_seqlens`` and ``max_seqlen``
(see ``_windows.boundaries``); a user ``collate`` receives the rows as a sequence of one-row dicts instead.
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np

from guideloom._shards.parts import PlannedPart
from guideloom._sources.describe import SamplePieces, packed_keys, packed_pieces
from guideloom._sources.token_windows import CutSettings, TokenSource
from guideloom._windows.boundaries import PieceRows, split_batch
from guideloom._windows.document_rows import PackedShards


class PackingSettings(CutSettings, Protocol):
    """The settings of packed rows (``pack_documents=True``, `window_modes.PackedDocuments`)."""

    @property
    def pad_id(self) -> int:
        """The token id that pads a row."""
        ...

    @property
    def long_documents(self) -> str:
        """What becomes of a document longer than a row: "split", "truncate" or "drop"."""
        ...


class PackedRowSource(TokenSource[PieceRows]):
    """Sample ``k`` is packed row ``k``: whole documents (cut at ``S``) placed by best-fit decreasing per shard."""

    kind = "packed documents"
    mode: PackingSettings
    _packed: PackedShards | None = None  # loaded when first read, in each process

    @property
    def packed(self) -> PackedShards:
        """The shards' row counts (cached) and their packings, each loaded when first read, in each process."""
        if self._packed is None:
            reader = self.reader
            self._packed = PackedShards(
                reader, self.sequence_length, reader.shard_set.max_open, self.mode.long_documents
            )
        return self._packed

    @property
    def sample_count(self) -> int:
        return self.packed.row_count

    def shard_sample_counts(self) -> np.ndarray:
        """Packed rows per shard, in storage order (packing never crosses a shard)."""
        return np.asarray(self.packed.row_counts, np.int64)

    def sample_parts(self, first: int, stop: int) -> dict[int, PlannedPart]:
        """Nothing: a packed row's documents lie anywhere in its shard, so its shards are read whole."""
        return {}

    def clean_cuts(self) -> None:
        """Packing never crosses a shard: a windowed order may put shards in any order."""
        return None

    def fetch(self, indices: np.ndarray, epoch: int) -> PieceRows:
        reader = self.reader
        rows = self.packed.rows(
            reader, np.asarray(indices, np.int64), self.mode.pad_id, self.window_dtype, reader.header.loss_mask
        )
        self.check_ids(rows.input_ids)
        return rows

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        return packed_pieces(self.packed, self.reader, indices)

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return packed_keys(self.packed, self.reader, indices)

    def default_collate(self, samples: PieceRows) -> dict[str, Any]:
        return samples.batch()

    def split_collated(self, batch: dict[str, Any], sizes: list[int]) -> list[Any]:
        return split_batch(batch, sizes)

    def close(self) -> None:
        """Release the shards and the packings' mappings (a later use loads them again)."""
        if self._packed is not None:
            self._packed.close()
        self._packed = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_packed": None}
