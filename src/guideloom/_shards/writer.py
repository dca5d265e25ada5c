"""Writers: append records to shards, commit each shard atomically.

Each shard being written lives in a local ``incomplete/`` directory under a name
unique to this writer; committing writes offsets and footer, fsyncs, and hands
the file to the storage's commit target: a hard link into ``shards/`` for a local
storage, a conditional upload for a remote one. Either fails if the shard exists,
so racing writers of one shard cannot both win and a committed shard is never
overwritten.
"""

from __future__ import annotations

import asyncio
import os
import socket
import sys
import uuid
from collections import OrderedDict
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import Any, Generic, TypeVar

import numpy as np

from guideloom._core.errors import ShardExistsError
from guideloom._shards.field_columns import ColumnSplitter, splitter_for
from guideloom._shards.header import StorageHeader
from guideloom._shards.local_shards import LocalTarget
from guideloom._shards.loss_masks import loss_mask_array
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.record_lengths import checked_length
from guideloom._shards.shard_access import CommitTarget
from guideloom._shards.shard_in_progress import Background, ShardInProgress
from guideloom._shards.shard_names import check_shard_id, shard_file_name

In = TypeVar("In")
MAX_OPEN_FILES = 64

_NO_DATA: Any = object()  # tells append(data) from append(shard, data)


class SyncWriter(Generic[In]):
    """Appends samples to shards the caller names; leaving the ``with`` block commits them all.

    Leaving by an exception commits nothing of this writer that is still open (the exception's notes
    name the shards discarded); ``commit(shard)`` commits one shard early, and it stays committed.
    Several writers may write different shards of one storage at once with no coordination.
    """

    def __init__(
        self,
        target: Path | CommitTarget,
        header: StorageHeader,
        encode: Callable[[Any], tuple[memoryview, int]],
        measure: Callable[[Any], int] | None = None,
        on_commit: Callable[[int], None] | None = None,
        columns: ColumnSplitter | None = None,
        direct: bool = False,
    ):
        self._target: CommitTarget = LocalTarget(target) if isinstance(target, Path) else target
        self._header = header
        self._encode = RecordEncoder(encode, measure)
        self._on_commit = on_commit
        self._columns = splitter_for(header.field_columns, columns)
        self._token = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        self._open: OrderedDict[int, ShardInProgress] = OrderedDict()
        self._committed: set[int] = set()
        self._background = Background()
        self._direct = direct  # the shards' data written past the page cache (``direct_writes``)
        self._last: ShardInProgress | None = None  # the shard appended to last, while it is open
        self._closed = False

    def append(self, shard: int, data: In = _NO_DATA, loss_mask: object = None) -> None:
        """Append one sample to ``shard`` (created on first use); a masked token storage's takes its ``loss_mask``.

        A record the format cannot pack is a ``RecordPackError`` naming the shard and the record's index in it;
        nothing of it is written, and the writer goes on.
        """
        if data is _NO_DATA:
            raise TypeError(
                "append() takes the shard and the record: writer.append(shard, data). To have the writer choose "
                "shard ids, open it as storage.sync_writer(shard_size='256MiB') and call writer.append(data)"
            )
        if self._closed:
            raise ValueError("this writer is closed")
        if loss_mask is not None or self._header.loss_mask:
            self._append_masked(shard, data, loss_mask)
            return
        last = self._last
        if last is not None and type(shard) is int and shard == last.shard and last.file is not None:
            encoder = self._encode  # appending to the same shard again: the fast path, inlined
            try:
                payload, element_count = encoder.encode(data)
                length = None if encoder.measure is None else checked_length(encoder.measure(data), "this record")
            except Exception as error:
                raise encoder.error(error, _record_of(last)) from error
            last.write(payload, element_count, length)
            return
        shard = check_shard_id(shard)
        encoded = self._encode(data, lambda: self._next_record(shard))
        self._last = self._shard(shard)
        self._last.write(*encoded)

    def append_encoded(
        self,
        shard: int,
        records: bytes | memoryview | np.ndarray,
        sizes: Sequence[int] | np.ndarray,
        lengths: np.ndarray | None = None,
    ) -> None:
        """Append many records the storage's format already encoded: their bytes back to back, and each one's size
        (and length, in a storage that records lengths). One write instead of a call per record, for importers
        that encode a whole batch at once; the bytes must be what the format's ``pack`` gives each record."""
        if self._closed:
            raise ValueError("this writer is closed")
        if self._header.kind != "documents" or self._header.loss_mask:
            raise ValueError(
                f"append_encoded writes a document storage's records; this storage holds {self._header.describe()}"
            )
        view = (records.data if isinstance(records, np.ndarray) else memoryview(records)).cast("B")
        counts = np.asarray(sizes, np.int64)
        if counts.ndim != 1 or (counts < 0).any() or int(counts.sum()) != view.nbytes:
            raise ValueError(f"the records' sizes add up to {int(counts.sum())} bytes, not the {view.nbytes} given")
        if (lengths is None) == self._header.record_lengths or (lengths is not None and len(lengths) != len(counts)):
            raise ValueError(
                "give one length per record exactly when the storage records lengths "
                f"(it {'does' if self._header.record_lengths else 'does not'})"
            )
        in_progress = self._last = self._shard(check_shard_id(shard))
        in_progress.write_many(view, counts, None if lengths is None else np.asarray(lengths, np.int64))

    def _next_record(self, shard: int) -> str:
        """Names the record an append to ``shard`` would add, for errors."""
        in_progress = self._open.get(shard)
        return f"record {0 if in_progress is None else in_progress.record_count} of shard {shard}"

    def _append_masked(self, shard: int, data: In, loss_mask: object) -> None:
        """Append a document and its loss mask, both checked before anything is written."""
        if not self._header.loss_mask:
            raise ValueError(
                f"loss_mask was given, but this storage holds {self._header.describe()}: only a TokenStorage "
                "created with loss_mask=True takes one"
            )
        if loss_mask is None:
            raise ValueError("loss_mask is required: this storage was created with loss_mask=True (one per token)")
        shard = check_shard_id(shard)
        payload, element_count, _ = self._encode(data, lambda: self._next_record(shard))
        mask = loss_mask_array(loss_mask, element_count)
        in_progress = self._last = self._shard(shard)
        in_progress.write(payload, element_count)
        assert in_progress.mask_bits is not None
        in_progress.mask_bits.append(mask)

    def commit(self, shard: int) -> None:
        """Commit ``shard`` now: it becomes visible to new readers and immutable."""
        shard = check_shard_id(shard)
        in_progress = self._open.pop(shard, None)
        self._last = None
        if in_progress is None:
            raise ValueError(f"shard {shard} has nothing appended by this writer")
        try:
            in_progress.finish(self._header)
            if not self._target.publish(in_progress.path, in_progress.info()):
                raise ShardExistsError(
                    f"shard {shard} was committed by another writer meanwhile ({self._target.describe(shard)})"
                )
        finally:
            in_progress.abort()
        self._committed.add(shard)
        if self._on_commit is not None:
            self._on_commit(shard)

    def close(self, commit: bool = True) -> None:
        """Commit (or, with ``commit=False``, discard) every shard still open."""
        if self._closed:
            return
        self._closed = True
        self._last = None
        first_error: Exception | None = None
        try:
            for shard in list(self._open):
                if not commit:
                    self._open.pop(shard).abort()
                    continue
                try:
                    self.commit(shard)
                except Exception as error:  # commit the others, then report the first failure
                    first_error = first_error or error
        finally:
            self._background.shutdown()
            if isinstance(self._target, LocalTarget):
                self._target.write_index(self._header)
        if first_error is not None:
            raise first_error

    def _shard(self, shard: int) -> ShardInProgress:
        """The shard's file in progress (created on first use), open, with at most MAX_OPEN_FILES open."""
        in_progress = self._open.get(shard)
        if in_progress is not None:
            self._open.move_to_end(shard)
            if in_progress.file is None:
                self._make_room()
            return in_progress
        if shard in self._committed or self._target.committed(shard):
            raise ShardExistsError(
                f"shard {shard} is already committed ({self._target.describe(shard)}); committed shards are immutable"
            )
        self._make_room()
        temporary = self._target.incomplete / f"{shard_file_name(shard)}.{self._token}"
        in_progress = ShardInProgress.under(
            self._header, shard, temporary, self._background, self._columns, self._direct
        )
        self._open[shard] = in_progress
        return in_progress

    def _make_room(self) -> None:
        """Close least recently used files so one more can open (they reopen when appended to)."""
        open_files = [candidate for candidate in self._open.values() if candidate.file is not None]
        for candidate in open_files[: max(0, len(open_files) - MAX_OPEN_FILES + 1)]:
            candidate.suspend()

    def __enter__(self) -> SyncWriter[In]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        if error is not None:
            discarded = [shard for shard, in_progress in self._open.items() if in_progress.record_count]
            if discarded:
                error.add_note(
                    f"guideloom: leaving the writer by this error discarded shards {discarded}, never committed "
                    f"(committed before: {sorted(self._committed) or 'none'}); writer.commit(shard) commits a "
                    "complete shard for good"
                )
        self.close(commit=error is None)

    def __del__(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # At interpreter exit modules are torn down; the files left in incomplete/ are leftovers then.
        if not getattr(self, "_closed", True) and not finalizing():
            self.close(commit=False)


def _record_of(in_progress: ShardInProgress) -> str:
    return f"record {in_progress.record_count} of shard {in_progress.shard}"


class AsyncWriter(Generic[In]):
    """The writer for event loops: the same operations, awaited (file work runs in a thread)."""

    def __init__(self, writer: SyncWriter[In]) -> None:
        self._writer = writer

    async def append(self, shard: int, data: In = _NO_DATA, loss_mask: object = None) -> None:
        await asyncio.to_thread(self._writer.append, shard, data, loss_mask)

    async def commit(self, shard: int) -> None:
        await asyncio.to_thread(self._writer.commit, shard)

    async def close(self, commit: bool = True) -> None:
        await asyncio.to_thread(self._writer.close, commit)

    async def __aenter__(self) -> AsyncWriter[In]:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        await self.close(commit=error is None)
