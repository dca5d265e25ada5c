"""A reader's shards of a remote storage: downloaded when first read, and ahead of that in the order hinted.

The loader hints the shards it is about to read, in order (``prefetch``). RemoteShards keeps that
sequence and keeps the link busy through the whole epoch: whenever a slot frees (a shard released, a
download finished) it starts the next download at once, several at a time, as long as the shards it
holds, those it fetched ahead and those downloading fit the cache limit. A shard fetched ahead stays
held (`shard_cache.Prefetched`) until its reader opens it, so the cache never evicts it unread and no
shard is downloaded twice for want of room; a download that would not fit next to what every process of
the machine holds waits for a slot instead of evicting.

Where worker processes read and the loader's process only hints, the hinting process holds the shards
it fetched until the readers have left them: it learns how far they read from the shards' modification
times (`Prefetched.read`).

A windowed loader also gives, each epoch, the parts of the boundary shards of its machine's share that it
reads (`use_plan`, a `ReadPlan` sent with the work to every process that reads): those are downloaded and
opened as parts (`_remote.shard_parts`, `ShardPart`), unless the whole shard is cached.

A cache limit smaller than the largest shard is refused (ValueError), as Mosaic Streaming refuses one: a reader
holds at least the shard it reads, so such a cache would hold more than its limit whatever it evicted.
"""

from __future__ import annotations

import contextlib
import os
import queue
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from guideloom._remote.remote_columns import RemoteColumns
from guideloom._remote.remote_lengths import RemoteLengths
from guideloom._remote.shard_cache import CacheLease, Prefetched
from guideloom._remote.shard_parts import is_whole, part_entry
from guideloom._shards.field_columns import ShardColumns
from guideloom._shards.header import StorageHeader
from guideloom._shards.layout import ShardFile
from guideloom._shards.parts import NO_PARTS, PlannedPart, ReadPlan, ShardPart
from guideloom._shards.shard_table import ShardTable

if TYPE_CHECKING:
    from guideloom._remote.remote_files import RemoteFiles

PREFETCH_THREADS = 4  # downloads in flight at once, in the order the loader needs the shards
IDLE_CHECK_S = 0.05  # how often idle prefetch threads look for room freed by other processes
CLOSE_WAIT_S = 10.0  # how long closing waits for the downloads in flight


class RemoteShards:
    """A reader's snapshot of a remote storage: shards downloaded on first use, prefetched in the background."""

    mapped_in_place = False  # downloaded into the cache first: prefetching overlaps the downloads

    def __init__(self, files: RemoteFiles, header: StorageHeader, infos: ShardTable, max_open: int) -> None:
        self.files = files
        self.header = header
        self.infos = infos
        self.location = files.url
        limit = files.cache.limit_bytes
        largest = int(infos.rows["size"].max()) if len(infos) else 1
        if limit is not None and limit < largest:
            raise ValueError(
                f"cache_limit_bytes={limit:,} is smaller than the largest shard of {files.url} ({largest:,} bytes): "
                "the cache holds whole shards (or parts of them) while they are read, so it must hold one at least; "
                f"give a cache_limit_bytes of {largest:,} or more (a shuffle_window needs several: "
                "docs/object-storage.md), or write smaller shards"
            )
        # The cache's slots, in shards of the largest size; a reader keeps one free for a shard nobody hinted.
        self._slots: int | None = None if limit is None else max(1, limit // max(largest, 1))
        self.max_open = max_open if self._slots is None else min(max_open, max(1, self._slots - 1))
        self._leases: dict[int, CacheLease] = {}
        self.lengths = RemoteLengths(files.store, header, files.cache, files.directory / "lengths")
        self.columns = RemoteColumns(files.store, header, files.cache)
        self._plan = NO_PARTS  # the parts of shards to read (see use_plan)
        self._start_in_this_process()

    def _start_in_this_process(self) -> None:
        """The prefetch state of a new process (a forked worker starts afresh: its parent's threads are not here)."""
        self._pid = os.getpid()
        self._lock = threading.Condition()
        self._wanted: list[int] = []  # the hinted shard positions, in the order they are needed
        self._where: dict[int, int] = {}  # a wanted position's place in `_wanted`
        self._hinted: dict[int, int] = {}  # when each position was last hinted (a count of hinted positions)
        self._hints = 0
        self._next = 0  # `_wanted` before this place is read, held, fetched ahead or being fetched
        self._done: set[int] = set()  # hinted positions read or fetched ahead since they were hinted
        self._ahead: dict[int, Prefetched] = {}  # fetched ahead, not opened yet
        self._fetching: set[int] = set()  # queued or downloading
        self._blocked = False  # a prefetch found no room: wait for a release
        self._reads_here = False  # whether this process opens shards (else it only hints: worker processes read)
        self._prefetcher: _Prefetcher | None = None

    def _in_this_process(self) -> None:
        if self._pid != os.getpid():
            for prefetched in self._ahead.values():
                prefetched.lease.release()  # this process's copy of the parent's descriptor
            self._start_in_this_process()

    def open(self, position: int, whole: bool = False) -> ShardFile:
        """The shard at ``position``: the part of it the plan names (a `ShardPart`; unless ``whole``, or it is cached
        whole), else all of it."""
        self._in_this_process()
        info = self.infos[position]
        with self._lock:
            first_read, self._reads_here = not self._reads_here, True
        if first_read:  # the slots counted for readers elsewhere are this reader's
            self._top_up()
        with self._lock:
            while position in self._fetching:  # fetched ahead this moment: wait rather than download it too
                self._lock.wait()
        wanted = None if whole else self._wanted_part(position)
        lease = self.files.download_checked(info, self.header, wanted)
        try:
            shard = (
                ShardFile(lease.path.parent, info.id, self.header, file=lease.path)
                if wanted is None
                else ShardPart(lease.path, info.id, self.header, wanted)
            )
        except BaseException:
            lease.release()
            raise
        with self._lock:
            old = self._leases.pop(position, None)
            self._leases[position] = lease
            self._done.add(position)
            prefetched = self._ahead.pop(position, None)
        if old is not None:
            old.release()
        if prefetched is not None:
            prefetched.lease.release()
        return shard

    def use_plan(self, plan: ReadPlan) -> None:
        """Open the shards ``plan`` names as those parts of them from now on, the others whole (in this process: the
        loader sends the plan with the work to every process that reads)."""
        if self.header.readable_in_parts:
            self._plan = plan

    def _wanted_part(self, position: int) -> PlannedPart | None:
        """The part of the shard at ``position`` that the plan names, unless the whole shard is cached."""
        wanted = self._plan.part(position)
        if wanted is None or is_whole(self.infos[position], wanted, self.header):
            return None
        lease = self.files.cache.hold(self.files.cache.entry_for(self.infos[position]))
        if lease is not None:  # cached whole: read there
            lease.release()
            return None
        return wanted

    def record_lengths(self, position: int) -> np.ndarray | None:
        """A shard's record lengths from its object's tail, without its data (None for compressed objects)."""
        return self.lengths.of(self.infos[position]) if 0 <= position < len(self.infos) else None

    def open_columns(self, position: int, fields: frozenset[str]) -> ShardColumns | None:
        """The columns of ``fields`` of the shard at ``position`` by ranged reads (cached), unless the whole shard is
        cached: then the reader opens it."""
        info = self.infos[position]
        if not self.columns.ranged:
            return None
        lease = self.files.cache.hold(self.files.cache.entry_for(info))
        if lease is not None:
            lease.release()
            return None
        return self.columns.open(info, fields)

    def release(self, position: int, shard: ShardFile) -> None:
        shard.close()
        with self._lock:
            lease = self._leases.pop(position, None)
        if lease is not None:
            lease.release()
            self.files.cache.make_room(0)  # what no reader holds any more is evicted as soon as it is over the limit
            self._top_up(unblock=True)

    def prefetch(self, positions: list[int]) -> None:
        """Download these shards in the background, in this order, a few at once, and the rest of them as slots free
        (a hint: failures surface when read). Hints follow each other: each names the shards needed after those
        named before; one named again after it was read and released is needed again."""
        self._in_this_process()
        if self._prefetcher is None:
            self._prefetcher = _Prefetcher(self._prefetch_one, PREFETCH_THREADS, self._top_up)
        with self._lock:
            wanted = self._wanted[self._next :]
            known = set(wanted)
            # A hint may reach past the last shard (packed rows counted as windows): those are no shard's.
            for position in positions:
                if position in known or not 0 <= position < len(self.infos):
                    continue
                if position not in self._leases and position not in self._ahead:
                    self._done.discard(position)
                wanted.append(position)
                known.add(position)
                self._hints += 1
                self._hinted[position] = self._hints
            self._wanted, self._next, self._blocked = wanted, 0, False
            self._where = {position: place for place, position in enumerate(wanted)}
        self._top_up()

    def _top_up(self, unblock: bool = False) -> None:
        """Queue the next hinted shards for as many slots as are free."""
        read: list[Prefetched] = []
        with self._lock:
            if self._prefetcher is None:
                return
            if not self._reads_here:
                read = self._left_by_readers_elsewhere()
            self._blocked = self._blocked and not (unblock or read)
            if self._blocked:
                return
            free = self._free_slots()
            wanted, place = self._wanted, self._next
            while place < len(wanted) and self._accounted(wanted[place]):
                place += 1
            self._next = place
            while free > 0 and place < len(wanted):
                position = wanted[place]
                if not self._accounted(position):
                    self._fetching.add(position)
                    self._prefetcher.submit(position)
                    free -= 1
                place += 1
        for prefetched in read:
            prefetched.lease.release()

    def _left_by_readers_elsewhere(self) -> list[Prefetched]:
        """In a process that only hints, the shards fetched ahead that the readers (worker processes) have left.

        They read the shards in the hinted order, at most ``max_open`` at a time: a shard is left once one
        ``max_open + 1`` places after it has been read (one more than a reader's window: the workers build their
        batches side by side, one a few batches behind another that has read further). Until then this process
        holds it, so that the cache keeps every shard of the readers' window, even one a worker closed for a while.
        """
        entries = sorted(self._ahead.items(), key=lambda entry: self._hinted.get(entry[0], 0))
        last_read = next((place for place in reversed(range(len(entries))) if entries[place][1].read()), -1)
        left = entries[: max(0, last_read - self.max_open)]
        for position, _ in left:
            del self._ahead[position]
        return [prefetched for _, prefetched in left]

    def _settled(self, position: int) -> bool:
        """Read, held or fetched ahead since it was hinted."""
        return position in self._done or position in self._leases or position in self._ahead

    def _accounted(self, position: int) -> bool:
        return self._settled(position) or position in self._fetching

    def _free_slots(self) -> int:
        in_flight = len(self._fetching)
        if self._slots is None:  # no limit: everything hinted, a few at a time
            return 2 * PREFETCH_THREADS - in_flight
        held = len(self._leases)  # (where readers are elsewhere, what they hold is among `_ahead`)
        return min(self._slots - held - len(self._ahead) - in_flight, 2 * PREFETCH_THREADS - in_flight)

    def _prefetch_one(self, position: int) -> None:
        prefetched: Prefetched | None = None
        failed = False
        with self._lock:  # the hinted shards read before this one and not held yet, maybe cached: not evicted for it
            before = self._wanted[: self._where.get(position, 0)]
            before = [at for at in before if not self._settled(at)]
        keep = {self._entry_name(at) for at in before}
        try:
            wanted = self._wanted_part(position)
            prefetched = self.files.prefetch_checked(self.infos[position], self.header, keep, wanted)
        except Exception:
            failed = True  # the reader meets the failure when it reads the shard
        with self._lock:
            self._fetching.discard(position)
            self._lock.notify_all()
            if prefetched is None and not failed:  # no room now: again when a shard is released
                self._blocked = True
                self._next = min(self._next, self._where.get(position, self._next))
            if prefetched is not None:
                # Held until read where the cache may evict it (not if its reader has it already).
                if self._slots is not None and not self._accounted(position):
                    self._ahead[position] = prefetched
                else:
                    prefetched.lease.release()
                self._done.add(position)
        if prefetched is not None or failed:
            self._top_up()

    def _entry_name(self, position: int) -> str:
        """The name of what the cache holds for the shard at ``position``: its part the plan names, or it whole."""
        wanted = self._plan.part(position)
        info = self.infos[position]
        return self.files.cache.name_for(info) if wanted is None else part_entry(info, wanted).name

    def _stopped_one(self, position: int) -> None:
        with self._lock:
            self._fetching.discard(position)
            self._lock.notify_all()

    def close(self) -> None:
        """Release every shard held, once no download can start any more: a download that started after the
        release would make its room by evicting the reader's window, which a run resumed from this cache reads
        first."""
        self._in_this_process()
        with self._lock:
            prefetcher, self._prefetcher = self._prefetcher, None
        if prefetcher is not None:
            prefetcher.skip_queued(self._stopped_one)
        with self._lock:
            leases = [*self._leases.values(), *(prefetched.lease for prefetched in self._ahead.values())]
            self._leases, self._ahead = {}, {}
            self._wanted, self._where, self._next = [], {}, 0
        for lease in leases:
            lease.release()
        if prefetcher is not None:
            prefetcher.stop(self._stopped_one)


class _Prefetcher:
    """Daemon threads that work through queued shard positions in order, and look for room when idle.

    Daemon threads, unlike an executor's, never hold up the interpreter's exit: a loader left open
    when training ends does not wait for the rest of the epoch's downloads (an interrupted download
    leaves a ``.part`` file that ``clean`` removes).
    """

    def __init__(self, work: Callable[[int], None], threads: int, idle: Callable[..., None]) -> None:
        self._work = work
        self._idle = idle
        self._skip: Callable[[int], None] | None = None
        self._queue: queue.SimpleQueue[int | None] = queue.SimpleQueue()
        self._threads = [
            threading.Thread(target=self._run, name="guideloom-prefetch", daemon=True) for _ in range(threads)
        ]
        for thread in self._threads:
            thread.start()

    def submit(self, position: int) -> None:
        self._queue.put(position)

    def _run(self) -> None:
        while True:
            try:
                position = self._queue.get(timeout=IDLE_CHECK_S)
            except queue.Empty:
                if self._skip is None:
                    with contextlib.suppress(Exception):
                        self._idle(unblock=True)
                continue
            if position is None:
                return
            if self._skip is None:
                self._work(position)
            else:
                self._skip(position)

    def skip_queued(self, skip: Callable[[int], None]) -> None:
        """From now on skip what is queued (``skip`` hears of each) instead of downloading it."""
        self._skip = skip

    def stop(self, skip: Callable[[int], None]) -> None:
        """Skip what is queued (``skip`` hears of each), and let the downloads in flight finish: a run resumed from
        this cache finds them there. A download that takes longer than CLOSE_WAIT_S goes on in the background."""
        self._skip = skip
        for _ in self._threads:
            self._queue.put(None)
        deadline = time.monotonic() + CLOSE_WAIT_S
        for thread in self._threads:
            if thread is not threading.current_thread():
                thread.join(max(0.0, deadline - time.monotonic()))
