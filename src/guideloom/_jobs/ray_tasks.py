"""``--ray`` / ``ray=``: one Ray task per job, on a running or a new local cluster.

Beside ``guideloom.ray``, the only guideloom module that imports Ray (the ``ray`` extra); a run imports
it only when Ray is asked for. A task whose worker dies is run again by Ray and goes on after what its
job has committed (:meth:`Work.run_again`), so the run stays exactly once across machines.
"""

from __future__ import annotations

import logging
from typing import Any

import ray

from guideloom._jobs.pool import STOP_GRACE_SECONDS
from guideloom._jobs.work import J, R, RemoteTraceback, Report, Work, run_again


def run_tasks(
    work: Work[J, R], jobs: list[J], address: str | None, update: Report, results: dict[int, R]
) -> BaseException | None:
    """Write ``jobs`` as Ray tasks (largest first), their results into ``results`` by the job's index in ``jobs``;
    the first failure (or None).

    Connects to the cluster at ``address`` (None: ``RAY_ADDRESS`` or a new local cluster) unless Ray is
    already initialised in this process. The first failure cancels the other tasks; their shards in
    progress are not committed.
    """
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    task: Any = ray.remote(num_cpus=1, max_retries=3)(run_again)
    pending = {task.remote(work, job): (index, job) for index, job in sorted(enumerate(jobs), key=lambda n: -n[1].size)}
    failure: BaseException | None = None
    try:
        while pending and failure is None:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            index, job = pending.pop(ready)
            try:
                kind, payload, trace = ray.get(ready)
            except ray.exceptions.RayError as error:  # retries exhausted: its worker kept dying
                failure = work.died(
                    f"the Ray task writing {job.describe()} failed: {error}; its shard in progress was not committed"
                )
                continue
            if kind == "done":
                results[index] = payload
                update(*work.finished(job, payload))
            else:
                payload.__cause__ = RemoteTraceback(trace)
                failure = payload
    finally:
        for ref in pending:  # after a failure: a running task leaves its shard uncommitted
            ray.cancel(ref)
        if pending:
            ray.wait(list(pending), num_returns=len(pending), timeout=STOP_GRACE_SECONDS)
        if started_here:
            ray.shutdown()
    return failure
