"""The local shard cache of remote storages: whole shards (or parts of them), verified, shared by every process of
a machine.

A cached shard is ``<dir>/<id>.<data crc>.<size>.shard`` (the name changes if the remote shard is
replaced, so a stale copy is never served); a part of one adds what it holds before ``.shard`` (see
``_remote.shard_parts``) and counts as the blocks it holds. Downloads go to a unique ``.part`` file, are verified,
then renamed into place, under an exclusive ``flock`` on ``<dir>/locks/<name>.lock``: one download in
flight per shard however many ranks and workers ask. The downloading process holds a shared ``flock`` on
its ``.part`` file (`writing`), so ``clean`` beside live loaders removes only the ``.part`` files of
processes that died. A reader holds a shared ``flock`` on the cached
file while it maps it; eviction (least recently used first, by modification time, which every use
touches) takes a non-blocking exclusive lock, so a shard being read is never evicted. A prefetch holds
the shared lock too, from its download until its reader has it: a shard fetched ahead is never evicted
unread, and a prefetch downloads only what fits next to the shards held.

Counted for the storage's ``location`` (``_core.metrics``): a reader's acquisition found cached is a hit, each
download a miss (made for a reader or ahead of one), each entry deleted to make room an eviction.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

from guideloom._core.checks import check_path
from guideloom._core.errors import CorruptStorageError
from guideloom._core.metrics import count
from guideloom._remote.compression import DamagedDownload
from guideloom._shards.layout import ShardInfo

DOWNLOAD_ATTEMPTS = 3


# A part of a shard (see _remote.shard_parts), or some of its field columns (_remote.remote_columns).
PART_NAME = re.compile(r".*\.(?:[er][0-9]+-[0-9]+|c[0-9a-f]+)\.shard")


def held_bytes(name: str, status: os.stat_result) -> int:
    """The bytes an entry holds: a whole shard's size, or the blocks of a part of one (a sparse file as large as
    the shard, only its pieces and tail written; a file of some field columns holds its size in blocks)."""
    if PART_NAME.fullmatch(name) is None:
        return status.st_size
    return min(status.st_size, status.st_blocks * 512)


class CacheEntry(NamedTuple):
    """What the cache holds under one name: a whole shard (`ShardCache.entry_for`), or a part of one."""

    name: str
    size: int  # the room its download makes in the cache (a whole shard's size; a part holds less)
    shard: int  # the shard id, to name it in errors


def check_cache_arguments(cache_dir: object, cache_limit_bytes: object) -> tuple[Path | None, int | None]:
    """Validate the storages' ``cache_dir`` and ``cache_limit_bytes`` arguments."""
    cache_path = None if cache_dir is None else check_path("cache_dir", cache_dir)
    if cache_limit_bytes is not None:
        if isinstance(cache_limit_bytes, bool) or not isinstance(cache_limit_bytes, int):
            raise TypeError(f"cache_limit_bytes must be an int or None, got {type(cache_limit_bytes).__name__}")
        if cache_limit_bytes < 1:
            raise ValueError(f"cache_limit_bytes must be positive, got {cache_limit_bytes}")
    return cache_path, cache_limit_bytes


UNREAD_AHEAD_NS = 600 * 10**9  # a prefetched download's modification time lies this far ahead: see Prefetched


class CacheLease:
    """A cached shard held for reading: the shared lock lives as long as this descriptor."""

    def __init__(self, path: Path, descriptor: int) -> None:
        self.path = path
        self._descriptor: int | None = descriptor
        self.taken_ns = time.time_ns()

    def release(self) -> None:
        if self._descriptor is not None:
            os.close(self._descriptor)
            self._descriptor = None


@dataclass(frozen=True)
class Prefetched:
    """A shard held for a reader that has not asked for it yet.

    A download made for a prefetch gets a modification time a little ahead, which it keeps until a reader
    acquires it (every acquisition sets the time to now): so a time that changed, or is not ahead, says that
    some process has read the shard; and, released unread (a loader closed mid-epoch), it is the last
    evicted, as the shard that a resumed epoch needs first. Ten minutes ahead, so that it still is when the
    resumed run starts a while later (a shard prefetched a chunk ahead was downloaded seconds before the close).
    """

    lease: CacheLease
    mtime_ns: int  # when the prefetch took it

    @classmethod
    def of(cls, path: Path, descriptor: int) -> Prefetched:
        return cls(CacheLease(path, descriptor), os.fstat(descriptor).st_mtime_ns)

    def read(self) -> bool:
        """Whether a reader has acquired the shard: since its download for this prefetch, or before, when the
        prefetch found it cached with a time not ahead (a reader's download, or one a reader is mapping)."""
        if self.mtime_ns <= self.lease.taken_ns:
            return True
        try:
            return os.stat(self.lease.path).st_mtime_ns != self.mtime_ns
        except FileNotFoundError:
            return True


_used_lock = threading.Lock()
_last_used_ns = 0


def mark_used(descriptor: int) -> None:
    """Set the shard's modification time to now, to the nanosecond, later than any this process set before: the
    order of use that eviction follows. (The file system's own clock may tick only every few milliseconds, and
    shards used within one tick would be evicted in no particular order, a shard still needed among them.)"""
    global _last_used_ns
    with _used_lock:
        now = _last_used_ns = max(time.time_ns(), _last_used_ns + 1)
    with contextlib.suppress(OSError):
        os.utime(descriptor, ns=(now, now))


def _locked(path: Path, flags: int) -> int | None:
    """A descriptor of ``path`` locked with ``flags`` while ``path`` still names it; None if it is gone."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None
    try:
        fcntl.flock(descriptor, flags)
        if os.fstat(descriptor).st_ino != os.stat(path).st_ino:  # evicted (and maybe replaced) meanwhile
            raise FileNotFoundError(path)
    except (FileNotFoundError, BlockingIOError):
        os.close(descriptor)
        return None
    except BaseException:
        os.close(descriptor)
        raise
    return descriptor


@contextlib.contextmanager
def writing(path: Path) -> Iterator[None]:
    """Create ``path`` (empty) and hold a shared lock on it while it is written: `clean_part_files` leaves a file
    so held alone, whatever its age. The writer rewrites the same file in place, or renames it into place."""
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        fcntl.flock(descriptor, fcntl.LOCK_SH)
        yield
    finally:
        os.close(descriptor)


def clean_part_files(directory: Path, older_than: float) -> list[Path]:
    """Delete the ``.part`` files in ``directory`` that dead processes left: untouched for ``older_than`` seconds
    and not held by a live writer (see `writing`)."""
    removed = []
    now = time.time()
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if not entry.name.endswith(".part"):
                continue
            with contextlib.suppress(FileNotFoundError):
                if now - entry.stat(follow_symlinks=False).st_mtime < older_than:
                    continue
            descriptor = _locked(Path(entry.path), fcntl.LOCK_EX | fcntl.LOCK_NB)
            if descriptor is None:
                continue  # being written (or gone already)
            try:
                os.unlink(entry.path)
                removed.append(Path(entry.path))
            except FileNotFoundError:
                pass
            finally:
                os.close(descriptor)
    return removed


@contextlib.contextmanager
def exclusive_lock(directory: Path, name: str) -> Iterator[None]:
    """Hold ``<directory>/locks/<name>.lock`` exclusively: one process of the machine at a time does what it guards."""
    locks = directory / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    lock = os.open(locks / f"{name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield
    finally:
        os.close(lock)


class ShardCache:
    """Cached shards of one storage in ``directory``, kept under ``limit_bytes`` when that is set; its use is
    counted for the storage at ``location``."""

    def __init__(self, directory: Path, limit_bytes: int | None, location: str = "") -> None:
        self.directory = directory
        self.limit_bytes = limit_bytes
        self.location = location
        self._token = f"{socket.gethostname()}.{os.getpid()}.{uuid.uuid4().hex[:8]}"

    @staticmethod
    def name_for(info: ShardInfo) -> str:
        return f"{info.id:012d}.{info.data_crc:08x}.{info.size}.shard"

    @classmethod
    def entry_for(cls, info: ShardInfo) -> CacheEntry:
        """The entry of the whole shard."""
        return CacheEntry(cls.name_for(info), info.size, info.id)

    def hold(self, entry: CacheEntry) -> CacheLease | None:
        """The cached entry held for reading if it is in the cache (nothing is downloaded), else None."""
        final = self.directory / entry.name
        descriptor = _locked(final, fcntl.LOCK_SH)
        return None if descriptor is None else CacheLease(final, descriptor)

    def acquire(
        self,
        entry: CacheEntry,
        download: Callable[[Path], None],
        check: Callable[[Path], str | None],
    ) -> CacheLease:
        """The cached shard, downloaded first if needed, held until the lease is released.

        ``download(path)`` writes the shard's object to ``path``; ``check(path)`` returns the problem
        found in a downloaded copy (or None). A copy that fails the check is downloaded again, up to
        DOWNLOAD_ATTEMPTS times, then CorruptStorageError names the shard.
        """
        final = self.directory / entry.name
        while True:
            descriptor = _locked(final, fcntl.LOCK_SH)
            if descriptor is not None:
                count("cache_hits", 1, self.location)
            else:
                descriptor = self._fetch(entry, download, check, None)[1]
            if descriptor is not None:
                mark_used(descriptor)
                return CacheLease(final, descriptor)

    def prefetch(
        self,
        entry: CacheEntry,
        download: Callable[[Path], None],
        check: Callable[[Path], str | None],
        keep: Collection[str] = (),
    ) -> Prefetched | None:
        """The shard held ahead of its reader, downloaded first if it fits the limit next to the shards held and
        those named in ``keep`` (needed soon); None when it does not fit now. A download is marked unread (see
        `Prefetched`)."""
        final = self.directory / entry.name
        while True:
            descriptor = _locked(final, fcntl.LOCK_SH)
            if descriptor is None:
                cached, descriptor = self._fetch(entry, download, check, keep)
                if not cached:
                    return None
            if descriptor is not None:
                return Prefetched.of(final, descriptor)

    def fetch(self, entry: CacheEntry, download: Callable[[Path], None], check: Callable[[Path], str | None]) -> None:
        """Make sure the entry is cached (one process downloads it, the others wait for it)."""
        descriptor = self._fetch(entry, download, check, None)[1]
        if descriptor is not None:
            os.close(descriptor)

    def _fetch(
        self,
        entry: CacheEntry,
        download: Callable[[Path], None],
        check: Callable[[Path], str | None],
        keep: Collection[str] | None,
    ) -> tuple[bool, int | None]:
        """Whether the shard is cached now (False only for a prefetch, ``keep`` given, that does not fit), and a
        descriptor holding it when this call downloaded it: held from before it appears, so that no eviction
        takes it before its reader has it."""
        prefetching = keep is not None
        final = self.directory / entry.name
        with exclusive_lock(self.directory, final.name):
            if final.exists():
                return True, None
            if not self.make_room(entry.size, keep or ()) and prefetching:
                return False, None  # a reader asking for it downloads it anyway; a prefetch waits for room
            problem = ""
            count("cache_misses", 1, self.location)
            for _ in range(DOWNLOAD_ATTEMPTS):
                part = self.directory / f"{final.name}.{self._token}.part"
                try:
                    with writing(part):
                        problem, held = self._download(entry, part, final, download, check, prefetching)
                    if held is not None:
                        return True, held
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(part)
            raise CorruptStorageError(
                f"shard {entry.shard} failed its checks {DOWNLOAD_ATTEMPTS} times after download: {problem}"
            )

    def _download(
        self,
        entry: CacheEntry,
        part: Path,
        final: Path,
        download: Callable[[Path], None],
        check: Callable[[Path], str | None],
        prefetching: bool,
    ) -> tuple[str, int | None]:
        """Download ``entry`` to ``part`` and check it; renamed to ``final`` if sound. The problem found (or ""), and
        a descriptor holding the cached file when it is sound."""
        try:
            download(part)
            problem = check(part) or ""
            if problem:
                return problem, None
            held = os.open(part, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                fcntl.flock(held, fcntl.LOCK_SH)
                if prefetching:
                    marked = time.time_ns() + UNREAD_AHEAD_NS
                    os.utime(held, ns=(marked, marked))
                os.rename(part, final)
            except BaseException:
                os.close(held)
                raise
            return "", held
        except DamagedDownload as error:  # an object that cannot be decoded: as a failed check
            return f"shard {entry.shard} cannot be decompressed: {error}", None
        except OSError as error:
            if error.errno == errno.ENOSPC:
                raise OSError(
                    errno.ENOSPC,
                    f"the cache directory {self.directory} is full while downloading shard {entry.shard} "
                    "(free space there, choose another cache_dir, or set cache_limit_bytes)",
                ) from error
            raise

    def cached_bytes(self) -> int:
        return sum(size for _, size, _ in self._entries())

    def held_names(self) -> dict[str, int]:
        """The names of the entries cached (whole shards and parts of them) with the bytes each holds."""
        return {path.name: size for path, size, _ in self._entries()}

    def _entries(self) -> list[tuple[Path, int, int]]:
        entries = []
        try:
            scan = list(os.scandir(self.directory))
        except FileNotFoundError:
            return []
        for entry in scan:
            if entry.name.endswith(".shard"):
                with contextlib.suppress(FileNotFoundError):
                    status = entry.stat(follow_symlinks=False)
                    entries.append((Path(entry.path), held_bytes(entry.name, status), status.st_mtime_ns))
        return entries

    def make_room(self, size: int, keep: Collection[str] = ()) -> bool:
        """Evict least recently used shards nobody holds, but those named in ``keep``, until ``size`` more bytes
        fit the limit; whether they do.

        Shards in use (held by a reader or a prefetch) are never evicted: if they alone exceed the limit,
        the cache exceeds it until they are released.
        """
        if self.limit_bytes is None:
            return True
        entries = sorted(self._entries(), key=lambda entry: entry[2])
        total = sum(entry[1] for entry in entries)
        for path, file_size, _ in entries:
            if total + size <= self.limit_bytes:
                return True
            if path.name in keep:
                continue
            descriptor = _locked(path, fcntl.LOCK_EX | fcntl.LOCK_NB)
            if descriptor is None:
                continue  # held by a reader (or already gone)
            try:
                os.unlink(path)
                total -= file_size
                count("cache_evictions", 1, self.location)
            finally:
                os.close(descriptor)
        return total + size <= self.limit_bytes

    def clean(self, older_than: float) -> list[Path]:
        """Delete downloads of dead processes (``.part`` files untouched for ``older_than`` seconds that no live
        download holds)."""
        return clean_part_files(self.directory, older_than)
