"""Worker processes: each writes whole jobs, one at a time, the largest first.

A worker asks for its first job once it has started (:meth:`Work.start`: a tokenizer loaded, say), so the
first ready takes the largest. Each worker has two pipes of its own (jobs in, events out), so a worker
killed at any instant holds no lock the others need; its death is seen through its process sentinel. The
first failure cancels the others: the parent sends each busy worker a stop message, which the job notices
between rows or batches (it polls the job pipe), so their shards in progress are not committed. A worker
whose parent died (killed with ``kill -9``) stops the same way. Workers may be started before the work is
known (:class:`WorkerProcesses`), their start overlapping the parent's planning; the work comes as their first
message. They are forked where that is safe (:func:`start_method`), else spawned.
"""

from __future__ import annotations

import importlib
import multiprocessing
import os
import signal
import sys
import threading
import traceback
import weakref
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess
from typing import Any, Generic, Literal

from guideloom._jobs.work import Cancelled, J, R, RemoteTraceback, Report, Work, picklable

STOP_GRACE_SECONDS = 30.0  # how long stopped workers may take to leave their current batch of rows
# Libraries whose native threads a forked child would inherit in an unknown state (held locks, a CUDA context)
THREADED_LIBRARIES = ("torch", "tokenizers", "ray", "grpc", "jax", "tensorflow")

# The parent's ends of its workers' pipes. A forked worker closes the copies it inherits: a copy of a job pipe's
# writing end would keep that worker waiting for jobs after the parent died, as it would never read the end.
_parent_ends: weakref.WeakSet[Connection] = weakref.WeakSet()


def start_method() -> Literal["fork", "spawn"]:
    """How worker processes start: forked where that is safe, so that they begin with the parent's modules imported
    (a spawned interpreter takes about 0.2 s to import guideloom and pyarrow); spawned otherwise. Safe means Linux,
    no Python thread but this one, and none of the ``THREADED_LIBRARIES`` loaded."""
    if sys.platform != "linux" or threading.active_count() > 1:
        return "spawn"
    if any(name in sys.modules for name in THREADED_LIBRARIES):
        return "spawn"
    return "fork"


def _worker_main(
    preload: tuple[str, ...], jobs: Connection, events: Connection, inherited: tuple[Connection, ...] = ()
) -> None:
    """A worker process: close the ``inherited`` pipe ends of a fork, import ``preload`` while the parent plans,
    then receive the work (or ``None``: not needed), write each job received until ``None``, and report progress
    and outcomes."""
    for end in inherited:
        end.close()
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    parent = os.getppid()
    for module in preload:
        importlib.import_module(module)
    given = jobs.recv()
    if given is None:
        return
    work, workers = given
    try:
        work.start(workers)
    except Exception as error:
        events.send(("failed", picklable(error), traceback.format_exc()))
        return
    events.send(("ready", None, None))

    def report(size: int, items: int = 0) -> None:
        events.send(("progress", (size, items), None))

    def cancelled() -> bool:
        return jobs.poll() or os.getppid() != parent

    while (job := jobs.recv()) is not None:
        try:
            result = work.run(job, report, cancelled)
        except Cancelled:
            events.send(("cancelled", None, None))
        except Exception as error:
            events.send(("failed", picklable(error), traceback.format_exc()))
        else:
            events.send(("done", result, None))


@dataclass
class _Worker(Generic[J]):
    process: BaseProcess
    jobs: Connection
    events: Connection
    job: tuple[int, J] | None = None  # the job it is working on, and its index
    stopped: bool = False  # sent the stop message
    leaving: bool = False  # its events pipe closed: waited for by its sentinel alone (a closed pipe is always ready)


class WorkerProcesses:
    """Worker processes started before their work is known, so that their start (a fresh interpreter importing
    ``preload``) overlaps the parent's planning; a pool takes them, and those it does not need are let go."""

    def __init__(self, count: int, preload: tuple[str, ...] = ()) -> None:
        forked = start_method() == "fork"
        context = multiprocessing.get_context("fork") if forked else multiprocessing.get_context("spawn")
        self.waiting: list[_Worker[Any]] = []
        for _ in range(count):
            job_reader, job_writer = context.Pipe(duplex=False)
            event_reader, event_writer = context.Pipe(duplex=False)
            _parent_ends.update((job_writer, event_reader))
            inherited = tuple(end for end in _parent_ends if not end.closed) if forked else ()
            arguments = (preload, job_reader, event_writer, inherited)
            process = context.Process(target=_worker_main, args=arguments, daemon=True)
            process.start()
            job_reader.close()
            event_writer.close()
            self.waiting.append(_Worker(process, job_writer, event_reader))

    def take(self, count: int) -> list[_Worker[Any]]:
        """Up to ``count`` of the waiting processes, no longer waiting."""
        taken, self.waiting = self.waiting[:count], self.waiting[count:]
        return taken

    def close(self) -> None:
        """Let the processes no pool took go: told they are not needed, then waited for."""
        for worker in self.waiting:
            try:
                worker.jobs.send(None)
            except OSError:
                pass  # already gone
        for worker in self.waiting:
            worker.process.join(STOP_GRACE_SECONDS)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join()
            worker.jobs.close()
            worker.events.close()
        self.waiting = []

    def __enter__(self) -> WorkerProcesses:
        return self

    def __exit__(self, *exception: object) -> None:
        self.close()


class _Pool(Generic[J, R]):
    """The parent's side: hands out jobs, collects results, notices failures and deaths."""

    def __init__(
        self, work: Work[J, R], jobs: list[J], workers: list[_Worker[J]], update: Report, results: dict[int, R]
    ) -> None:
        self.pending = deque(sorted(enumerate(jobs), key=lambda numbered: -numbered[1].size))  # busy to the end
        self.work = work
        self.update = update
        self.results = results
        self.failure: BaseException | None = None
        self.workers = workers
        for worker in workers:
            try:
                worker.jobs.send((work, len(workers)))
            except OSError:
                pass  # it died waiting: its sentinel says so

    def run(self) -> None:
        while self.workers:
            sentinels = {worker.process.sentinel: worker for worker in self.workers}
            events = [worker.events for worker in self.workers if not worker.leaving]
            ready = wait([*events, *sentinels])
            for worker in list(self.workers):
                if worker.events in ready:
                    self._receive(worker)
                if worker.process.sentinel in ready:
                    self._ended(worker)

    def _next_job(self, worker: _Worker[J]) -> None:
        worker.job = self.pending.popleft() if self.pending and self.failure is None else None
        if worker.job is None:
            worker.stopped = True
        worker.jobs.send(None if worker.job is None else worker.job[1])

    def _receive(self, worker: _Worker[J], dispatch: bool = True) -> None:
        """Handle what the worker sent; with ``dispatch``, give it its next job when it finished one."""
        try:
            while worker.events.poll():
                kind, payload, remote_traceback = worker.events.recv()
                if kind == "progress":
                    self.update(*payload)
                    continue
                if kind == "done" and worker.job is not None:
                    self.results[worker.job[0]] = payload
                elif kind == "failed":
                    if remote_traceback is not None:
                        payload.__cause__ = RemoteTraceback(remote_traceback)
                    self._fail(payload)
                worker.job = None  # ready for a job: it started, or it finished its last one
                if dispatch and not worker.stopped:
                    self._next_job(worker)
        except (EOFError, OSError):
            worker.leaving = True  # its pipe is closed (it is ending): its sentinel says when it has ended

    def _ended(self, worker: _Worker[J]) -> None:
        self._receive(worker, dispatch=False)  # what it sent before it ended
        worker.process.join()
        self.workers.remove(worker)
        worker.jobs.close()
        worker.events.close()
        if worker.job is not None or worker.process.exitcode != 0:
            code = worker.process.exitcode or 0
            how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
            self._fail(self.work.died(self.work.death(how, None if worker.job is None else worker.job[1])))

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.stop()

    def stop(self) -> None:
        """Ask every worker to stop: a busy one leaves its shard in progress uncommitted at its next batch."""
        for worker in self.workers:
            if not worker.stopped:
                worker.stopped = True
                try:
                    worker.jobs.send(None)
                except OSError:
                    pass  # already gone

    def close(self) -> None:
        """Stop the workers and wait for them; the ones that do not stop in time are terminated."""
        self.stop()
        for worker in self.workers:
            worker.process.join(STOP_GRACE_SECONDS)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join()


def run_pool(
    work: Work[J, R],
    jobs: list[J],
    workers: int,
    update: Report,
    results: dict[int, R],
    started: WorkerProcesses | None = None,
) -> BaseException | None:
    """Write ``jobs`` in ``workers`` processes (taken from ``started`` first), their results into ``results`` by the
    job's index in ``jobs``; the first failure (or None)."""
    taken = started.take(workers) if started is not None else []
    if len(taken) < workers:
        taken += WorkerProcesses(workers - len(taken)).take(workers)
    pool = _Pool(work, jobs, taken, update, results)
    try:
        pool.run()
    finally:
        pool.close()
    return pool.failure
