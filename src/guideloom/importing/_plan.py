"""Planning an import: the inputs checked, the fields decided, the pieces cut into jobs, what earlier runs committed.

Jobs are what makes an import exactly once. The inputs' pieces, in order, are cut into *jobs* of
consecutive pieces holding at most about ``shard_size`` input bytes, of about equal size (at most
``MAX_PIECES_PER_JOB`` pieces; see :func:`job_ends`); job
``j`` writes its rows, in order, into shards ``j * SHARDS_PER_JOB``, ``+ 1``, ... So the shards an
import writes depend only on its inputs and shard size, never on the workers or on where an earlier
run was killed. Before each commit the shard's provenance file (``_storage.provenance``) is written: the
rows the shard holds and whether it ends its job. What a job has committed is therefore its first
shards, and the last of them says where to go on (the row after its last) or that the job is done.
"""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from guideloom._core.errors import CorruptStorageError
from guideloom._core.sizes import parse_shard_size
from guideloom._shards.layout import holds_storage, is_unfinished_storage
from guideloom._shards.shard_names import MAX_SHARD_ID
from guideloom._storage.provenance import read_inputs, read_shard_sources, write_inputs
from guideloom._storage.storages import DocumentStorage
from guideloom.fields import RecordSchema
from guideloom.importing._errors import ImportInputError
from guideloom.importing._files import InputPath, is_remote
from guideloom.importing._inputs import FORMATS, expand_sources
from guideloom.importing._schema import (
    Fields,
    fields_as_json,
    fields_of_record_schema,
    load_schema,
    merge_fields,
    record_schema,
)
from guideloom.importing._stream import Piece

SHARDS_PER_JOB = 10**6
MAX_JOBS = (MAX_SHARD_ID + 1) // SHARDS_PER_JOB
MAX_PIECES_PER_JOB = 1000  # keeps each shard's provenance file small
DEFAULT_SHARD_SIZE = 256 << 20


@dataclass(frozen=True)
class Resume:
    """What earlier runs committed of a job: its first ``shards`` shards, holding rows up to ``(input, row)``."""

    shards: int = 0
    input: int = -1  #: the input of the last row committed (-1: none)
    row: int = -1  #: that row's index in its input
    finished: bool = False


@dataclass(frozen=True)
class ImportJob:
    """Consecutive pieces written, in order, by one worker into the job's shards."""

    number: int
    pieces: tuple[tuple[int, Piece], ...]  #: (input number, piece)
    resume: Resume = Resume()

    @property
    def first_shard(self) -> int:
        return self.number * SHARDS_PER_JOB

    @property
    def size(self) -> int:
        return sum(piece.size for _, piece in self.pieces)

    def describe(self) -> str:
        paths = sorted({str(piece.path) for _, piece in self.pieces})
        return paths[0] if len(paths) == 1 else f"{len(paths)} inputs, {paths[0]} to {paths[-1]}"


@dataclass(frozen=True)
class ImportSettings:
    """What every worker needs: small and picklable."""

    destination: Path
    schema: RecordSchema  #: what the storage is written with
    fields: Fields  #: what each row is checked against (the schema's fields)
    shard_size: int

    def storage(self) -> DocumentStorage[Any, Any]:
        return DocumentStorage(self.destination, self.schema)


@dataclass(frozen=True)
class ImportPlan:
    settings: ImportSettings
    inputs: list[InputPath]
    jobs: list[ImportJob]  #: the jobs left to write
    finished: list[ImportJob] = field(default_factory=list)  #: jobs earlier runs finished
    names: Any = None  #: how the caller spells the options (``_run.OptionNames``), for messages


WHAT_DIFFERS = {"inputs": "inputs", "shard_size": "shard size", "fields": "fields", "jobs": "jobs (input pieces)"}


def jobs_digest(jobs: list[ImportJob]) -> str:
    """Which rows of which inputs each job holds (input, first row, rows of each piece): what decides the shard ids.

    Sizes are left out, so an input fixed after a bad row (its size changed, its pieces not) is resumed; inputs
    that changed so much that their pieces or jobs moved are refused.
    """
    described = [[job.number, [[number, piece.first_row, piece.rows] for number, piece in job.pieces]] for job in jobs]
    return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:32]


def job_ends(sizes: list[int], shard_size: int) -> list[int]:
    """Where jobs of consecutive pieces of these ``sizes`` end (each job's last piece, by index).

    The pieces make as few jobs as hold at most ``shard_size`` bytes each on average, of about equal size (10 tars
    of 0.16x a shard make 2 jobs of 5, not 6 and 4): a job ends once it holds that size, or before a piece that
    would take it further past the size than it now falls short (8 files of 0.99x half the shard size make 4 jobs
    of 2, not 3 jobs of 3, 3 and 2), or at ``MAX_PIECES_PER_JOB`` pieces. Equal jobs keep workers busy to the end.
    """
    total = sum(sizes)
    target = total / max(1, -(-total // shard_size))
    ends = []
    size = first = 0
    for position, piece_size in enumerate(sizes):
        size += piece_size
        following = sizes[position + 1] if position + 1 < len(sizes) else 0
        nearest = size + following - target > target - size
        if size >= target or nearest or position + 1 - first >= MAX_PIECES_PER_JOB or position + 1 == len(sizes):
            ends.append(position)
            size, first = 0, position + 1
    return ends


def cut_into_jobs(pieces: list[tuple[int, Piece]], shard_size: int) -> list[ImportJob]:
    """The pieces, in order, in jobs of about ``shard_size`` input bytes (see :func:`job_ends`)."""
    jobs: list[ImportJob] = []
    first = 0
    for end in job_ends([piece.size for _, piece in pieces], shard_size):
        jobs.append(ImportJob(len(jobs), tuple(pieces[first : end + 1])))
        first = end + 1
    return jobs


def _describe_all(
    inputs: list[tuple[InputPath, str]], shard_size: int, given: Fields | None, options: dict[str, Any] | None
) -> tuple[Fields, list[Any]]:
    fields: Fields | None = None
    pieces: list[tuple[int, Piece]] = []
    for number, (path, kind) in enumerate(inputs):
        described = FORMATS[kind].describe(path, shard_size, options)
        if given is None:
            try:
                fields = described.fields if fields is None else merge_fields(fields, described.fields, str(path))
            except ValueError as error:
                raise ImportInputError(f"{error}: the inputs do not hold the same fields; give a schema") from None
        pieces.extend((number, piece) for piece in described.pieces)
    chosen = given if given is not None else fields
    assert chosen is not None
    return chosen, pieces


def _check_destination(destination: Path) -> bool:
    """Whether a storage is there already; ValueError for a place an import cannot write."""
    if destination.exists() and not destination.is_dir():
        raise ValueError(f"destination {destination} exists and is not a folder")
    if holds_storage(destination):
        return True
    if destination.is_dir() and not is_unfinished_storage(destination) and any(destination.iterdir()):
        raise ValueError(f"destination {destination} is a non-empty folder that holds no guideloom storage")
    return False


def job_progress(job: ImportJob, destination: Path, committed: set[int]) -> Resume:
    """What is committed of ``job`` among the storage's ``committed`` shards (read from their provenance files)."""
    shards = 0
    last: tuple[list[list[int]], bool] | None = None
    while job.first_shard + shards in committed:
        found = read_shard_sources(destination, job.first_shard + shards)
        if found is None:
            raise CorruptStorageError(
                f"{destination}: shard {job.first_shard + shards} is committed without its provenance file; "
                "it was not written by this import: import into a new destination"
            )
        last = found
        shards += 1
    if last is None:
        return Resume()
    runs, finished = last
    input_, first, count = runs[-1] if runs else (-1, 0, 0)
    return Resume(shards, input_, first + count - 1, finished)


Inputs = list[tuple[InputPath, str]]  # each input and its format, in order


def gather_inputs(sources: object, names: Any, storage_options: dict[str, Any] | None = None) -> Inputs:
    """The inputs the sources stand for (folders and prefixes listed), each with its format."""
    inputs = expand_sources(sources, storage_options)
    if storage_options and not any(is_remote(path) for path, _ in inputs):
        raise ValueError(f"{names.storage_options} apply to sources on an object store, and every source is local")
    return inputs


def local_sizes(inputs: Inputs) -> list[int] | None:
    """Each input's bytes, None where some are on an object store (asking their sizes would cost requests)."""
    if any(is_remote(path) for path, _ in inputs):
        return None
    return [Path(path).stat().st_size for path, _ in inputs]


def plan_import(
    inputs: Inputs,
    destination: Path,
    schema: object,
    shard_size: object,
    names: Any,
    storage_options: dict[str, Any] | None = None,
) -> ImportPlan:
    """Check everything that can be checked before writing, and what earlier runs committed."""
    size = parse_shard_size(shard_size, names.shard_size)
    given = load_schema(schema)
    given_fields = None if given is None else fields_of_record_schema(given)
    fields, pieces = _describe_all(inputs, size, given_fields, storage_options)
    if not fields:
        raise ImportInputError("the inputs hold no fields (no column, no key): nothing to import")
    jobs = cut_into_jobs(pieces, size)
    if len(jobs) > MAX_JOBS:
        raise ValueError(f"{names.shard_size} {size} cuts the inputs into {len(jobs):,} jobs; give a larger one")
    paths = [path for path, _ in inputs]
    record = {
        "inputs": [os.fspath(path) for path in paths],
        "shard_size": size,
        "fields": fields_as_json(fields),
        "jobs": jobs_digest(jobs),
    }
    settings = ImportSettings(destination, given if given is not None else record_schema(fields), fields, size)
    exists = _check_destination(destination)
    storage = settings.storage()  # an existing storage of another format fails here
    recorded = read_inputs(destination) if exists else None
    committed = set(storage.committed_shards()) if exists else set()
    if recorded is not None and recorded != record:
        differs = [WHAT_DIFFERS[key] for key in record if recorded.get(key) != record[key]]
        raise ValueError(
            f"destination {destination} holds an import of other {' and '.join(differs)}; an import is resumed "
            "with the same sources, schema and shard size: import into a new destination"
        )
    if recorded is None and committed:
        raise ValueError(f"destination {destination} holds shards not written by an import: use a new destination")
    storage.create()
    if recorded is None:
        write_inputs(destination, record)
    progressed = [
        ImportJob(job.number, job.pieces, job_progress(job, destination, committed)) if committed else job
        for job in jobs
    ]
    return ImportPlan(
        settings=settings,
        inputs=paths,
        jobs=[job for job in progressed if not job.resume.finished],
        finished=[job for job in progressed if job.resume.finished],
        names=names,
    )
