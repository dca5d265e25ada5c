"""``guideloom tokenize --ray``: one Ray task per group of input files, on a running or a new local cluster.

Beside ``guideloom.ray``, the only guideloom module that imports Ray (the ``ray`` extra); the run
imports it only when ``--ray`` is given.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path

import ray

from guideloom._core.errors import TokenizeWorkerDied
from guideloom._storage.resumable_write import remove_leftovers
from guideloom.tokenize._groups import GroupJob, shard_range
from guideloom.tokenize._plan import TokenizeSettings
from guideloom.tokenize._pool import STOP_GRACE_SECONDS, RemoteTraceback
from guideloom.tokenize._shard import GroupResult, tokenize_job


def run_tokenize_tasks(
    jobs: list[GroupJob], settings: TokenizeSettings, address: str | None, update: Callable[[int], object]
) -> tuple[dict[int, GroupResult], BaseException | None]:
    """Tokenize ``jobs`` as Ray tasks (largest first): the results by group, and the first failure (or None).

    Connects to the cluster at ``address`` (None: ``RAY_ADDRESS`` or a new local cluster) unless Ray is
    already initialised in this process. The first failure cancels the other tasks; their shards in
    progress are not committed. A task whose worker dies is retried by Ray.
    """
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    task = ray.remote(num_cpus=1, max_retries=3)(tokenize_job)  # a Ray-free function: workers import little
    pending = {task.remote(job, settings): job for job in sorted(jobs, key=lambda job: -job.size)}
    results: dict[int, GroupResult] = {}
    failure: BaseException | None = None
    try:
        while pending and failure is None:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready)
            try:
                kind, payload, trace = ray.get(ready)
            except ray.exceptions.RayError as error:  # retries exhausted: its worker kept dying
                failure = TokenizeWorkerDied(
                    f"the Ray task writing {job.describe()} failed: {error}; its shard in progress was not committed"
                )
                continue
            if kind == "done":
                results[job.group] = payload
                update(job.size)
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
    if failure is None and jobs and isinstance(settings.output, Path):  # a URL's uploads leave nothing behind
        remove_leftovers(settings.storage().incomplete_files_dir(), *shard_range(jobs))  # of killed attempts
    return results, failure
