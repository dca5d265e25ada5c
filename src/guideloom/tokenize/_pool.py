"""Worker processes for a tokenize run: each tokenizes whole groups of files, one at a time, the largest first.

A worker asks for its first group once it has loaded the tokenizer (the first ready takes the largest).

Each worker has two pipes of its own (jobs in, events out), so a worker killed at any instant holds no
lock the others need; its death is seen through its process sentinel. The first failure cancels the
others: the parent sends each busy worker a stop message, which :func:`tokenize_group` notices between
batches (it polls the job pipe), so their shards in progress are not committed.
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

from guideloom._core.errors import TokenizeWorkerDied
from guideloom.tokenize._groups import GroupJob
from guideloom.tokenize._plan import TokenizeSettings
from guideloom.tokenize._shard import Cancelled, GroupResult, picklable, tokenize_group

STOP_GRACE_SECONDS = 30.0  # how long stopped workers may take to leave their current batch


class RemoteTraceback(Exception):
    """The traceback of an error raised in a worker process, attached as the error's ``__cause__``."""

    def __str__(self) -> str:
        return f"\n{self.args[0]}"


def _worker_main(settings: TokenizeSettings, threads: int, jobs: Connection, events: Connection) -> None:
    """A worker process: tokenize each job received until ``None``; report progress and outcomes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle: it stops the workers
    os.environ["RAYON_NUM_THREADS"] = str(threads)  # the tokenizer's threads: cores / workers
    try:
        tokenizer = settings.load_tokenizer()
    except Exception as error:
        events.send(("failed", None, picklable(error), traceback.format_exc()))
        return
    events.send(("ready", None, None, None))

    def report(count: int) -> None:
        events.send(("progress", count, None, None))

    while (job := jobs.recv()) is not None:
        try:
            result = tokenize_group(job, settings, tokenizer, report, jobs.poll)
        except Cancelled:
            events.send(("cancelled", job.group, None, None))
        except Exception as error:
            events.send(("failed", job.group, picklable(error), traceback.format_exc()))
        else:
            events.send(("done", job.group, result, None))


@dataclass
class _Worker:
    process: BaseProcess
    jobs: Connection
    events: Connection
    job: GroupJob | None = None  # the group it is working on
    stopped: bool = False  # sent the stop message


class _Pool:
    """The parent's side of a run: hands out jobs, collects results, notices failures and deaths."""

    def __init__(
        self, jobs: list[GroupJob], settings: TokenizeSettings, workers: int, update: Callable[[int], object]
    ) -> None:
        self.pending = deque(sorted(jobs, key=lambda job: -job.size))  # the largest first: busy to the end
        self.settings = settings
        self.update = update
        self.results: dict[int, GroupResult] = {}
        self.failure: BaseException | None = None
        self.workers: list[_Worker] = []
        context = multiprocessing.get_context("spawn")  # no fork: the parent may hold threads (torch, tokenizers)
        threads = max(1, (os.cpu_count() or 1) // workers)
        for _ in range(workers):
            job_reader, job_writer = context.Pipe(duplex=False)
            event_reader, event_writer = context.Pipe(duplex=False)
            process = context.Process(
                target=_worker_main, args=(settings, threads, job_reader, event_writer), daemon=True
            )
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
        """Handle what the worker sent; with ``dispatch``, give it its next job when it finished one."""
        try:
            while worker.events.poll():
                kind, value, payload, remote_traceback = worker.events.recv()
                if kind == "progress":
                    self.update(value)
                    continue
                worker.job = None  # ready for a job: it loaded the tokenizer, or it finished its last one
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
        self._receive(worker, dispatch=False)  # what it sent before it ended
        worker.process.join()
        self.workers.remove(worker)
        worker.jobs.close()
        worker.events.close()
        if worker.job is not None or worker.process.exitcode != 0:
            self._fail(self._died(worker))

    def _died(self, worker: _Worker) -> TokenizeWorkerDied:
        code = worker.process.exitcode or 0
        how = f"killed by {signal.Signals(-code).name}" if code < 0 else f"exit status {code}"
        doing = f"while writing the shards of {worker.job.describe()}" if worker.job else "while it had no file"
        return TokenizeWorkerDied(
            f"a tokenize worker process died ({how}) {doing}: the shard it was writing was not committed; "
            f"leftovers of {self.settings.output} can be removed with 'guideloom clean'"
        )

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
    jobs: list[GroupJob], settings: TokenizeSettings, workers: int, update: Callable[[int], object]
) -> tuple[dict[int, GroupResult], BaseException | None]:
    """Tokenize ``jobs`` in ``workers`` processes: the results by group, and the first failure (or None)."""
    pool = _Pool(jobs, settings, workers, update)
    try:
        pool.run()
    finally:
        pool.close()
    return pool.results, pool.failure
