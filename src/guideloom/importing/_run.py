"""Running a planned import: in this process or in worker processes, with a progress bar, and what it wrote."""

from __future__ import annotations

import os
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from guideloom._core.errors import StorageNotFoundError
from guideloom._core.text import plural
from guideloom._storage.provenance import read_inputs
from guideloom._storage.storages import local_path
from guideloom.fields import RecordSchema
from guideloom.importing._plan import DEFAULT_SHARD_SIZE, ImportPlan, plan_import
from guideloom.importing._pool import run_pool
from guideloom.importing._schema import describe_fields, fields_from_mapping, record_schema
from guideloom.importing._write import Cancelled, JobResult, import_job

# With ``workers=None`` inputs smaller than this are imported in the calling process: starting worker processes
# (each imports numpy and pyarrow) takes longer than importing a few MB.
AUTO_PARALLEL_MIN_BYTES = 8 << 20


@dataclass(frozen=True)
class OptionNames:
    """How the caller spells each option in messages: Python arguments, or the command's options."""

    workers: str
    shard_size: str
    storage_options: str
    ray: str


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


class _Progress:
    """A tqdm bar of input bytes with rows/s beside it (none when tqdm is missing or progress is off)."""

    def __init__(self, total: int, enabled: bool) -> None:
        self.rows = 0
        self.started = time.perf_counter()
        self.bar: Any = None
        if enabled:
            try:
                from tqdm import tqdm
            except ImportError:
                return
            self.bar = tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="import", file=sys.stderr)

    def update(self, rows: int, size: int) -> None:
        self.rows += rows
        if self.bar is not None:
            elapsed = max(1e-9, time.perf_counter() - self.started)
            self.bar.set_postfix_str(f"{self.rows:,} rows, {self.rows / elapsed:,.0f} rows/s", refresh=False)
            self.bar.update(size)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def _check_workers(workers: object, name: str) -> int | None:
    if workers is None:
        return None
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise ValueError(f"{name} must be a positive int, got {workers!r}")
    return workers


def execute(
    plan: ImportPlan, workers: int | None, progress: bool, started: float, ray: bool | str = False
) -> ImportSummary:
    """Write the planned jobs with ``workers`` processes (None: the cores; 1: this process), or as Ray tasks
    (``ray``: True, or a cluster's address)."""
    if ray is not False and workers is not None:
        raise ValueError(f"{plan.names.workers} and {plan.names.ray} exclude each other: Ray runs one task per job")
    jobs = plan.jobs
    total = sum(job.size for job in jobs)
    count = (os.cpu_count() or 1) if workers is None else workers
    if workers is None and total < AUTO_PARALLEL_MIN_BYTES:
        count = 1
    processes = 0 if count == 1 or len(jobs) <= 1 else min(count, len(jobs))
    results: dict[int, JobResult] = {}
    bar = _Progress(total, progress and bool(jobs))
    update: Callable[[int, int], object] = bar.update
    try:
        if ray is not False and jobs:
            try:
                from guideloom.importing._ray_tasks import run_import_tasks  # Ray is imported only here
            except ModuleNotFoundError as error:
                if error.name != "ray":
                    raise
                raise ImportError(f"{plan.names.ray} needs Ray: pip install 'guideloom[ray]'") from None
            processes = 0
            ray_results, failure = run_import_tasks(jobs, plan.settings, None if ray is True else ray, update)
            results.update(ray_results)
            if failure is not None:
                raise failure
        elif processes:
            pool_results, failure = run_pool(jobs, plan.settings, processes, update)
            results.update(pool_results)
            if failure is not None:
                raise failure
        else:
            for job in jobs:
                results[job.number] = import_job(job, plan.settings, update)
    except BaseException as error:
        if not isinstance(error, Cancelled | KeyboardInterrupt):
            error.add_note("shards committed before the failure stay; run the same import again to finish it")
        raise
    finally:
        bar.close()
    skipped: Counter[str] = Counter()
    for result in results.values():
        skipped.update(result.skipped)
    return ImportSummary(
        rows=sum(result.rows for result in results.values()),
        shards=sum(len(result.shards) for result in results.values()),
        bytes=sum(result.bytes for result in results.values()),
        skipped=dict(skipped),
        inputs=len(plan.inputs),
        seconds=time.perf_counter() - started,
        processes=processes,
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
    workers = _check_workers(workers, PYTHON_NAMES.workers)
    if not isinstance(progress, bool):
        raise TypeError(f"progress must be a bool, got {type(progress).__name__}")
    if storage_options is not None and not isinstance(storage_options, dict):
        raise TypeError(f"storage_options must be a dict, got {type(storage_options).__name__}")
    destination_path = local_path(destination, "destination")
    plan = plan_import(sources, destination_path, schema, shard_size, PYTHON_NAMES, storage_options)
    if not isinstance(ray, bool | str):
        raise TypeError(f"ray must be a bool or a cluster address, got {type(ray).__name__}")
    return execute(plan, workers, progress, started, ray)


def imported_schema(destination: str | os.PathLike[str]) -> RecordSchema:
    """The ``RecordSchema`` of the storage an import wrote at ``destination``, to open it with:
    ``DocumentStorage(destination, imported_schema(destination))``."""
    path = local_path(destination, "destination")
    record = read_inputs(path)
    if record is None:
        raise StorageNotFoundError(f"{path} holds no imported storage (no sources/inputs.json)")
    return record_schema(fields_from_mapping(record["fields"], str(path)))
