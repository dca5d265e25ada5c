"""Which sample source a loader reads: the one factory that knows every kind of storage.

How a token storage is cut into samples is the window mode's (``_sources.window_modes``): this module
checks the arguments that depend on the storage's kind, takes the storage's snapshot, and asks the mode
for the source of each storage (each component of a mixture).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from guideloom._core.checks import check_sequence_length
from guideloom._loading.snapshot_broadcast import job_snapshot
from guideloom._mixture.mixture import Mixture
from guideloom._mixture.source import MixtureSource
from guideloom._sources.source import SampleSource
from guideloom._sources.window_modes import PLAIN_WINDOWS, StorageSource, WindowMode
from guideloom._storage.storages import DocumentStorage, TokenStorage


def make_source(
    storage: object,
    mode: WindowMode = PLAIN_WINDOWS,
    *,
    sequence_length: int | None,
    window_dtype: torch.dtype | None = None,
    shuffle: bool = False,
    seed: int = 0,
    one_snapshot_per_job: bool = False,
) -> SampleSource:
    """The source for the shards of ``storage`` committed now, cut as ``mode`` says, checking the arguments fit
    its kind.

    A `Mixture` gets one source per component, made here as for that storage alone (with labels when one
    of them is masked, so that every batch has the same keys), blended in its order (``shuffle`` and
    ``seed`` key the components' passes and the blocks' slot order). ``one_snapshot_per_job``: rank 0
    lists each storage and broadcasts the list (every rank of the initialised process group must be
    making its loader).
    """
    cut = _Cut(mode, sequence_length, window_dtype, one_snapshot_per_job)
    if isinstance(storage, Mixture):
        members = storage.components.values()
        labels = any(isinstance(member, TokenStorage) and member.loss_mask for member in members)
        parts = [cut.source(member, labels, name) for name, member in storage.components.items()]
        return MixtureSource(storage, parts, shuffle=shuffle, seed=seed)
    return cut.source(storage, False, None)


class _Cut:
    """The arguments of ``make_source`` that each storage (each component of a mixture) is cut with."""

    def __init__(
        self, mode: WindowMode, sequence_length: int | None, window_dtype: Any, one_snapshot_per_job: bool
    ) -> None:
        self.mode = mode
        self.sequence_length = sequence_length
        self.window_dtype = window_dtype
        self.one_snapshot_per_job = one_snapshot_per_job

    def source(self, storage: object, labels: bool, component: str | None) -> StorageSource:
        """The source of one storage; ``component`` names a mixture's component in the error of an empty one."""
        window_dtype, sequence_length = self.window_dtype, self.sequence_length
        if not isinstance(storage, DocumentStorage | TokenStorage):  # before the arguments that depend on its kind
            raise TypeError(f"storage must be a DocumentStorage, TokenStorage or Mixture, got {type(storage).__name__}")
        self.mode.check_storage(storage)
        if window_dtype is not None and not isinstance(storage, TokenStorage):
            raise ValueError("window_dtype must be omitted for a DocumentStorage: it applies to token windows")
        if window_dtype is not None and not isinstance(window_dtype, torch.dtype):
            raise TypeError(f"window_dtype must be torch.int64 or torch.int32, got {type(window_dtype).__name__}")
        if window_dtype not in (None, torch.int64, torch.int32):
            raise ValueError(f"window_dtype must be torch.int64 or torch.int32, got {window_dtype!r}")
        if isinstance(storage, TokenStorage) and sequence_length is None:
            raise ValueError("sequence_length is required for a TokenStorage (use T + 1 for next-token targets)")
        storage.header_for_reading()  # a missing storage is StorageNotFoundError here, not at the first batch
        snapshot = job_snapshot(storage) if self.one_snapshot_per_job else storage.snapshot()
        if isinstance(storage, DocumentStorage):
            records = self.mode.document_source(storage, snapshot, sequence_length)
            return _not_empty(records, " (empty storage, or no record as short as a row)", component)
        sequence_length = check_sequence_length(sequence_length)
        window_numpy_dtype = np.dtype(np.int32 if window_dtype == torch.int32 else np.int64)
        if window_numpy_dtype == np.int32 and storage.dtype.itemsize == 8:
            raise ValueError(f"window_dtype=torch.int32 cannot hold the {storage.dtype} ids of {storage.location}")
        source = self.mode.source(storage, snapshot, sequence_length, window_numpy_dtype, labels)
        tokens = source.reader.token_count
        why = (
            f": sequence_length={sequence_length} is longer than its {tokens} tokens" if tokens else " (empty storage)"
        )
        return _not_empty(source, why, component)


def _not_empty(source: StorageSource, why: str, component: str | None) -> StorageSource:
    try:
        empty = source.sample_count == 0  # (packed records are packed here, and may name a record too long)
    except BaseException:
        source.close()
        raise
    if empty:
        source.close()
        which = "" if component is None else f"the mixture's component {component!r}: "
        raise ValueError(f"{which}the storage at {source.storage.location} has no samples to load{why}")
    return source
