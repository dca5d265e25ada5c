"""Worker processes for an import: each writes whole jobs, one at a time, the largest first.

As in ``guideloom tokenize``'s pool, each worker has two pipes of its own (jobs in, events out), so a
worker killed at any instant holds no lock the others need, and its death is seen through its process
sentinel. The first failure cancels the others: the parent sends each busy worker a stop message, which
:func:`import_job` notices between rows (it polls the job pipe), so their shards in progress are not
committed. A worker whose parent died (killed with ``kill -9``) stops the same way.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import traceback
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from guideloom.importing._errors import ImportWorkerDied
from guideloom.importing._plan import ImportJob, ImportSettings
from guideloom.importing._write import Cancelled, JobResult, import_job, picklable

STOP_GRACE_SECONDS = 30.0


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process, attached as the error's ``__cause__``."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}"


def _worker_main(settings: ImportSettings, jobs: Connection, events: Connection) -> None:
    """A worker process: write each job received until ``None``; report progress and outcomes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    parent = os.getppid()
    events.send(("ready", None, None, None))

    def report(rows: int, size: int) -> None:
        events.send(("progress", (rows, size), None, None))

    def cancelled() -> bool:
        return jobs.poll() or os.getppid() != parent

    while (job := jobs.recv()) is not None:
        try:
            result = import_job(job, settings, report, cancelled)
        except Cancelled:
            events.send(("cancelled", job.number, None, None))
        except Exception as error:
            events.send(("failed", job.number, picklable(error), traceback.format_exc()))
        else:
            events.send(("done", job.number, result, None))


@dataclass
class _Worker:
    process: BaseProcess
    jobs: Connection
    events: Connection
    job: ImportJob | None = None
    stopped: bool = False


class _Pool:
    """The parent's side: hands out jobs, collects results, notices failures and deaths."""

    def __init__(
        self, jobs: list[ImportJob], settings: ImportSettings, workers: int, update: Callable[[int, int], object]
    ) -> None:
        self.pending = deque(sorted(jobs, key=lambda job: -job.size))
        self.settings = settings
        self.update = update
        self.results: dict[int, JobResult] = {}
        self.failure: BaseException | None = None
        self.workers: list[_Worker] = []
        context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads
        for _ in range(workers):
            job_reader, job_writer = context.Pipe(duplex=False)
            event_reader, event_writer = context.Pipe(duplex=False)
            process = context.Process(target=_worker_main, args=(settings, job_reader, event_writer), daemon=True)
            process.start()
            job_reader.close()
            event_writer.close()
            self.workers.append(_Worker(process, job_writer, event_reader))

    def run(self) -> None:
        while self.workers:
            sentinels = {worker.process.sentinel: worker for worker in self.workers}
            ready = wait([*(worker.events for worker in self.workers), *sentinels])
            for worker in list(self.workers):
                if worker.events in ready:
                    self._receive(worker)
                if worker.process.sentinel in ready:
                    self._ended(worker)

    def _next_job(self, worker: _Worker) -> None:
        worker.job = self.pending.popleft() if self.pending and self.failure is None else None
        if worker.job is None:
            worker.stopped = True
        worker.jobs.send(worker.job)

    def _receive(self, worker: _Worker, dispatch: bool = True) -> None:
        try:
            while worker.events.poll():
                kind, value, payload, remote_traceback = worker.events.recv()
                if kind == "progress":
                    self.update(*value)
                    continue
                worker.job = None
                if kind == "done":
                    self.results[value] = payload
                elif kind == "failed":
                    if remote_traceback is not None:
                        payload.__cause__ = RemoteTraceback(remote_traceback)
                    self._fail(payload)
                if dispatch and not worker.stopped:
                    self._next_job(worker)
        except (EOFError, OSError):
            pass  # the worker is gone; its sentinel says so

    def _ended(self, worker: _Worker) -> None:
        self._receive(worker, dispatch=False)
        worker.process.join()
        self.workers.remove(worker)
        worker.jobs.close()
        worker.events.close()
        if worker.job is not None or worker.process.exitcode != 0:
            self._fail(self._died(worker))

    def _died(self, worker: _Worker) -> ImportWorkerDied:
        code = worker.process.exitcode or 0
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        doing = f"while writing the shards of {worker.job.describe()}" if worker.job else "between jobs"
        return ImportWorkerDied(
            f"an import worker process died ({how}) {doing}: the shard it was writing was not committed; "
            "run the same import again to finish it"
        )

    def _fail(self, error: BaseException) -> None:
        if self.failure is None:
            self.failure = error
        self.stop()

    def stop(self) -> None:
        for worker in self.workers:
            if not worker.stopped:
                worker.stopped = True
                try:
                    worker.jobs.send(None)
                except OSError:
                    pass

    def close(self) -> None:
        self.stop()
        for worker in self.workers:
            worker.process.join(STOP_GRACE_SECONDS)
            if worker.process.is_alive():
                worker.process.terminate()
                worker.process.join()


def run_pool(
    jobs: list[ImportJob], settings: ImportSettings, workers: int, update: Callable[[int, int], object]
) -> tuple[dict[int, JobResult], BaseException | None]:
    """Write ``jobs`` in ``workers`` processes: the results by job, and the first failure (or None)."""
    pool = _Pool(jobs, settings, workers, update)
    try:
        pool.run()
    finally:
        pool.close()
    return pool.results, pool.failure
