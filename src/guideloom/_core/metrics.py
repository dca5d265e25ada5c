"""Counters of what a process did for its loaders: requests and bytes per storage, retries, cache use, records skipped.

Every process keeps its own counts, keyed by (storage location, counter name): the object store counts each
request and the bytes of the objects it read (``_remote.object_store``), the retries (``_remote.retries``), the
cache its hits, misses and evictions (``_remote.shard_cache``), and decoding the records it skips (`count_skipped`).
A worker process starts from zero (they are reset at a fork) and sends what it counted since it last sent
(`take_unsent`) with each batch; the loader adds that to what its own process counted since the loader was made
(`LoaderMetrics`). Counts are plain integers under one lock: a few hundred a second at most.
"""

from __future__ import annotations

import os
import threading
from collections import Counter

__all__ = ["COUNTERS", "Counts", "LoaderMetrics", "count", "count_skipped", "counts_now", "take_unsent"]

# The counters every loader reports (zero until something happens), in the order they are shown.
COUNTERS = (
    "bytes_downloaded",
    "requests",
    "retries",
    "cache_hits",
    "cache_misses",
    "cache_evictions",
    "skipped_records",
)

Counts = dict[tuple[str, str], int]  # (storage location, counter name) -> count

_lock = threading.Lock()
_counts: Counter[tuple[str, str]] = Counter()
_sent: Counter[tuple[str, str]] = Counter()


def _start_afresh() -> None:
    """A forked process counts only what it does itself (its parent's counts are the parent's)."""
    global _lock, _counts, _sent
    _lock, _counts, _sent = threading.Lock(), Counter(), Counter()


os.register_at_fork(after_in_child=_start_afresh)


def count(name: str, amount: int = 1, location: str = "") -> None:
    """Add ``amount`` to the counter ``name`` of the storage at ``location`` ("" where no storage is known)."""
    if amount:
        with _lock:
            _counts[location, name] += amount


def count_skipped(records: int = 1, location: str = "") -> None:
    """Count records that decoding skipped (``on_decode_error="skip"``): the ``skipped_records`` counter."""
    count("skipped_records", records, location)


def counts_now() -> Counts:
    """This process's counts so far."""
    with _lock:
        return dict(_counts)


def take_unsent() -> Counts:
    """What this process counted since the last call (in a worker process: sent with each batch)."""
    with _lock:
        unsent = {key: value - _sent[key] for key, value in _counts.items() if value != _sent[key]}
        _sent.update(unsent)
    return unsent


class LoaderMetrics:
    """What one loader sees: its own process's counts since it was made, its workers' as they arrive, and the
    seconds its training loop waited for batches."""

    def __init__(self) -> None:
        self._baseline = counts_now()
        self._from_workers: Counter[tuple[str, str]] = Counter()
        self._lock = threading.Lock()
        self.wait_seconds = 0.0

    def add_from_worker(self, counts: Counts) -> None:
        with self._lock:
            self._from_workers.update(counts)

    def waited(self, seconds: float) -> None:
        with self._lock:
            self.wait_seconds += seconds

    def by_storage(self) -> dict[str, dict[str, int]]:
        """The counts of each storage location since the loader was made (all counters, zeros included)."""
        here = counts_now()
        with self._lock:
            totals = Counter(self._from_workers)
        for key, value in here.items():
            totals[key] += value - self._baseline.get(key, 0)
        storages: dict[str, dict[str, int]] = {}
        for (location, name), value in totals.items():
            if value and location:
                storages.setdefault(location, dict.fromkeys(COUNTERS, 0))[name] = value
        return storages

    def totals(self) -> dict[str, int | float]:
        """Every counter summed over the storages, and ``wait_seconds``."""
        here = counts_now()
        with self._lock:
            totals = Counter(self._from_workers)
            wait = self.wait_seconds
        for key, value in here.items():
            totals[key] += value - self._baseline.get(key, 0)
        flat: dict[str, int | float] = dict.fromkeys(COUNTERS, 0)
        for (_, name), value in totals.items():
            flat[name] = flat.get(name, 0) + value
        flat["wait_seconds"] = wait
        return flat
