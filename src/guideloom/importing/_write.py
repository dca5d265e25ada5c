"""One job into its shards: the unit of work of every executor (this process, worker processes).

:func:`import_job` reads the job's pieces in order from where earlier runs stopped, checks each row
against the fields, and appends it to the job's current shard. A shard that reaches the shard size is
committed when the next row arrives (so the job's last shard is always known as the last), each commit
preceded by the shard's provenance file. Raising commits nothing of the shard in progress.
"""

from __future__ import annotations

import json
import traceback
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np

from guideloom._core.errors import RecordPackError
from guideloom._jobs.work import Cancelled, picklable
from guideloom._shards.record_lengths import defines_length
from guideloom._storage.provenance import write_shard_sources
from guideloom._storage.storages import bulk_writer
from guideloom.importing._arrow_columns import CheckedRow, packed_batch, rows_of_batch
from guideloom.importing._cores import threads_for
from guideloom.importing._errors import ImportInputError
from guideloom.importing._inputs import COLUMNAR_FORMATS, FORMATS
from guideloom.importing._plan import ImportJob, ImportSettings, job_progress
from guideloom.importing._read_ahead import read_ahead
from guideloom.importing._schema import conform_row
from guideloom.importing._stream import Piece, Row, Skipped

PackedRecords = tuple[np.ndarray, np.ndarray]  # records' bytes back to back, and each one's size

CANCEL_CHECK_ROWS = 256  # rows between two looks at whether the run was cancelled
REPORT_ROWS = 1024  # rows between two progress reports


def _never() -> bool:
    return False


def _ignore(rows: int, size: int) -> None:
    del rows, size


@dataclass
class JobResult:
    """What one run of a job wrote."""

    rows: int = 0
    bytes: int = 0  #: input bytes read
    shards: list[int] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def record_size(record: dict[str, Any]) -> int:
    """About the bytes a record takes in its shard: what decides when a shard is full."""
    size = 0
    for value in record.values():
        if isinstance(value, str):
            size += len(value)
        elif isinstance(value, bytes):
            size += len(value)
        elif isinstance(value, np.ndarray):
            size += value.nbytes
        elif isinstance(value, list) and value and isinstance(value[0], bytes):
            size += sum(len(item) for item in value)
        elif isinstance(value, int | float | bool) or value is None:
            size += 8
        else:
            size += len(json.dumps(value, default=str))
    return size


class JobShards:
    """The job's shards: rows appended in order, a full shard committed (with its provenance) at the next row."""

    def __init__(self, settings: ImportSettings, job: ImportJob, result: JobResult) -> None:
        self._settings = settings
        self._storage = settings.storage()
        self._result = result
        self._writer: Any = None
        self.shard = job.first_shard + job.resume.shards
        self._runs: list[list[int]] = []
        self._bytes = 0

    def append(self, input_number: int, row: int, record: dict[str, Any]) -> None:
        self._writer_with_room().append(self.shard, record)
        self._note_rows(input_number, row, 1)
        self._bytes += record_size(record)

    def append_packed(self, input_number: int, first_row: int, records: PackedRecords) -> None:
        """Rows ``first_row`` on of an input, packed at once: cut where the row by row path would cut shards."""
        payload, sizes = records
        before = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=before[1:])
        done = 0
        while done < len(sizes):
            writer = self._writer_with_room()
            # the rows that start while the shard holds less than the shard size
            taken = int(np.searchsorted(before[done:-1] - before[done], self._settings.shard_size - self._bytes))
            taken = max(1, taken)
            writer.append_encoded(self.shard, payload[before[done] : before[done + taken]], sizes[done : done + taken])
            self._note_rows(input_number, first_row + done, taken)
            self._bytes += int(before[done + taken] - before[done])
            done += taken

    def _writer_with_room(self) -> Any:
        """The writer, the shard in progress committed first if it holds the shard size already."""
        if self._bytes >= self._settings.shard_size:
            self._commit(last=False)
        if self._writer is None:
            self._writer = bulk_writer(self._storage)  # gigabytes nobody reads soon: past the page cache
        return self._writer

    def _note_rows(self, input_number: int, row: int, count: int) -> None:
        runs = self._runs
        if runs and runs[-1][0] == input_number and runs[-1][1] + runs[-1][2] == row:
            runs[-1][2] += count
        else:
            runs.append([input_number, row, count])
        self._result.rows += count

    def _commit(self, last: bool) -> None:
        write_shard_sources(self._settings.destination, self.shard, self._runs, last)
        self._writer.commit(self.shard)
        self._result.shards.append(self.shard)
        self.shard += 1
        self._runs, self._bytes = [], 0

    def finish(self) -> None:
        """Commit the job's last shard (an empty job commits none)."""
        if self._runs:
            self._commit(last=True)

    def __enter__(self) -> JobShards:
        return self

    def __exit__(self, kind: type[BaseException] | None, error: BaseException | None, trace: Any) -> None:
        if self._writer is not None:  # by an error: the shard in progress is discarded, never committed
            self._writer.close(commit=error is None)


@dataclass(frozen=True)
class PackedRows:
    """Consecutive rows of an input packed at once: rows ``first`` on, ``records`` their bytes and sizes."""

    first: int
    records: PackedRecords
    position: int  #: input bytes read after them

    @property
    def count(self) -> int:
        return len(self.records[1])


def piece_items(piece: Piece, settings: ImportSettings, start: int) -> Iterator[Row | PackedRows]:
    """The piece's rows from row ``start`` on; record batches of a columnar format packed whole where they can be."""
    columnar = COLUMNAR_FORMATS.get(piece.kind)
    if columnar is None or defines_length(settings.schema):
        yield from FORMATS[piece.kind].rows(piece, settings.fields, start)
        return
    batches = columnar.batches(piece, start)
    for first, batch, position in read_ahead(batches) if threads_for(piece.size) else batches:
        packed = packed_batch(batch, settings.fields, settings.schema)
        if packed is None:
            yield from rows_of_batch(piece.path, first, batch, settings.fields, position)
        else:
            yield PackedRows(first, packed, position)


def import_job(
    job: ImportJob,
    settings: ImportSettings,
    report: Callable[[int, int], object] = _ignore,
    cancelled: Callable[[], bool] = _never,
) -> JobResult:
    """Write ``job`` after what its ``resume`` says is committed; ``report(rows, bytes)`` tells progress."""
    result = JobResult()
    fields = settings.fields
    resume = job.resume
    with JobShards(settings, job, result) as shards:
        for input_number, piece in job.pieces:
            if input_number < resume.input:
                continue
            if piece.rows is not None and input_number == resume.input and piece.first_row + piece.rows <= resume.row:
                continue
            start = resume.row + 1 if input_number == resume.input else 0
            reported_rows, reported_bytes = result.rows, 0
            unchecked = 0  # rows since the last look at cancelling
            for item in piece_items(piece, settings, start):
                if isinstance(item, PackedRows):
                    shards.append_packed(input_number, item.first, item.records)
                    unchecked, position = unchecked + item.count, item.position
                else:
                    row, values, position = item
                    unchecked += 1
                    if isinstance(values, Skipped):
                        result.skipped[values.reason] += 1
                        continue
                    try:
                        record = values if type(values) is CheckedRow else conform_row(fields, values)
                    except ValueError as error:
                        raise ImportInputError(f"{piece.path}: row {row} does not fit the schema: {error}") from None
                    try:
                        shards.append(input_number, row, record)
                    except RecordPackError as error:
                        problem = error.__cause__ or error
                        raise ImportInputError(f"{piece.path}: row {row} does not fit the schema: {problem}") from None
                if unchecked >= CANCEL_CHECK_ROWS:
                    unchecked = 0
                    if cancelled():
                        raise Cancelled
                    if result.rows - reported_rows >= REPORT_ROWS:
                        report(result.rows - reported_rows, position - reported_bytes)
                        reported_rows, reported_bytes = result.rows, position
            report(result.rows - reported_rows, piece.size - reported_bytes)
            result.bytes += piece.size
        shards.finish()
    return result


def import_job_again(job: ImportJob, settings: ImportSettings) -> tuple[str, Any, str | None]:
    """``job`` for executors that may run it again (Ray): ``("done", result, None)`` or ``("failed", error, trace)``.

    An attempt goes on after what is committed of the job now: an earlier attempt may have died after
    committing some of its shards (or all: then it writes nothing).
    """
    try:
        committed = set(settings.storage().committed_shards())
        now = replace(job, resume=job_progress(job, settings.destination, committed))
        if now.resume.finished:
            return "done", JobResult(), None
        return "done", import_job(now, settings), None
    except Exception as error:
        return "failed", picklable(error), traceback.format_exc()
