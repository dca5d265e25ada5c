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

import numpy as np

from guideloom._core.errors import ShardExistsError
from guideloom._shards.footer import shard_footer
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo, shard_size, shard_trailer
from guideloom._shards.local_shards import LocalTarget
from guideloom._shards.loss_masks import MaskBits, loss_mask_array
from guideloom._shards.record_encoder import RecordEncoder
from guideloom._shards.record_lengths import checked_length, lengths_bytes
from guideloom._shards.shard_access import CommitTarget
from guideloom._shards.shard_names import check_shard_id, shard_file_name

In = TypeVar("In")
MAX_OPEN_FILES = 64
WRITE_BUFFER = 256 * 1024  # one system call per many small records; larger payloads bypass it
BACKGROUND_CHUNK = 8 * 1024 * 1024


class Background:
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


class ShardInProgress:
    """One shard being appended to: its file, record offsets (and lengths), and the checksum grown in the
    background.

    Every ``BACKGROUND_CHUNK`` bytes, the helper thread checksums the newly written data and flushes
    it to disk while appends go on, so committing has only the last chunk left to do.
    """

    def __init__(
        self, shard: int, path: Path, background: Background, masked: bool = False, measured: bool = False
    ) -> None:
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
        self.lengths: list[int] | None = [] if measured else None  # of a storage that records lengths

    @property
    def record_count(self) -> int:
        return len(self.offsets) - 1

    def write(self, payload: memoryview, element_count: int, length: int | None = None) -> None:
        if self.file is None:
            self.file = self._open_file()
        self.file.write(payload)
        self.data_size += payload.nbytes
        self.offsets.append(self.offsets[-1] + element_count)
        if self.lengths is not None:
            assert length is not None
            self.lengths.append(length)
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
        lengths = b"" if self.lengths is None else lengths_bytes(self.lengths)
        self.data_crc = zlib.crc32(mask, zlib.crc32(lengths, self.data_crc))  # it covers them after the data
        self.header = header
        trailer = shard_trailer(self.shard, self.offsets, self.data_size, self.data_crc, header, mask, lengths)
        self.file.write(trailer)
        self.file.flush()
        os.fsync(self.file.fileno())
        self.file.close()
        self.file = None

    def relabel(self, shard: int) -> None:
        """Make the finished file that of shard ``shard``: only its footer names the id, so only that is rewritten."""
        assert self.header is not None, "relabel a finished shard only"
        index_crc = zlib.crc32(np.asarray(self.offsets, dtype="<u8").tobytes())
        footer = shard_footer(shard, self.record_count, self.data_size, self.data_crc, index_crc, self.header)
        with open(self.path, "r+b") as file:
            file.seek(-len(footer), os.SEEK_END)
            file.write(footer)
            file.flush()
            os.fsync(file.fileno())
        self.shard = shard

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
    ):
        self._target: CommitTarget = LocalTarget(target) if isinstance(target, Path) else target
        self._header = header
        self._encode = RecordEncoder(encode, measure)
        self._on_commit = on_commit
        self._token = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:12]}"
        self._open: OrderedDict[int, ShardInProgress] = OrderedDict()
        self._committed: set[int] = set()
        self._background = Background()
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
        header = self._header
        in_progress = ShardInProgress(shard, temporary, self._background, header.loss_mask, header.record_lengths)
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
