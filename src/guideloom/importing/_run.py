"""Running a planned import: in this process or in worker processes, with a progress bar, and what it wrote."""

from __future__ import annotations

import os
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from guideloom._core.errors import StorageNotFoundError
from guideloom._core.sizes import parse_shard_size
from guideloom._core.text import plural
from guideloom._jobs.pool import WorkerProcesses
from guideloom._jobs.run import check_workers, run_jobs, workers_ahead
from guideloom._storage.provenance import read_inputs
from guideloom._storage.storages import local_path
from guideloom.fields import RecordSchema
from guideloom.importing._plan import (
    DEFAULT_SHARD_SIZE,
    ImportPlan,
    Inputs,
    gather_inputs,
    job_ends,
    local_sizes,
    plan_import,
)
from guideloom.importing._schema import describe_fields, fields_from_mapping, record_schema
from guideloom.importing._work import ImportWork
from guideloom.importing._write import JobResult


@dataclass(frozen=True)
class OptionNames:
    """How the caller spells each option in messages: Python arguments, or the command's options."""

    workers: str
    shard_size: str
    storage_options: str
    ray: str


IMPORT_WORK = "guideloom.importing._work"  # what a worker imports to write jobs: while the import is planned
PYTHON_NAMES = OptionNames("workers", "shard_size", "storage_options", "ray")
CLI_NAMES = OptionNames("--workers", "--shard-size", "--storage-options", "--ray")


@dataclass(frozen=True)
class ImportSummary:
    """What one import run wrote (a run that finishes an interrupted import counts what it wrote itself)."""

    rows: int  #: rows written by this run
    shards: int  #: shards committed by this run
    bytes: int  #: input bytes read by this run
    skipped: dict[str, int] = field(default_factory=dict)  #: rows left out by this run, by reason
    inputs: int = 0  #: inputs of the import
    seconds: float = 0.0
    processes: int = 0  #: worker processes started (0: the calling process did the work)
    finished_before: int = 0  #: jobs an earlier run had finished (nothing read for them)
    fields: str = ""  #: the records' fields, as written
    schema: RecordSchema | None = None  #: what the storage is written with: ``DocumentStorage(destination, schema)``

    def describe(self) -> str:
        """The run in a few lines, as ``guideloom import`` prints it."""
        if not self.rows and not self.shards and self.finished_before and not self.skipped:
            return (
                f"nothing to import: earlier runs wrote every row of these {plural(self.inputs, 'input')} "
                f"({plural(self.finished_before, 'job')})\nfields: {self.fields}"
            )
        rate = self.bytes / self.seconds / 2**20 if self.seconds > 0 else 0.0
        where = (
            f"{plural(self.processes, 'worker process', 'worker processes')}" if self.processes else "in this process"
        )
        lines = [
            f"imported {plural(self.rows, 'row')} from {plural(self.inputs, 'input')} "
            f"({self.bytes / 2**20:.1f} MiB) into {plural(self.shards, 'shard')} in {self.seconds:.1f} s "
            f"= {rate:.1f} MiB/s ({where})",
            f"fields: {self.fields}",
        ]
        if self.finished_before:
            lines.append(
                f"{plural(self.finished_before, 'job')} finished by an earlier run: nothing more to write there"
            )
        for reason, count in sorted(self.skipped.items()):
            lines.append(f"skipped {plural(count, 'row')}: {reason}")
        return "\n".join(lines)


def _note_failure(error: BaseException, results: dict[int, JobResult]) -> None:
    """Say on the error how to finish the import: run again, every job goes on after its committed shards."""
    del results
    error.add_note("shards committed before the failure stay; run the same import again to finish it")


def start_workers(
    inputs: Inputs, workers: int | None, ray: bool | str, shard_size: object, names: OptionNames
) -> WorkerProcesses:
    """The worker processes the import of ``inputs`` will likely use (its jobs cut by the inputs' sizes, pieces
    aside), started before it is planned: planning reads every input's head while they start."""
    sizes = local_sizes(inputs)
    if sizes is None:
        return workers_ahead(ImportWork.cores(), workers, ray, None, 1, IMPORT_WORK)
    jobs = len(job_ends(sizes, parse_shard_size(shard_size, names.shard_size)))
    return workers_ahead(ImportWork.cores(), workers, ray, sum(sizes), jobs, IMPORT_WORK)


def execute(
    plan: ImportPlan,
    workers: int | None,
    progress: bool,
    started: float,
    ray: bool | str = False,
    processes: WorkerProcesses | None = None,
) -> ImportSummary:
    """Write the planned jobs with ``workers`` processes (None: the cores; 1: this process; those ``processes``
    started ahead first), or as Ray tasks (``ray``: True, or a cluster's address)."""
    jobs = plan.jobs
    work = ImportWork(plan.settings)
    executed = run_jobs(work, jobs, workers, ray, progress and bool(jobs), plan.names, _note_failure, processes)
    results = executed.results.values()
    skipped: Counter[str] = Counter()
    for result in results:
        skipped.update(result.skipped)
    return ImportSummary(
        rows=sum(result.rows for result in results),
        shards=sum(len(result.shards) for result in results),
        bytes=sum(result.bytes for result in results),
        skipped=dict(skipped),
        inputs=len(plan.inputs),
        seconds=time.perf_counter() - started,
        processes=executed.processes,
        finished_before=len(plan.finished),
        fields=describe_fields(plan.settings.fields),
        schema=plan.settings.schema,
    )


def import_records(
    sources: Any,
    destination: str | os.PathLike[str],
    *,
    schema: object = None,
    workers: int | None = None,
    shard_size: int | str = DEFAULT_SHARD_SIZE,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    ray: bool | str = False,
) -> ImportSummary:
    """Import ``sources`` into the document storage at ``destination`` (see ``guideloom.importing``).

    ``schema`` gives the fields instead of inferring them: a ``RecordSchema``, a mapping of field names
    to types, a JSON file or ``"module:attribute"``. ``workers`` processes write whole jobs (default: one
    per core, or this process alone for inputs under 8 MiB; 1: this process). ``shard_size`` (an int of
    bytes or a string such as ``"64MiB"``) is the bytes of records after which a shard is committed. Run
    again after an interruption, the same call finishes the import with every row once; over a finished
    import it writes nothing. ``progress=True`` shows a progress bar on stderr. Sources may be object store
    URLs (Parquet, Arrow, JSONL and tar files, or prefixes holding them), read with fsspec's ``storage_options``.

    ``ray=True`` (or a cluster's address) runs one Ray task per job instead of worker processes, on as many
    machines as the cluster has (needs the ``ray`` extra; excludes ``workers``): the same jobs, shards and
    schema, exactly once; every machine must see ``destination`` at the same path (a shared file system).
    """
    started = time.perf_counter()
    check_workers(workers, PYTHON_NAMES.workers)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    destination_path = local_path(destination, "destination")
    if not isinstance(ray, bool | str):
        raise TypeError(f"ray must be a bool or a cluster address, got {type(ray).__name__}")
    inputs = gather_inputs(sources, PYTHON_NAMES, storage_options)
    with start_workers(inputs, workers, ray, shard_size, PYTHON_NAMES) as processes:
        plan = plan_import(inputs, destination_path, schema, shard_size, PYTHON_NAMES, storage_options)
        return execute(plan, workers, progress, started, ray, processes)


def imported_schema(destination: str | os.PathLike[str]) -> RecordSchema:
    """The ``RecordSchema`` of the storage an import wrote at ``destination``, to open it with:
    ``DocumentStorage(destination, imported_schema(destination))``."""
    path = local_path(destination, "destination")
    record = read_inputs(path)
    if record is None:
        raise StorageNotFoundError(f"{path} holds no imported storage (no sources/inputs.json)")
    return record_schema(fields_from_mapping(record["fields"], str(path)))
