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
import contextlib
import mmap
import os
import socket
import sys
import uuid
import zlib
from collections import OrderedDict, deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Generic, TypeVar

from guideloom._core.errors import ShardExistsError
from guideloom._shards.files import CommitTarget, LocalTarget
from guideloom._shards.layout import (
    ShardInfo,
    StorageHeader,
    check_shard_id,
    shard_file_name,
    shard_size,
    shard_trailer,
)
from guideloom._shards.loss_masks import MaskBits, loss_mask_array

In = TypeVar("In")
MAX_OPEN_FILES = 64
WRITE_BUFFER = 256 * 1024  # one system call per many small records; larger payloads bypass it
BACKGROUND_CHUNK = 8 * 1024 * 1024


class _Background:
    """The writer's one helper thread: it checksums and flushes to disk what shards have written so far.

    One thread runs the tasks in submission order, so a shard's checksum is extended in order.
    """

    def __init__(self) -> None:
        self._executor: ThreadPoolExecutor | None = None
        self._pid = 0

    def submit(self, task: Callable[[], None]) -> Future[None]:
        if self._executor is None or self._pid != os.getpid():  # a forked child needs its own thread
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="guideloom-writer")
            self._pid = os.getpid()
        return self._executor.submit(task)

    def shutdown(self) -> None:
        if self._executor is not None and self._pid == os.getpid():
            self._executor.shutdown(wait=True, cancel_futures=True)
        self._executor = None


def _file_checksum(path: Path, start: int, stop: int, crc: int, sync: bool) -> int:
    """``crc`` extended over bytes ``[start, stop)`` of the file at ``path`` (read back from the page cache)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        base = start - start % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(descriptor, stop - base, access=mmap.ACCESS_READ, offset=base) as mapping:
            with memoryview(mapping) as whole, whole[start - base :] as view:
                crc = zlib.crc32(view, crc)
        if sync:
            os.fdatasync(descriptor)
        return crc
    finally:
        os.close(descriptor)


class _ShardInProgress:
    """One shard being appended to: its file, record offsets, and the checksum grown in the background.

    Every ``BACKGROUND_CHUNK`` bytes, the helper thread checksums the newly written data and flushes
    it to disk while appends go on, so committing has only the last chunk left to do.
    """

    def __init__(self, shard: int, path: Path, background: _Background, masked: bool = False) -> None:
        self.shard = shard
        self.path = path
        self.file: IO[bytes] | None = open(path, "xb", buffering=WRITE_BUFFER)
        self.offsets: list[int] = [0]
        self.data_size = 0
        self.data_crc = 0  # of the data before ``handed_off``, once ``pending`` is done
        self.handed_off = 0
        self.pending: deque[Future[None]] = deque()
        self.header: StorageHeader | None = None  # the header it was finished under
        self.failure: BaseException | None = None  # a background failure: the shard can never be committed
        self._background = background
        self.mask_bits = MaskBits() if masked else None  # the loss mask of a masked storage's shard
        self.created = False  # whether its file was created (it is never created twice)

    def write(self, payload: memoryview, element_count: int) -> None:
        if self.file is None:
            self.file = self._open_file()
        self.file.write(payload)
        self.data_size += payload.nbytes
        self.offsets.append(self.offsets[-1] + element_count)
        if self.data_size - self.handed_off >= BACKGROUND_CHUNK:
            self.file.flush()
            start, stop = self.handed_off, self.data_size
            self.pending.append(self._background.submit(lambda: self._checksum(start, stop)))
            self.handed_off = stop
            while self.pending and self.pending[0].done():
                self._result_of(self.pending.popleft())  # a failure (a full disk, EIO) surfaces here

    def _open_file(self) -> IO[bytes]:
        """The file in progress, opened to append: created on first use only. A file deleted meanwhile (by
        ``guideloom clean`` given an age shorter than this writer took) fails the shard instead of restarting it."""
        flags = os.O_WRONLY | os.O_APPEND | (0 if self.created else os.O_CREAT)
        try:
            descriptor = os.open(self.path, flags, 0o644)
        except FileNotFoundError:
            raise FileNotFoundError(
                f"shard {self.shard} cannot be committed: its unfinished file {self.path} was deleted while it was "
                "written (by 'guideloom clean' with too short an age?)"
            ) from None
        self.created = True
        return open(descriptor, "ab", buffering=WRITE_BUFFER)

    def _result_of(self, future: Future[None]) -> None:
        try:
            future.result()
        except BaseException as error:
            self.failure = self.failure or error
            raise

    def _checksum(self, start: int, stop: int) -> None:
        self.data_crc = _file_checksum(self.path, start, stop, self.data_crc, sync=True)

    def suspend(self) -> None:
        """Close the file to bound open descriptors; it reopens on the next write."""
        if self.file is not None:
            self.file.close()
            self.file = None

    def finish(self, header: StorageHeader) -> None:
        """Append offsets and footer, then make the file durable."""
        if self.file is None:
            self.file = self._open_file()
        self.file.flush()
        while self.pending:
            with contextlib.suppress(Exception):  # recorded in self.failure, raised just below
                self._result_of(self.pending.popleft())
        if self.failure is not None:  # its checksum misses a chunk: committing it would publish a lie
            raise OSError(
                f"shard {self.shard} cannot be committed: writing it failed earlier ({self.failure})"
            ) from self.failure
        if self.data_size > self.handed_off:
            self.data_crc = _file_checksum(self.path, self.handed_off, self.data_size, self.data_crc, sync=False)
            self.handed_off = self.data_size
        mask = b"" if self.mask_bits is None else self.mask_bits.finish()
        self.data_crc = zlib.crc32(mask, self.data_crc)  # the data checksum covers the mask after the data
        self.header = header
        self.file.write(shard_trailer(self.shard, self.offsets, self.data_size, self.data_crc, header, mask))
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None

    def info(self) -> ShardInfo:
        """The finished shard's counts and checksum, as readers index it."""
        records = len(self.offsets) - 1
        size = shard_size(records, self.data_size, self.header)
        return ShardInfo(self.shard, records, self.offsets[-1], self.data_crc, size)

    def abort(self) -> None:
        for future in self.pending:
            future.cancel()
        self.pending.clear()
        with contextlib.suppress(OSError):
            if self.file is not None:
                self.file.close()
        self.file = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)


class SyncWriter(Generic[In]):
    """Appends samples to shards; leaving the ``with`` block commits them all.

    Leaving by an exception commits nothing of this writer. ``commit(shard)``
    commits one shard early. Several writers may write different shards of
    one storage at once with no coordination.
    """

    def __init__(
        self, target: Path | CommitTarget, header: StorageHeader, encode: Callable[[Any], tuple[memoryview, int]]
    ):
        self._target: CommitTarget = LocalTarget(target) if isinstance(target, Path) else target
        self._header = header
        self._encode = encode
        self._token = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        self._open: OrderedDict[int, _ShardInProgress] = OrderedDict()
        self._committed: set[int] = set()
        self._background = _Background()
        self._last: _ShardInProgress | None = None  # the shard appended to last, while it is open
        self._closed = False

    def append(self, shard: int, data: In, loss_mask: object = None) -> None:
        """Append one sample to ``shard`` (created on first use); a masked token storage's takes its ``loss_mask``."""
        if self._closed:
            raise ValueError("this writer is closed")
        if loss_mask is not None or self._header.loss_mask:
            self._append_masked(shard, data, loss_mask)
            return
        last = self._last
        if last is not None and type(shard) is int and shard == last.shard and last.file is not None:
            payload, element_count = self._encode(data)  # appending to the same shard again: the fast path
            last.write(payload, element_count)
            return
        shard = check_shard_id(shard)
        payload, element_count = self._encode(data)
        self._last = self._shard(shard)
        self._last.write(payload, element_count)

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
        payload, element_count = self._encode(data)
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

    def _shard(self, shard: int) -> _ShardInProgress:
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
        in_progress = _ShardInProgress(shard, temporary, self._background, self._header.loss_mask)
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
        self.close(commit=error is None)

    def __del__(self, finalizing: Callable[[], bool] = sys.is_finalizing) -> None:
        # At interpreter exit modules are torn down; the files left in incomplete/ are leftovers then.
        if not getattr(self, "_closed", True) and not finalizing():
            self.close(commit=False)


class AsyncWriter(Generic[In]):
    """The writer for event loops: the same operations, awaited (file work runs in a thread)."""

    def __init__(self, writer: SyncWriter[In]) -> None:
        self._writer = writer

    async def append(self, shard: int, data: In, loss_mask: object = None) -> None:
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
