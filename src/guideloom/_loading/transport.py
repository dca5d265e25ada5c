"""The batch transport: how batches are built from index arrays and reach the device.

One of three engines, chosen once per loader by :func:`make_transport`:

- inline: in the loader's own thread (``num_workers=0``);
- one background thread building groups of batches ahead, when a source's samples are plain copies
  and no user code runs (token windows with the default collate);
- torch worker processes (``num_workers`` > 0), each batch's small arrays sent back through the pipe,
  its large ones through shared memory (``worker_wire``).

Every engine yields the batches in the order of the index arrays it is given, moved to the device
(through pinned memory on CUDA), so which engine runs never changes what a batch holds. The epoch's read
plan (the parts of shards its machine reads, `_shards.parts.ReadPlan`) travels with the work: worker
processes receive it with every batch's indices. A worker process sends back with each batch what it counted
since its last one (``_core.metrics``: requests, bytes, cache use), which the loader's metrics take off; the
batch itself arrives unchanged.
"""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import islice
from typing import Any, NamedTuple, Protocol

import numpy as np
import torch
import torch.utils.data

from guideloom._core.metrics import Counts, take_unsent
from guideloom._loading.devices import map_tensors, move_to_device
from guideloom._loading.worker_deaths import WorkerReports
from guideloom._loading.worker_wire import WorkerError, from_wire, is_sent_leaf, is_wire, to_wire
from guideloom._shards.mapped_shards import check_mapped
from guideloom._shards.parts import NO_PARTS, ReadPlan
from guideloom._sources.source import PinnedShards, SampleSource

PARENT_CHECK_S = 0.5  # how often a worker process checks that the training process lives
THREAD_GROUP = 16  # batches built together, up to GROUP_BYTES of samples
GROUP_BYTES = 8 * 1024 * 1024


class Batcher:
    """Turns a batch's sample indices into the collated batch; what worker processes run."""

    def __init__(self, source: SampleSource, collate: Callable[[Any], Any] | None) -> None:
        self.source = source
        self.collate = collate

    def use_plan(self, plan: ReadPlan) -> None:
        """Read the parts of shards that ``plan`` names from now on (a source that reads shards in parts)."""
        if isinstance(self.source, PinnedShards):
            self.source.use_plan(plan)

    @property
    def builds_groups(self) -> bool:
        """Whether ``many`` fetches several batches in one go: samples that are plain copies, default collate.

        Only then, since no user code runs: building a group again one batch at a time is harmless.
        """
        return self.collate is None and self.source.sample_bytes > 0

    def many(self, index_batches: list[np.ndarray], epoch: int) -> list[Any]:
        """The batches of several index arrays, in order; fetched in one go when ``builds_groups``.

        Batches of token windows are then views into one array (it is freed when all are).
        """
        if self.builds_groups and len(index_batches) > 1:
            samples = self.source.fetch(np.concatenate(index_batches), epoch)
            batch = self.source.default_collate(samples)
            return self.source.split_collated(batch, [len(indices) for indices in index_batches])
        return [self(indices, epoch) for indices in index_batches]

    def __call__(self, indices: np.ndarray, epoch: int) -> Any:
        samples = self.source.fetch(np.asarray(indices, np.int64), epoch)
        if self.collate is None:
            return self.source.default_collate(samples)
        if isinstance(samples, np.ndarray):
            samples = list(samples)
        return self.collate(samples)


class Transport(Protocol):
    """An engine that builds batches, in order, and hands them over on the device."""

    def batches(self, index_batches: Iterator[np.ndarray], epoch: int, plan: ReadPlan = NO_PARTS) -> Iterator[Any]:
        """The batches of these index arrays, read under ``plan``."""
        ...

    def close(self) -> None: ...


def make_transport(
    batcher: Batcher,
    *,
    device: torch.device,
    num_workers: int,
    prefetch_factor: int,
    timeout: float,
    batch_bytes: int,
    worker_counts: Callable[[Counts], None] | None = None,
) -> Transport:
    """The engine for this loader; ``batch_bytes`` is a batch's size when its samples are plain copies, else 0;
    ``worker_counts`` hears what worker processes counted (``_core.metrics``), with each batch."""
    group_size = max(1, min(THREAD_GROUP, GROUP_BYTES // max(1, batch_bytes)))
    if num_workers > 0 and batcher.builds_groups:
        # Plain copies release the GIL: one background thread beats worker processes (whose queues
        # pickle every batch) and beats more threads, which only contend for the GIL (benchmarks/README.md).
        return ThreadTransport(batcher, device, group_size, depth=max(2, prefetch_factor))
    if num_workers > 0:
        return WorkerTransport(batcher, device, num_workers, prefetch_factor, timeout, worker_counts)
    return InlineTransport(batcher, device, group_size if batcher.builds_groups else 1)


def _mover(batcher: Batcher, device: torch.device) -> Callable[[Any], Any]:
    """How a built batch reaches ``device``: as it is when that is the CPU and the batch is the source's own
    collated arrays (CPU tensors always), sparing a walk through its containers for every batch."""
    if device.type == "cpu" and batcher.builds_groups:
        return _unchanged
    return functools.partial(move_to_device, device=device)


def _group_sizes(largest: int) -> Iterator[int]:
    """1, 2, 4, ... up to ``largest``, then ``largest`` for ever: the first batch comes as soon as it can."""
    size = 1
    while True:
        yield size
        size = min(2 * size, largest)


class InlineTransport:
    """Batches built in the loader's thread when asked for, ``group_size`` at a time at most."""

    def __init__(self, batcher: Batcher, device: torch.device, group_size: int) -> None:
        self._batcher = batcher
        self._move = _mover(batcher, device)
        self._group_size = group_size

    def batches(self, index_batches: Iterator[np.ndarray], epoch: int, plan: ReadPlan = NO_PARTS) -> Iterator[Any]:
        batcher = self._batcher
        batcher.use_plan(plan)
        if self._group_size == 1:
            for indices in index_batches:
                yield self._move(batcher(indices, epoch))
            return
        for size in _group_sizes(self._group_size):
            group = list(islice(index_batches, size))
            if not group:
                return
            try:
                built: Iterable[Any] = batcher.many(group, epoch)
            except Exception:  # build them one by one, so the error surfaces at the batch it belongs to
                built = (batcher(indices, epoch) for indices in group)
            for batch in built:
                yield self._move(batch)

    def close(self) -> None:
        pass


class ThreadTransport:
    """Batches built ahead by one background thread in groups; ``depth`` groups are in flight at most.

    Groups keep the hand-off cost per batch small.
    """

    def __init__(self, batcher: Batcher, device: torch.device, group_size: int, depth: int) -> None:
        self._batcher = batcher
        self._move = _mover(batcher, device)
        self._group_size = group_size
        self._depth = depth
        self._thread = ThreadPoolExecutor(1, thread_name_prefix="guideloom-loader")

    def batches(self, index_batches: Iterator[np.ndarray], epoch: int, plan: ReadPlan = NO_PARTS) -> Iterator[Any]:
        batcher = self._batcher
        batcher.use_plan(plan)  # (before any of this segment's groups is built in the thread)
        pending: deque[tuple[list[np.ndarray], Future[list[Any]]]] = deque()
        for size in _group_sizes(self._group_size):
            group = list(islice(index_batches, size))
            if group:
                pending.append((group, self._thread.submit(batcher.many, group, epoch)))
            if not pending:
                return
            if len(pending) >= self._depth or not group:
                built_group, future = pending.popleft()
                try:
                    built: Iterable[Any] = future.result()
                except Exception:  # again one by one, so the error surfaces at the batch it belongs to
                    built = (batcher(indices, epoch) for indices in built_group)
                for batch in built:
                    yield self._move(batch)

    def close(self) -> None:
        self._thread.shutdown(wait=True, cancel_futures=True)


class _Built(NamedTuple):
    """A batch built in a worker process (or the error building it raised), and what the worker counted since its
    last one."""

    batch: Any
    counts: Counts


class _IndexDataset(torch.utils.data.Dataset[Any]):
    """Map-style view for torch's DataLoader: item = a whole batch, keyed by its epoch, sample indices and the
    epoch's read plan.

    Before each batch a worker checks that no shard it has mapped was truncated (else reading it would
    kill the worker with SIGBUS), and it reports which shards it has mapped, so that a worker killed
    all the same (truncated while it read) is named with them (``worker_deaths``).
    """

    def __init__(self, batcher: Batcher, reports: WorkerReports) -> None:
        self.batcher = batcher
        self.reports = reports
        self._reporting_pid = -1

    def __getitem__(self, key: tuple[int, np.ndarray, ReadPlan]) -> Any:
        epoch, indices, plan = key
        if self._reporting_pid != os.getpid():
            self._reporting_pid = os.getpid()
            self.reports.start_reporting()
        try:
            check_mapped()
            self.batcher.use_plan(plan)
            # objects that move themselves (PackedSequence) cross whole: their type checks its fields
            built: Any = map_tensors(self.batcher(indices, epoch), to_wire, is_sent_leaf)
        except Exception as error:
            built = WorkerError(error)
        return _Built(built, take_unsent())


def _unchanged(batch: Any) -> Any:
    """The batch as it is: torch's collate step (our batches are collated already and must not be
    converted), and the move of a batch already on its device."""
    return batch


class _CurrentEpochBatches:
    """torch's batch sampler: yields the keys of whatever epoch segment the loader set."""

    def __init__(self) -> None:
        self.keys: Iterator[tuple[int, np.ndarray, ReadPlan]] = iter(())

    def __iter__(self) -> Iterator[Any]:
        # torch's DataLoader treats each yielded item as one dataset key (batch_size=None).
        return self.keys


class WorkerTransport:
    """Batches built by torch worker processes, ``prefetch_factor`` ahead each; they persist across epochs."""

    def __init__(
        self,
        batcher: Batcher,
        device: torch.device,
        num_workers: int,
        prefetch_factor: int,
        timeout: float,
        worker_counts: Callable[[Counts], None] | None = None,
    ) -> None:
        self._device = device
        self._worker_counts = worker_counts
        self._batcher = batcher
        self._segment = _CurrentEpochBatches()
        self._reports = WorkerReports()
        self._loader: torch.utils.data.DataLoader[Any] | None = torch.utils.data.DataLoader(
            _IndexDataset(batcher, self._reports),
            batch_size=None,
            sampler=self._segment,
            num_workers=num_workers,
            collate_fn=_unchanged,
            prefetch_factor=prefetch_factor,
            persistent_workers=True,
            timeout=timeout,
            worker_init_fn=_die_with_parent,
        )

    def batches(self, index_batches: Iterator[np.ndarray], epoch: int, plan: ReadPlan = NO_PARTS) -> Iterator[Any]:
        assert self._loader is not None
        # The loader's process reads no batch here, but it hints what the workers read next (prefetching parts).
        self._batcher.use_plan(plan)
        self._segment.keys = ((epoch, indices, plan) for indices in index_batches)
        try:
            for built in self._loader:
                batch, counts = built
                if counts and self._worker_counts is not None:
                    self._worker_counts(counts)
                if isinstance(batch, WorkerError):
                    raise batch.error()
                yield move_to_device(map_tensors(batch, from_wire, is_wire), self._device)
        except RuntimeError as error:  # torch's report of a worker's death names no shard: ours does
            workers = getattr(getattr(self._loader, "_iterator", None), "_workers", ())
            explained = self._reports.explain(error, {worker.pid: worker.exitcode for worker in workers})
            if explained is None:
                raise
            raise explained from error

    def close(self) -> None:
        if self._loader is not None:
            _stop_workers(self._loader)
            self._loader = None
        self._reports.close()


def _die_with_parent(worker_id: int) -> None:
    """Make this worker process die with the training process: a daemon thread watches for the parent's death.

    torch's workers notice a dead parent only between batches; a worker blocked handing a batch to a parent
    killed with SIGKILL (its pipe full, nobody reading) would otherwise live on for ever, holding its mappings.
    """
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_CHECK_S)
        os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="guideloom-parent-watch", daemon=True).start()


def _stop_workers(loader: torch.utils.data.DataLoader[Any]) -> None:
    """Stop the persistent worker processes of a torch DataLoader now, without waiting for their batches.

    torch has no public call for this: it stops persistent workers only when the DataLoader's
    iterator is garbage collected, which a reference held anywhere (a traceback, a suspended
    generator) delays indefinitely, and it then gives a busy worker 5 seconds to finish. So this
    one place reaches into the iterator and does torch's shutdown itself, without the step that can
    hang: it stops watching the workers (else their exit would be reported as a worker killed by a
    signal), terminates them (their batches are discarded anyway) and closes the queues. torch's
    own shutdown first sets an event the workers poll; a worker that died holding that event's lock
    (killed, or a bus error on a truncated file) blocks that call for ever.
    """
    iterator = getattr(loader, "_iterator", None)
    if iterator is None or getattr(iterator, "_shutdown", True):
        return
    iterator._shutdown = True  # torch's own shutdown (at garbage collection) now does nothing
    if getattr(iterator, "_worker_pids_set", False):
        torch.utils.data._utils.signal_handling._remove_worker_pids(id(iterator))  # type: ignore[attr-defined]
        iterator._worker_pids_set = False
    workers = getattr(iterator, "_workers", ())
    for worker in workers:
        if worker.is_alive():
            worker.terminate()
    for worker in workers:
        worker.join(timeout=5)
        if worker.is_alive():  # a worker that ignores SIGTERM
            worker.kill()
            worker.join()
    for queue in [*iterator._index_queues, iterator._worker_result_queue]:
        queue.cancel_join_thread()
        queue.close()
