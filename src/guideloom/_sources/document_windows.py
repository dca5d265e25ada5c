"""Document-aware token sources: stream windows that say where documents start, and packed documents.

Both serve batches as a dict of ``input_ids``, ``position_ids``, ``labels``,
``cu_seqlens`` and ``max_seqlen`` (see ``_windows.boundaries``). A user ``collate``
receives the rows as a sequence of one-row dicts instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from guideloom._core.checks import check_bool, check_choice, check_int
from guideloom._shards.shard_table import ShardTable
from guideloom._sources.describe import SamplePieces, packed_keys, packed_pieces
from guideloom._sources.labeled_windows import LabeledWindowSource
from guideloom._sources.packed_records import RECORD_LONG_DOCUMENTS
from guideloom._sources.token_windows import TokenWindowSource
from guideloom._storage.storages import TokenStorage
from guideloom._windows.boundaries import PieceRows, split_batch
from guideloom._windows.document_rows import PackedShards, boundary_rows, document_starts_near
from guideloom._windows.labels import read_window_masks
from guideloom._windows.packing import LONG_DOCUMENTS


class BoundaryWindowSource(TokenWindowSource):
    """Sample ``k`` is ``stream[k*S:(k+1)*S]`` as for plain windows, with the pieces its documents make of it."""

    kind = "token windows with document boundaries"
    plain_windows = False

    def fetch(self, indices: np.ndarray, epoch: int) -> PieceRows:  # type: ignore[override]
        windows = super().fetch(indices, epoch)
        starts = np.asarray(indices, np.int64) * self.sequence_length
        rows = boundary_rows(windows, starts, document_starts_near(self.reader, starts, self.sequence_length))
        if self.reader.header.loss_mask:
            rows = dataclasses.replace(rows, loss_mask=read_window_masks(self.reader, indices, self.sequence_length))
        return rows

    def default_collate(self, samples: PieceRows) -> dict[str, Any]:  # type: ignore[override]
        return samples.batch()

    def split_collated(self, batch: dict[str, Any], sizes: list[int]) -> list[Any]:  # type: ignore[override]
        return split_batch(batch, sizes)


class PackedRowSource(TokenWindowSource):
    """Sample ``k`` is packed row ``k``: whole documents (cut at ``S``) placed by best-fit decreasing per shard."""

    kind = "packed documents"
    plain_windows = False

    def __init__(
        self,
        storage: TokenStorage,
        snapshot: ShardTable,
        sequence_length: int,
        window_dtype: np.dtype[Any],
        pad_id: int,
        long_documents: str = "split",
    ) -> None:
        super().__init__(storage, snapshot, sequence_length, window_dtype)
        self.pad_id = pad_id
        self.long_documents = long_documents
        self._packed: PackedShards | None = None

    @property
    def packed(self) -> PackedShards:
        """The shards' row counts (cached) and their packings, each loaded when first read, in each process."""
        if self._packed is None:
            reader = self.reader
            self._packed = PackedShards(reader, self.sequence_length, reader.shard_set.max_open, self.long_documents)
        return self._packed

    @property
    def sample_count(self) -> int:
        return self.packed.row_count

    def fetch(self, indices: np.ndarray, epoch: int) -> PieceRows:  # type: ignore[override]
        reader = self.reader
        rows = self.packed.rows(
            reader, np.asarray(indices, np.int64), self.pad_id, self.window_dtype, reader.header.loss_mask
        )
        self.check_ids(rows.input_ids)
        return rows

    def describe(self, indices: np.ndarray, epoch: int) -> SamplePieces:
        return packed_pieces(self.packed, self.reader, indices)

    def sample_keys(self, indices: np.ndarray, epoch: int) -> np.ndarray:
        return packed_keys(self.packed, self.reader, indices)

    def default_collate(self, samples: PieceRows) -> dict[str, Any]:  # type: ignore[override]
        return samples.batch()

    def split_collated(self, batch: dict[str, Any], sizes: list[int]) -> list[Any]:  # type: ignore[override]
        return split_batch(batch, sizes)

    def identity(self, *, digest: bool = True) -> dict[str, Any]:
        chosen = {} if self.long_documents == "split" else {"long_documents": self.long_documents}  # as 0.2 states
        return {**super().identity(digest=digest), "pad_id": self.pad_id, **chosen}

    def close(self) -> None:
        """Release the shards and the packings' mappings (a later use loads them again)."""
        if self._packed is not None:
            self._packed.close()
        self._packed = None
        super().close()

    def __getstate__(self) -> dict[str, Any]:
        return {**super().__getstate__(), "_packed": None}


def check_window_modes(
    storage: object, document_boundaries: object, pack_documents: object, pad_id: object, long_documents: object = None
) -> None:
    """Check the window-mode arguments of ``from_storage``: they apply to token storages, one mode at a time."""
    check_bool("document_boundaries", document_boundaries)
    check_bool("pack_documents", pack_documents)
    check_int("pad_id", pad_id)
    if long_documents is not None:
        check_choice("long_documents", long_documents, LONG_DOCUMENTS)
        if not pack_documents:
            raise ValueError(
                "long_documents applies only with pack_documents=True (other windows are cut from the stream and "
                "never cut documents)"
            )
    if document_boundaries and pack_documents:
        raise ValueError(
            "document_boundaries and pack_documents are exclusive: pick one (packed rows report their documents too)"
        )
    if document_boundaries and not isinstance(storage, TokenStorage):
        raise ValueError(
            f"document_boundaries=True applies to a TokenStorage or a mixture of them, not to a "
            f"{type(storage).__name__}: documents are whole samples already"
        )
    if pack_documents and not isinstance(storage, TokenStorage):  # packed records: never cut, never padded
        if long_documents not in (None, *RECORD_LONG_DOCUMENTS):
            raise ValueError(
                f"long_documents={long_documents!r} cannot apply to packed records, which are never cut: pass "
                '"drop" to leave records longer than a row out, or omit it (such a record is then an error)'
            )
        if pad_id != 0:
            raise ValueError("pad_id applies to packed token rows: packed records are lists of records, not padded")
    if pad_id != 0 and not pack_documents:
        raise ValueError("pad_id applies only with pack_documents=True (other windows have no padding)")


def window_source(
    storage: TokenStorage,
    snapshot: ShardTable,
    sequence_length: int,
    window_dtype: np.dtype[Any],
    document_boundaries: bool,
    pack_documents: bool,
    pad_id: int,
    long_documents: str | None = None,
    labels: bool = False,
) -> TokenWindowSource:
    """The token source of the chosen window mode (plain windows when neither is chosen).

    Plain windows of a masked storage have labels; ``labels`` gives them to an unmasked storage's too.
    """
    if pack_documents:
        limit = int(np.iinfo(window_dtype).max)
        if not 0 <= pad_id <= limit:
            raise ValueError(f"pad_id must be in [0, {limit}] for {window_dtype} batches, got {pad_id}")
        return PackedRowSource(storage, snapshot, sequence_length, window_dtype, pad_id, long_documents or "split")
    if document_boundaries:
        return BoundaryWindowSource(storage, snapshot, sequence_length, window_dtype)
    if labels or storage.loss_mask:
        return LabeledWindowSource(storage, snapshot, sequence_length, window_dtype)
    return TokenWindowSource(storage, snapshot, sequence_length, window_dtype)
