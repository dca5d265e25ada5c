"""One shard being written: its file in ``incomplete/``, record offsets (and lengths, a loss mask), and the
checksum and checkpoints a background thread grows as the data is written; finished with its trailer and made
durable.

A writer (``SyncWriter``, ``RollingWriter``) keeps one per open shard and hands the finished file to
its commit target; relabelling rewrites only the footer, the one place that names the shard's id.
"""

from __future__ import annotations

import contextlib
import mmap
import os
import zlib
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import IO

import numpy as np

from guideloom._core.checksums import crc32
from guideloom._shards.checkpoints import closing_checkpoints, running_checkpoints
from guideloom._shards.direct_writes import StagedWrites
from guideloom._shards.field_columns import ColumnsInProgress, ColumnSplitter
from guideloom._shards.footer import shard_footer
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardInfo, shard_size, shard_trailer
from guideloom._shards.loss_masks import MaskBits
from guideloom._shards.record_lengths import lengths_bytes

# One system call per many small records (larger payloads bypass it). Written in pieces this large, a shard is
# held by the page cache in large folios, so a reader that maps it takes one page fault per 2 MiB read where
# pieces of 256 KiB cost it 8 (docs/performance.md, "The loader's own cost").
WRITE_BUFFER = 2 * 1024 * 1024
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


class UnflushedShard(OSError):
    """A shard's file could not be flushed to disk (an EIO of NFS or a failing disk): the shard is not committed. Its
    message names shard and file, and its ``errno`` is the flush's."""


def _sync_shard_file(descriptor: int, shard: int, path: Path, data_only: bool = False) -> None:
    """Flush the file of shard ``shard`` to disk (its data alone with ``data_only``); a failure is `UnflushedShard`."""
    try:
        (os.fdatasync if data_only else os.fsync)(descriptor)
    except OSError as error:
        raise UnflushedShard(
            error.errno,
            f"shard {shard} cannot be committed: fsync of its file {path} failed ({error.strerror or error}), so its "
            "data may not be on disk; the shard is not committed",
            str(path),
        ) from error


def _view_checksum(view: memoryview, start: int, crc: int, checkpoint_bytes: int | None, checkpoints: list[int]) -> int:
    """``crc`` extended over ``view``, the data from offset ``start``; with ``checkpoint_bytes``, the running CRC-32
    at every multiple of it in the range is appended to ``checkpoints``."""
    if checkpoint_bytes is None:
        return crc32(view, crc)
    found, crc = running_checkpoints(view, checkpoint_bytes, crc, start)
    checkpoints += found
    return crc


def _file_checksum(
    path: Path,
    start: int,
    stop: int,
    crc: int,
    sync: bool,
    checkpoint_bytes: int | None,
    checkpoints: list[int],
    shard: int,
) -> int:
    """``crc`` extended over bytes ``[start, stop)`` of the file at ``path`` (read back from the page cache), as
    :func:`_view_checksum`; with ``sync``, those bytes are flushed to disk (``shard`` names the file's shard if that
    fails)."""
    descriptor = os.open(path, os.O_RDONLY)
    try:
        base = start - start % mmap.ALLOCATIONGRANULARITY
        with mmap.mmap(descriptor, stop - base, access=mmap.ACCESS_READ, offset=base) as mapping:
            with memoryview(mapping) as whole, whole[start - base :] as view:
                crc = _view_checksum(view, start, crc, checkpoint_bytes, checkpoints)
        if sync:
            _sync_shard_file(descriptor, shard, path, data_only=True)
        return crc
    finally:
        os.close(descriptor)


class ShardInProgress:
    """One shard being appended to: its file, record offsets (and lengths), and the checksum grown in the
    background.

    Every ``BACKGROUND_CHUNK`` bytes, the helper thread checksums the newly written data and flushes
    it to disk while appends go on, so committing has only the last chunk left to do. With ``direct``, the data
    goes past the page cache instead (:class:`StagedWrites`): the helper thread checksums and writes each staged
    buffer, and the file is synced once, when finished.
    """

    def __init__(
        self,
        shard: int,
        path: Path,
        background: Background,
        masked: bool = False,
        measured: bool = False,
        checkpoint_bytes: int | None = None,
        columns: tuple[ColumnSplitter, int] | None = None,
        direct: bool = False,
    ) -> None:
        self.shard = shard
        self.path = path
        self.staged: StagedWrites | None = None
        self.file: IO[bytes] | StagedWrites | None
        if direct:
            self.staged = StagedWrites(path, background, self._extend_checksum)
            self.staged.create()
            self.file = self.staged
        else:
            self.file = open(path, "xb", buffering=WRITE_BUFFER)
        self.offsets: list[int] = [0]
        self.data_size = 0
        self.data_crc = 0  # of the data before ``handed_off``, once ``pending`` is done
        self.handed_off = 0
        self.pending: deque[Future[None]] = deque() if self.staged is None else self.staged.pending
        self.header: StorageHeader | None = None  # the header it was finished under
        self.failure: BaseException | None = None  # a background failure: the shard can never be committed
        self._background = background
        self.mask_bits = MaskBits() if masked else None  # the loss mask of a masked storage's shard
        self.created = False  # whether its file was created (it is never created twice)
        self.lengths: list[int] | None = [] if measured else None  # of a storage that records lengths
        self.checkpoint_bytes = checkpoint_bytes  # of a storage whose shards hold checkpoints, else None
        self.checkpoints: list[int] = []  # of the data before ``handed_off``, as ``data_crc``
        # The field columns of a storage whose header names them (how to split a record, and how many), else None.
        self.columns = None if columns is None else ColumnsInProgress(*columns)
        self.columns_size = 0  # their bytes in the finished file

    @classmethod
    def under(
        cls,
        header: StorageHeader,
        shard: int,
        path: Path,
        background: Background,
        columns: tuple[ColumnSplitter, int] | None,
        direct: bool = False,
    ) -> ShardInProgress:
        """A shard of a storage with ``header``: its loss mask, record lengths and checkpoints as the header says,
        and its field ``columns`` (how to split a record, and how many) where the header names them."""
        masked, measured, checkpoint_bytes = header.loss_mask, header.record_lengths, header.checkpoint_bytes
        return cls(shard, path, background, masked, measured, checkpoint_bytes, columns, direct)

    @property
    def record_count(self) -> int:
        return len(self.offsets) - 1

    def write(self, payload: memoryview, element_count: int, length: int | None = None) -> None:
        if self.file is None:
            self.file = self._open_file()
        if self.columns is not None:
            self.columns.add(payload)  # first: a record it cannot split is written nowhere
        self.file.write(payload)
        self.data_size += payload.nbytes
        self.offsets.append(self.offsets[-1] + element_count)
        if self.lengths is not None:
            assert length is not None
            self.lengths.append(length)
        self._hand_off()

    def write_many(self, payload: memoryview, sizes: np.ndarray, lengths: np.ndarray | None = None) -> None:
        """Records already encoded, back to back in ``payload``, each ``sizes[i]`` bytes (a document shard's)."""
        if self.file is None:
            self.file = self._open_file()
        if self.columns is not None:  # first: a record it cannot split is written nowhere
            ends = np.cumsum(sizes, dtype=np.int64).tolist()
            for start, stop in zip([0, *ends], ends, strict=False):
                self.columns.add(payload[start:stop])
        self.file.write(payload)
        self.data_size += payload.nbytes
        self.offsets.extend((self.offsets[-1] + np.cumsum(sizes, dtype=np.int64)).tolist())
        if self.lengths is not None:
            assert lengths is not None
            self.lengths.extend(lengths.tolist())
        self._hand_off()

    def _hand_off(self) -> None:
        """Have the background thread checksum and flush what was written since the last hand-off, once a chunk
        (staged writes hand off their buffers themselves: only their outcomes are looked at)."""
        file = self.file
        if isinstance(file, StagedWrites):
            if file.written == self.handed_off:
                return
            self.handed_off = file.written
        elif self.data_size - self.handed_off >= BACKGROUND_CHUNK:
            assert file is not None
            file.flush()
            start, stop = self.handed_off, self.data_size
            self.pending.append(self._background.submit(lambda: self._checksum(start, stop)))
            self.handed_off = stop
        else:
            return
        while self.pending and self.pending[0].done():
            self._result_of(self.pending.popleft())  # a failure (a full disk, EIO) surfaces here

    def _open_file(self) -> IO[bytes] | StagedWrites:
        """The file in progress, opened to append: created on first use only. A file deleted meanwhile (by
        ``guideloom clean`` given an age shorter than this writer took) fails the shard instead of restarting it."""
        flags = os.O_WRONLY | os.O_APPEND | (0 if self.created else os.O_CREAT)
        try:
            if self.staged is not None:
                self.staged.reopen()
                return self.staged
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

    def _extend_checksum(self, view: memoryview, start: int) -> None:
        """Extend the data checksum and the checkpoints over ``view``, the data from offset ``start``."""
        self.data_crc = _view_checksum(view, start, self.data_crc, self.checkpoint_bytes, self.checkpoints)

    def _checksum(self, start: int, stop: int, sync: bool = True) -> None:
        """Extend the data checksum and the checkpoints over data bytes ``[start, stop)``, flushing them if ``sync``."""
        checkpoints, checkpoint_bytes = self.checkpoints, self.checkpoint_bytes
        self.data_crc = _file_checksum(
            self.path, start, stop, self.data_crc, sync, checkpoint_bytes, checkpoints, self.shard
        )

    def suspend(self) -> None:
        """Close the file to bound open descriptors; it reopens on the next write."""
        if self.file is not None:
            self.file.close()
            self.file = None

    def finish(self, header: StorageHeader) -> None:
        """Append offsets and footer, then make the file durable."""
        file = self.file = self._open_file() if self.file is None else self.file
        if not isinstance(file, StagedWrites):
            file.flush()
        while self.pending:
            with contextlib.suppress(Exception):  # recorded in self.failure, raised just below
                self._result_of(self.pending.popleft())
        if isinstance(self.failure, UnflushedShard):  # a chunk's flush in the background: said as at a commit
            raise self.failure
        if self.failure is not None:  # its checksum misses a chunk: committing it would publish a lie
            raise OSError(
                f"shard {self.shard} cannot be committed: writing it failed earlier ({self.failure})"
            ) from self.failure
        if isinstance(file, StagedWrites):
            file.checksum_staged()
            self.handed_off = self.data_size
        elif self.data_size > self.handed_off:
            self._checksum(self.handed_off, self.data_size, sync=False)
            self.handed_off = self.data_size
        if self.checkpoint_bytes is not None:
            self.checkpoints += closing_checkpoints(self.data_size, self.checkpoint_bytes, self.data_crc)
        mask = b"" if self.mask_bits is None else self.mask_bits.finish()
        lengths = b"" if self.lengths is None else lengths_bytes(self.lengths)
        self.data_crc = zlib.crc32(mask, zlib.crc32(lengths, self.data_crc))  # it covers them after the data
        self.header = header
        columns = b"" if self.columns is None else self.columns.finish()
        self.columns_size = len(columns)
        trailer = shard_trailer(
            self.shard, self.offsets, self.data_size, self.data_crc, header, mask, lengths, self.checkpoints, columns
        )
        if isinstance(file, StagedWrites):
            file.finish(trailer, lambda descriptor: _sync_shard_file(descriptor, self.shard, self.path))
        else:
            file.write(trailer)
            file.flush()
            _sync_shard_file(file.fileno(), self.shard, self.path)
            file.close()
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
            _sync_shard_file(file.fileno(), shard, self.path)
        self.shard = shard

    def info(self) -> ShardInfo:
        """The finished shard's counts and checksum, as readers index it."""
        records = len(self.offsets) - 1
        size = shard_size(records, self.data_size, self.header, self.columns_size)
        return ShardInfo(self.shard, records, self.offsets[-1], self.data_crc, size)

    def abort(self) -> None:
        for future in self.pending:
            future.cancel()
        with contextlib.suppress(OSError):
            if self.staged is not None:
                self.staged.release()  # once the write under way, if any, is done: it uses the file
            elif self.file is not None:
                self.file.close()
        self.pending.clear()
        self.file = None
        with contextlib.suppress(FileNotFoundError):
            os.unlink(self.path)
