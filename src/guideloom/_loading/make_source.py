"""Which sample source a loader reads: the one factory that knows every kind of storage and window mode."""

from __future__ import annotations

from typing import TypeVar

import numpy as np
import torch

from guideloom._core.checks import check_sequence_length
from guideloom._loading.job_snapshot import job_snapshot
from guideloom._mixture.mixture import Mixture
from guideloom._mixture.source import MixtureSource
from guideloom._sources.document_windows import check_window_modes, window_source
from guideloom._sources.documents import DocumentSource
from guideloom._sources.packed_records import PackedRecordSource
from guideloom._sources.source import SampleSource
from guideloom._sources.token_windows import TokenWindowSource
from guideloom._storage.storages import DocumentStorage, TokenStorage


def make_source(
    storage: object,
    *,
    sequence_length: int | None,
    window_dtype: torch.dtype | None = None,
    document_boundaries: bool = False,
    pack_documents: bool = False,
    pad_id: int = 0,
    long_documents: str | None = None,
    shuffle: bool = False,
    seed: int = 0,
    component: str | None = None,
    labels: bool = False,
    one_snapshot_per_job: bool = False,
) -> SampleSource:
    """The source for the shards of ``storage`` committed now, checking the arguments fit its kind.

    ``document_boundaries`` / ``pack_documents`` (with ``pad_id`` and ``long_documents``) choose a
    document-aware window mode; ``labels`` gives plain windows labels as a masked storage's have (a
    mixture's components get them when one of them is masked).
    A `Mixture` gets one source per component, made here as for that storage alone, blended in its order
    (``shuffle`` and ``seed`` key the components' passes and the blocks' slot order); ``component`` names
    such a component in the error of a storage with no sample. ``one_snapshot_per_job``: rank 0 lists each
    storage and broadcasts the list (every rank of the initialised process group must be making its loader).
    """
    if isinstance(storage, Mixture):
        masked = any(isinstance(member, TokenStorage) and member.loss_mask for member in storage.components.values())
        parts = [
            make_source(
                member,
                sequence_length=sequence_length,
                window_dtype=window_dtype,
                document_boundaries=document_boundaries,
                pack_documents=pack_documents,
                pad_id=pad_id,
                long_documents=long_documents,
                component=name,
                labels=masked,
                one_snapshot_per_job=one_snapshot_per_job,
            )
            for name, member in storage.components.items()
        ]
        return MixtureSource(storage, parts, shuffle=shuffle, seed=seed)
    if not isinstance(storage, DocumentStorage | TokenStorage):  # before the arguments that depend on its kind
        raise TypeError(f"storage must be a DocumentStorage, TokenStorage or Mixture, got {type(storage).__name__}")
    check_window_modes(storage, document_boundaries, pack_documents, pad_id, long_documents)
    if window_dtype is not None and not isinstance(storage, TokenStorage):
        raise ValueError("window_dtype must be omitted for a DocumentStorage: it applies to token windows")
    if window_dtype is not None and not isinstance(window_dtype, torch.dtype):
        raise TypeError(f"window_dtype must be torch.int64 or torch.int32, got {type(window_dtype).__name__}")
    if window_dtype not in (None, torch.int64, torch.int32):
        raise ValueError(f"window_dtype must be torch.int64 or torch.int32, got {window_dtype!r}")
    if isinstance(storage, TokenStorage) and sequence_length is None:
        raise ValueError("sequence_length is required for a TokenStorage (use T + 1 for next-token targets)")
    if isinstance(storage, DocumentStorage) and sequence_length is not None and not pack_documents:
        raise ValueError(
            "sequence_length must be omitted for a DocumentStorage: each record is one sample (with "
            "pack_documents=True it is the length of a row of packed records)"
        )
    if isinstance(storage, DocumentStorage) and pack_documents and sequence_length is None:
        raise ValueError("pack_documents=True on a DocumentStorage needs sequence_length: the length of a row")
    storage.header_for_reading()  # a missing storage is StorageNotFoundError here, not at the first batch
    snapshot = job_snapshot(storage) if one_snapshot_per_job else storage.snapshot()
    if isinstance(storage, DocumentStorage) and pack_documents:
        rows = PackedRecordSource(storage, snapshot, check_sequence_length(sequence_length), long_documents)
        return _not_empty(rows, " (empty storage, or every record longer than a row)", component)
    if isinstance(storage, DocumentStorage):
        return _not_empty(DocumentSource(storage, snapshot), " (empty storage)", component)
    sequence_length = check_sequence_length(sequence_length)
    window_numpy_dtype = np.dtype(np.int32 if window_dtype == torch.int32 else np.int64)
    if window_numpy_dtype == np.int32 and storage.dtype.itemsize == 8:
        raise ValueError(f"window_dtype=torch.int32 cannot hold the {storage.dtype} ids of {storage.location}")
    source = window_source(
        storage,
        snapshot,
        sequence_length,
        window_numpy_dtype,
        document_boundaries,
        pack_documents,
        pad_id,
        long_documents,
        labels,
    )
    tokens = source.reader.token_count
    why = f": sequence_length={sequence_length} is longer than its {tokens} tokens" if tokens else " (empty storage)"
    return _not_empty(source, why, component)


SourceT = TypeVar("SourceT", DocumentSource, PackedRecordSource, TokenWindowSource)


def _not_empty(source: SourceT, why: str, component: str | None) -> SourceT:
    try:
        empty = source.sample_count == 0
    except BaseException:
        source.close()
        raise
    if empty:
        source.close()
        which = "" if component is None else f"the mixture's component {component!r}: "
        raise ValueError(f"{which}the storage at {source.storage.location} has no samples to load{why}")
    return source
