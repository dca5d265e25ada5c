"""An import's jobs as the executors run them (``guideloom._jobs``): each writes its job with :func:`import_job`."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from guideloom._jobs.work import Report, Work, never
from guideloom.importing._cores import have_spare_cores
from guideloom.importing._errors import ImportWorkerDied
from guideloom.importing._plan import ImportJob, ImportSettings
from guideloom.importing._write import JobResult, import_job, import_job_again


@dataclass(frozen=True)
class ImportWork(Work[ImportJob, JobResult]):
    """Writing an import's jobs with its ``settings``; the progress bar counts rows beside the bytes."""

    name = "import"
    unit = "job"
    items = "rows"
    died = ImportWorkerDied

    settings: ImportSettings

    def start(self, workers: int) -> None:
        have_spare_cores(workers < (os.cpu_count() or 1))

    def run(self, job: ImportJob, report: Report, cancelled: Callable[[], bool] = never) -> JobResult:
        return import_job(job, self.settings, lambda rows, size: report(size, rows), cancelled)

    def run_again(self, job: ImportJob) -> tuple[str, Any, str | None]:
        return import_job_again(job, self.settings)

    def finished(self, job: ImportJob, result: JobResult) -> tuple[int, int]:
        return job.size, result.rows

    def death(self, how: str, job: ImportJob | None) -> str:
        doing = f"while writing the shards of {job.describe()}" if job else "between jobs"
        return (
            f"an import worker process died ({how}) {doing}: the shard it was writing was not committed; "
            "run the same import again to finish it"
        )
