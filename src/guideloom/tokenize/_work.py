"""A tokenize run's groups as the executors run them (``guideloom._jobs``): each writes its group with
:func:`tokenize_group`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guideloom._core.errors import TokenizeWorkerDied
from guideloom._jobs.work import Report, Work, never
from guideloom.tokenize._groups import GroupJob
from guideloom.tokenize._plan import TokenizeSettings
from guideloom.tokenize._shard import GroupResult, tokenize_group, tokenize_job


@dataclass
class TokenizeWork(Work[GroupJob, GroupResult]):
    """Tokenizing a run's groups with its ``settings`` and ``tokenizer``.

    The tokenizer the plan loaded serves the calling process; it is never pickled: a worker process loads
    its own (:meth:`start`), a Ray task the one its process keeps (:func:`tokenize_job`).
    """

    name = "tokenize"
    unit = "group"
    died = TokenizeWorkerDied

    settings: TokenizeSettings
    tokenizer: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {"settings": self.settings, "tokenizer": None}

    def default_workers(self) -> int:
        return min(4, os.cpu_count() or 1)

    def start(self, workers: int) -> None:
        os.environ["RAYON_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // workers))  # the tokenizer's threads
        self.tokenizer = self.settings.load_tokenizer()

    def run(self, job: GroupJob, report: Report, cancelled: Callable[[], bool] = never) -> GroupResult:
        return tokenize_group(job, self.settings, self.tokenizer, report, cancelled)

    def run_again(self, job: GroupJob) -> tuple[str, Any, str | None]:
        return tokenize_job(job, self.settings)

    def finished(self, job: GroupJob, result: GroupResult) -> tuple[int, int]:
        return job.size, 0

    def death(self, how: str, job: GroupJob | None) -> str:
        doing = f"while writing the shards of {job.describe()}" if job else "while it had no file"
        return (
            f"a tokenize worker process died ({how}) {doing}: the shard it was writing was not committed; "
            f"leftovers of {self.settings.output} can be removed with 'guideloom clean'"
        )
