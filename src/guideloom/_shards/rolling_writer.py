"""The writer that picks shard ids itself: records appended in order, a new shard at each target size.

Each shard is committed as soon as it holds ``shard_size`` bytes of data, under the next free id:
it is finished under a candidate id (the highest id committed then, plus one: a read of the local
index, or one listing) and handed to the storage's commit target, which refuses an id already
committed (a hard link on a local or network file system, a conditional create on an object store). Refused,
the writer rewrites the footer, the only place that names the id, with the next candidate after
the highest committed now, and tries again. So writers running at once, in threads, processes or
on other machines, never need to coordinate: each id is committed once, by whoever claims it first.
"""

from __future__ import annotations

import contextlib
import os
import socket
import sys
import uuid
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import Generic, TypeVar

from guideloom._core.errors import ShardExistsError
from guideloom._shards.field_columns import ColumnSplitter, splitter_for
from guideloom._shards.header import StorageHeader
from guideloom._shards.local_shards import LocalTarget
from guideloom._shards.loss_masks import loss_mask_array
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.shard_access import CommitTarget
from guideloom._shards.shard_in_progress import Background, ShardInProgress
from guideloom._shards.shard_names import MAX_SHARD_ID

In = TypeVar("In")


class RollingWriter(Generic[In]):
    """Appends records in order; commits a shard each time one holds ``shard_size`` bytes, under an id it claims.

    Every record appended before an exception is committed when the writer is left, by the error or not:
    the writer is a stream, so ``committed_records`` (those appended first) is where a rerun resumes.
    """

    def __init__(
        self,
        target: Path | CommitTarget,
        header: StorageHeader,
        encoder: RecordEncoder,
        shard_size: int,
        highest_committed: Callable[[], int],
        on_commit: Callable[[int], None] | None = None,
        columns: ColumnSplitter | None = None,
    ) -> None:
        self._target: CommitTarget = LocalTarget(target) if isinstance(target, Path) else target
        self._header = header
        self._encode = encoder
        self.shard_size = shard_size
        self._highest_committed = highest_committed
        self._on_commit = on_commit
        self._columns = splitter_for(header.field_columns, columns)
        self._token = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        self._background = Background()
        self._current: ShardInProgress | None = None
        self._next_candidate = 0  # the id after this writer's last
        self._files_made = 0
        self._closed = False
        self.committed_shards: list[int] = []  #: ids this writer committed, in order
        self.committed_records = 0  #: records committed: the first ones appended, in order
        self.appended_records = 0  #: records appended so far

    def append(self, data: In, *more: object, loss_mask: object = None) -> None:
        """Append one record (a masked token storage's takes its ``loss_mask=``); the writer picks its shard."""
        if more:
            raise TypeError(
                "this writer picks shard ids itself (it was opened with shard_size): call writer.append(data) "
                "(a masked token storage's takes loss_mask= by keyword); writer.append(shard, data) is the call of a "
                "writer opened without shard_size"
            )
        if self._closed:
            raise ValueError("this writer is closed")
        payload, element_count, length = self._encode(data, self._where)
        mask = None
        if self._header.loss_mask:
            if loss_mask is None:
                raise ValueError("loss_mask is required: this storage was created with loss_mask=True (one per token)")
            mask = loss_mask_array(loss_mask, element_count)
        elif loss_mask is not None:
            raise ValueError(
                f"loss_mask was given, but this storage holds {self._header.describe()}: only a TokenStorage "
                "created with loss_mask=True takes one"
            )
        current = self._current
        if current is None:
            current = self._current = self._new_shard()
        current.write(payload, element_count, length)
        if mask is not None:
            assert current.mask_bits is not None
            current.mask_bits.append(mask)
        self.appended_records += 1
        if current.data_size >= self.shard_size:
            self.flush()

    def _where(self) -> str:
        """The record an append would add, named for errors: its shard has no id until it is committed."""
        index = 0 if self._current is None else self._current.record_count
        return (
            f"record {index} of the shard being filled (its id is picked when it is committed; record "
            f"{self.appended_records} appended to this writer)"
        )

    def flush(self) -> None:
        """Commit the shard being filled now, however full (nothing happens if it holds no record)."""
        current, self._current = self._current, None
        if current is None:
            return
        try:
            # Where the committed ids end now: the ids after this writer's last may be others' by now.
            current.shard = max(self._next_candidate, self._highest_committed() + 1)
            current.finish(self._header)  # under its candidate id
            shard = self._claim(current)
        finally:
            current.abort()
        self.committed_shards.append(shard)
        self.committed_records += current.record_count
        if self._on_commit is not None:
            self._on_commit(shard)

    def _claim(self, finished: ShardInProgress) -> int:
        """Commit the finished shard under the first id no other writer has claimed; that id."""
        candidate = finished.shard
        while True:
            if candidate > MAX_SHARD_ID:
                raise ValueError("every shard id below 10**12 is taken: this storage can commit no more shards")
            if candidate != finished.shard:
                finished.relabel(candidate)
            # The target may consume the file it is given, and a refused claim is tried again: give it a link.
            attempt = finished.path.with_name(f"{finished.path.name}.{candidate}")
            os.link(finished.path, attempt)
            try:
                with contextlib.suppress(ShardExistsError):  # a refusal, like False
                    if self._target.publish(attempt, finished.info()):
                        self._next_candidate = candidate + 1
                        return candidate
            finally:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(attempt)
            candidate = max(candidate + 1, self._highest_committed() + 1)  # another writer claimed it

    def _new_shard(self) -> ShardInProgress:
        self._files_made += 1
        temporary = self._target.incomplete / f"rolling.{self._token}.{self._files_made}"
        return ShardInProgress.under(self._header, 0, temporary, self._background, self._columns)  # its id: later

    def close(self, commit: bool = True) -> None:
        """Commit (or, with ``commit=False``, discard) the shard being filled; full ones are committed already."""
        if self._closed:
            return
        self._closed = True
        try:
            if commit:
                self.flush()
            elif self._current is not None:
                self._current.abort()
                self._current = None
        finally:
            self._background.shutdown()

    def __enter__(self) -> RollingWriter[In]:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        try:
            self.close(commit=True)
        finally:
            if error is not None:
                error.add_note(
                    f"guideloom: the writer committed the first {self.committed_records} of the "
                    f"{self.appended_records} records appended to it (shards {self.committed_shards or 'none'}); "
                    f"to go on, append from record {self.committed_records}"
                )

    def __del__(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        if not getattr(self, "_closed", True) and not finalizing():
            self.close(commit=False)
