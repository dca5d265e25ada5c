"""Running a command's jobs: in this process, in worker processes or as Ray tasks, with a progress bar.

The jobs and their shards are the same whichever runs them; only how many run side by side differs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Generic, Protocol

from guideloom._jobs.pool import WorkerProcesses, run_pool
from guideloom._jobs.progress import Progress
from guideloom._jobs.work import Cancelled, J, R, Work

# With ``workers=None`` inputs smaller than this are written in the calling process: starting worker processes
# (each imports numpy, and pyarrow or a tokenizer) takes longer than writing a few MB.
AUTO_PARALLEL_MIN_BYTES = 8 << 20


class RunOptionNames(Protocol):
    """How the caller spells the options of a run in messages: Python arguments, or the command's options."""

    @property
    def workers(self) -> str: ...

    @property
    def ray(self) -> str: ...


@dataclass(frozen=True)
class Executed(Generic[R]):
    """What the jobs of a run wrote, and where."""

    results: dict[int, R]  #: each finished job's result, by its index in the jobs
    processes: int  #: worker processes started (0: the calling process, or Ray, did the work)


def check_workers(workers: object, name: str) -> None:
    """ValueError unless ``workers`` is None (the default) or a positive int."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ValueError(f"{name} must be a positive int, got {workers!r}")


def workers_ahead(
    default_workers: int, workers: int | None, ray: bool | str, input_bytes: int | None, likely_jobs: int, preload: str
) -> WorkerProcesses:
    """Worker processes to start while the run is planned, their start (importing ``preload``) overlapping the
    planning: as many as :func:`run_jobs` will likely use for ``likely_jobs`` jobs; none where it will run in this
    process or as Ray tasks, or where the inputs' size is unknown (on an object store) and the default decides by it."""
    count = default_workers if workers is None else workers
    if workers is None and (input_bytes is None or input_bytes < AUTO_PARALLEL_MIN_BYTES):
        count = 1
    count = min(count, likely_jobs)
    return WorkerProcesses(count if count > 1 and ray is False else 0, (preload,))


def run_jobs(
    work: Work[J, R],
    jobs: list[J],
    workers: int | None,
    ray: bool | str,
    progress: bool,
    names: RunOptionNames,
    note: Callable[[BaseException, dict[int, R]], object],
    started: WorkerProcesses | None = None,
) -> Executed[R]:
    """Write ``jobs`` with ``workers`` processes (None: ``work.default_workers()``, or this process for small
    inputs; 1: this process), or as Ray tasks (``ray``: True, or a cluster's address), with a progress bar.

    Worker processes ``started`` ahead (:func:`workers_ahead`) are used first.
    A failure is raised once the other jobs stopped, after ``note(error, results so far)`` said on it what
    was committed and how to finish.
    """
    if ray is not False and workers is not None:
        raise ValueError(f"{names.workers} and {names.ray} exclude each other: Ray runs one task per {work.unit}")
    check_workers(workers, names.workers)
    count = work.default_workers() if workers is None else workers
    total = sum(job.size for job in jobs)
    if workers is None and total < AUTO_PARALLEL_MIN_BYTES:
        count = 1
    processes = 0 if count == 1 or len(jobs) <= 1 or ray is not False else min(count, len(jobs))
    results: dict[int, R] = {}
    bar = Progress(total, progress, work.name, work.items)
    try:
        failure: BaseException | None = None
        if ray is not False and jobs:
            try:
                from guideloom._jobs.ray_tasks import run_tasks  # Ray is imported only here
            except ModuleNotFoundError as error:
                if error.name != "ray":
                    raise
                raise ImportError(f"{names.ray} needs Ray: pip install 'guideloom[ray]'") from None
            failure = run_tasks(work, jobs, None if ray is True else ray, bar.update, results)
        elif processes:
            failure = run_pool(work, jobs, processes, bar.update, results, started)
        else:
            for index, job in enumerate(jobs):
                results[index] = work.run(job, bar.update)
        if failure is not None:
            raise failure
    except BaseException as error:
        if not isinstance(error, Cancelled | KeyboardInterrupt):
            note(error, results)
        raise
    finally:
        bar.close()
    return Executed(results, processes)
