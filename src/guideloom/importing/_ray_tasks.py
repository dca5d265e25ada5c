"""``import_records(..., ray=...)`` / ``guideloom import --ray``: one Ray task per job, on a running or a new cluster.

Imported only when Ray is asked for (the ``ray`` extra). Every machine must see the destination at the
same path (a shared file system) and the sources (the same paths, or an object store). A task that
dies is run again by Ray and goes on after what its job has committed (``import_job_again``), so the
import stays exactly once across machines.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import ray

from guideloom.importing._errors import ImportWorkerDied
from guideloom.importing._plan import ImportJob, ImportSettings
from guideloom.importing._pool import STOP_GRACE_SECONDS, RemoteTraceback
from guideloom.importing._write import JobResult, import_job_again


def run_import_tasks(
    jobs: list[ImportJob], settings: ImportSettings, address: str | None, update: Callable[[int, int], object]
) -> tuple[dict[int, JobResult], BaseException | None]:
    """Write ``jobs`` as Ray tasks (largest first): the results by job, and the first failure (or None).

    Connects to the cluster at ``address`` (None: ``RAY_ADDRESS`` or a new local cluster) unless Ray is
    already initialised in this process. The first failure cancels the other tasks.
    """
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    task = ray.remote(num_cpus=1, max_retries=3)(import_job_again)  # a Ray-free function: workers import little
    pending = {task.remote(job, settings): job for job in sorted(jobs, key=lambda job: -job.size)}
    results: dict[int, JobResult] = {}
    failure: BaseException | None = None
    try:
        while pending and failure is None:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready)
            try:
                kind, payload, trace = ray.get(ready)
            except ray.exceptions.RayError as error:  # retries exhausted: its worker kept dying
                failure = ImportWorkerDied(
                    f"the Ray task writing {job.describe()} failed: {error}; its shard in progress was not committed"
                )
                continue
            if kind == "done":
                results[job.number] = payload
                update(payload.rows, job.size)
            else:
                payload.__cause__ = RemoteTraceback(trace)
                failure = payload
    finally:
        for ref in pending:
            ray.cancel(ref)
        if pending:
            ray.wait(list(pending), num_returns=len(pending), timeout=STOP_GRACE_SECONDS)
        if started_here:
            ray.shutdown()
    return results, failure
