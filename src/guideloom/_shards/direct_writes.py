"""A shard's data written past the page cache, for writers that write gigabytes once (an import).

Written through the page cache, every byte is copied into a fresh cached page and later read back to be
checksummed: the kernel's copy is most of the CPU a bulk write costs, and the cache fills with data nobody reads
soon. Here the data is copied into page-aligned buffers of :data:`STAGE_BYTES`; the writer's background thread
checksums each full buffer while it is hot and writes it with ``O_DIRECT``, as the next one fills. The last,
partial buffer goes through the page cache when the shard is finished, with the trailer, then the file is synced.
A file system that refuses ``O_DIRECT`` (tmpfs, some FUSE mounts) gets the same writes through the page cache.
"""

from __future__ import annotations

import errno
import mmap
import os
import queue
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path
from typing import Protocol

STAGE_BYTES = 8 * 1024 * 1024  # a multiple of every block size O_DIRECT asks of offsets and lengths
STAGES = 4  # one filled while the others are written: a slow write now and then does not stall the filling
DIRECT = getattr(os, "O_DIRECT", 0)  # 0 where the system has none: writes then go through the page cache


class Submitter(Protocol):
    def submit(self, task: Callable[[], None]) -> Future[None]: ...


class StagedWrites:
    """The data of one shard in progress, staged and written whole buffers at a time (see the module's docstring).

    ``checksum(view, start)`` extends the shard's checksum over ``view``, the data from offset ``start``; it runs
    in the background thread, in the data's order, before the buffer is written. Failures surface through the
    futures in ``pending``, which the shard in progress waits for.
    """

    def __init__(self, path: Path, background: Submitter, checksum: Callable[[memoryview, int], None]) -> None:
        self.path = path
        self._background = background
        self._checksum = checksum
        self._free: queue.SimpleQueue[mmap.mmap] = queue.SimpleQueue()  # buffers written, to fill again
        self._buffers = 0  # made so far, up to STAGES
        self._stage: mmap.mmap | None = None
        self._filled = 0  # bytes in the stage
        self.written = 0  # data bytes handed to the background thread: the stage's offset in the file
        self.pending: deque[Future[None]] = deque()
        self._direct = DIRECT != 0
        self._descriptor: int | None = None

    def create(self) -> None:
        """Create the file, exclusively, and open it."""
        self._open(os.O_CREAT | os.O_EXCL)

    def reopen(self) -> None:
        """Open the file again after :meth:`close` (``FileNotFoundError`` if it was deleted meanwhile)."""
        self._open(0)

    def _open(self, creating: int) -> None:
        flags = os.O_WRONLY | creating
        if self._direct:
            try:
                self._descriptor = os.open(self.path, flags | DIRECT, 0o644)
                return
            except OSError as error:
                if error.errno != errno.EINVAL:
                    raise
                self._direct = False  # a file system without O_DIRECT
                if creating and self.path.exists():
                    flags &= ~os.O_EXCL  # the refusal may come after the file was created (a name of this writer's)
        self._descriptor = os.open(self.path, flags, 0o644)

    def close(self) -> None:
        """Close the file once the writes handed off are done; what is staged stays staged."""
        wait(self.pending)  # a failed or cancelled one is seen by whoever waits for it
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None

    def write(self, payload: memoryview) -> None:
        """Stage ``payload``, handing each buffer it fills to the background thread (waiting for a free one)."""
        if payload.format != "B" or payload.ndim != 1:
            payload = payload.cast("B")
        done, size = 0, payload.nbytes
        while done < size:
            if self._stage is None:
                self._stage = self._free_buffer()
            room = min(STAGE_BYTES - self._filled, size - done)
            self._stage[self._filled : self._filled + room] = payload[done : done + room]
            self._filled += room
            done += room
            if self._filled == STAGE_BYTES:
                self._hand_off()

    def _free_buffer(self) -> mmap.mmap:
        """A buffer to fill: a new one while fewer than STAGES exist, else the next one written."""
        if self._buffers < STAGES and self._free.empty():
            self._buffers += 1
            return mmap.mmap(-1, STAGE_BYTES)
        return self._free.get()

    def _hand_off(self) -> None:
        stage, start = self._stage, self.written
        assert stage is not None and self._descriptor is not None
        self._stage, self._filled = None, 0
        self.written += STAGE_BYTES
        self.pending.append(self._background.submit(lambda: self._write_stage(stage, start)))

    def _write_stage(self, stage: mmap.mmap, start: int) -> None:
        """In the background thread: checksum a full buffer, write it at ``start``, free it. The file stays open
        meanwhile: :meth:`close` waits for these writes."""
        try:
            with memoryview(stage) as view:
                self._checksum(view, start)
                assert self._descriptor is not None
                try:
                    self._write_at(self._descriptor, view, start)
                except OSError as error:
                    if error.errno != errno.EINVAL or not self._direct:
                        raise
                    # A file system that took O_DIRECT at open but refuses its writes: through the cache from now
                    self._direct = False
                    os.close(self._descriptor)
                    self._descriptor = os.open(self.path, os.O_WRONLY)
                    self._write_at(self._descriptor, view, start)
        finally:
            self._free.put(stage)

    @staticmethod
    def _write_at(descriptor: int, view: memoryview, start: int) -> None:
        done = 0
        while done < len(view):
            # released even when the write fails: a failure's traceback must not keep the buffer from being closed
            with view[done:] as rest:
                done += os.pwrite(descriptor, rest, start + done)

    def checksum_staged(self) -> None:
        """Extend the checksum over what is staged and not yet handed off: the shard's last bytes, once complete."""
        if self._stage is not None:
            with memoryview(self._stage) as whole, whole[: self._filled] as staged:
                self._checksum(staged, self.written)

    def finish(self, trailer: bytes, sync: Callable[[int], None]) -> None:
        """Write what is staged, then ``trailer``, through the page cache; ``sync(descriptor)`` the file; free the
        buffers. The background writes must be done."""
        self.close()
        with open(self.path, "r+b", buffering=0) as file:
            if self._stage is not None:
                with memoryview(self._stage) as whole, whole[: self._filled] as staged:
                    self._write_at(file.fileno(), staged, self.written)
            self._write_at(file.fileno(), memoryview(trailer), self.written + self._filled)
            sync(file.fileno())
        self.release()

    def release(self) -> None:
        """Close the file and free the buffers not in use (the shard is finished or aborted); a buffer still being
        written, or held by a cancelled write, is freed with it."""
        self.close()
        if self._stage is not None:
            self._stage.close()
            self._stage = None
        while True:
            try:
                self._free.get_nowait().close()
            except queue.Empty:
                break
