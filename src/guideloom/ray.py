"""Write a Ray Data dataset into a storage: ``ds.write_datasink(StorageDatasink(storage, column="tokens"))``.

The only guideloom module that imports Ray (the ``ray`` extra). Write task ``t`` of a write writes
shard ``first + t``, where ``first`` follows the storage's committed shards when the write starts;
Ray numbers write tasks in the dataset's block order, so the ids do not depend on which worker ran
what. A task whose shard an earlier attempt already committed checks the shard holds exactly its
rows and writes nothing. See docs/preprocessing.md for retries, lost tasks and re-runs.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
import ray
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from guideloom._errors import ShardExistsError, TokenizeWorkerDied, UnfinishedWriteError
from guideloom._layout import INCOMPLETE_DIR, check_shard_id
from guideloom._resumable_write import (
    ShardDigest,
    check_same_shard,
    check_write_id,
    committed_digest,
    finish_write,
    remove_leftovers,
    start_write,
)
from guideloom._storage import DocumentStorage, TokenStorage
from guideloom._writer import SyncWriter
from guideloom.tokenize._plan import FileJob, Settings
from guideloom.tokenize._pool import STOP_GRACE_SECONDS, RemoteTraceback
from guideloom.tokenize._shard import tokenize_job

if TYPE_CHECKING:
    from ray.data.datasource.datasink import WriteResult

__all__ = ["StorageDatasink", "UnfinishedWriteError"]

Storage = TokenStorage | DocumentStorage[Any, Any]
TaskResult = dict[str, int]


class StorageDatasink(Datasink[TaskResult]):
    """A Ray Data sink writing each row (or its ``column``) as one sample of ``storage``.

    For a ``TokenStorage`` a row's value is one document's token ids; without ``column`` the rows
    must have a single column. For a ``DocumentStorage`` a row (a dict), or its ``column``, is one
    record in the storage's format. Each write task writes one shard; ``write_id`` names the write
    so that running it again after a crash of the driver finishes it instead of writing it twice.
    After the write, ``shards`` lists the shards holding its rows and ``records`` counts them.
    """

    def __init__(self, storage: Storage, column: str | None = None, *, write_id: str | None = None) -> None:
        if not isinstance(storage, TokenStorage | DocumentStorage):
            raise TypeError(f"storage must be a TokenStorage or DocumentStorage, got {type(storage).__name__}")
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a str or None, got {type(column).__name__}")
        self.storage: Storage = storage
        self.column = column
        self.write_id = check_write_id(write_id)
        self.first_shard: int | None = None
        self.shards: list[int] = []
        self.records = 0

    def on_write_start(self, schema: pa.Schema | None = None) -> None:
        """On the driver, before any task: create the storage and fix the write's first shard id."""
        self.storage.create()
        self.first_shard = start_write(self.storage, self.write_id)

    def write(self, blocks: Iterable[Block], ctx: Any) -> TaskResult:
        """One write task: its blocks, in order, become shard ``first_shard + ctx.task_idx``."""
        if self.first_shard is None:
            raise RuntimeError("StorageDatasink.write ran before on_write_start")
        shard = check_shard_id(self.first_shard + ctx.task_idx)
        digest, written = _write_shard(self.storage, shard, self._items(blocks))
        return {"task": ctx.task_idx, "shard": shard, "records": digest.records, "written": int(written)}

    def on_write_complete(self, write_result: WriteResult[TaskResult] | list[TaskResult]) -> None:
        """On the driver: remove what dead attempts left and mark a named write finished."""
        returns = write_result if isinstance(write_result, list) else write_result.write_returns  # older Ray: a list
        results = [result for result in returns if result is not None]
        self.shards = sorted(result["shard"] for result in results if result["records"])
        self.records = sum(result["records"] for result in results)
        if self.first_shard is None:  # an empty dataset: no task ran
            return
        stop = self.first_shard + max((result["task"] for result in results), default=-1) + 1
        remove_leftovers(_incomplete(self.storage), self.first_shard, stop)
        finish_write(self.storage, self.write_id, self.shards, self.records)

    def on_write_failed(self, error: Exception) -> None:
        """On the driver: remove the failed write's files in progress; its committed shards stay."""
        if self.first_shard is not None:
            remove_leftovers(_incomplete(self.storage), self.first_shard, None)

    def _items(self, blocks: Iterable[Block]) -> Iterator[Any]:
        for block in blocks:
            accessor = BlockAccessor.for_block(block)
            if accessor.num_rows() == 0:
                continue
            if isinstance(self.storage, TokenStorage):
                yield from _token_rows(block, accessor, _column_name(accessor, self.column), self.storage)
            elif self.column is None:
                yield from accessor.iter_rows(public_row_format=True)
            else:
                column = _column_name(accessor, self.column)
                row: dict[str, Any]
                for row in accessor.iter_rows(public_row_format=True):
                    yield row[column]


def _column_name(accessor: BlockAccessor, column: str | None) -> str:
    schema: Any = accessor.schema()
    names = [str(name) for name in schema.names]
    if column is None:
        if len(names) != 1:
            raise ValueError(f"column must name the column of token ids: the rows have the columns {names}")
        return names[0]
    if column not in names:
        raise ValueError(f"column {column!r} is not in the rows, whose columns are {names}")
    return column


def _token_rows(block: Block, accessor: BlockAccessor, column: str, storage: TokenStorage) -> Iterator[Any]:
    """Each row's token ids; an Arrow list column is converted to the stored dtype once per chunk."""
    if isinstance(block, pa.Table):
        values = block.column(column)
        if (pa.types.is_list(values.type) or pa.types.is_large_list(values.type)) and pa.types.is_integer(
            values.type.value_type
        ):
            for chunk in values.chunks:
                yield from _list_rows(chunk, column, storage)
            return
    yield from accessor.to_numpy(column)


def _list_rows(chunk: pa.ListArray, column: str, storage: TokenStorage) -> Iterator[np.ndarray]:
    if len(chunk) == 0:
        return
    if chunk.null_count:
        raise ValueError(f"column {column!r} has a row without token ids (null)")
    offsets = chunk.offsets.to_numpy()
    flat = chunk.values.slice(offsets[0], offsets[-1] - offsets[0])
    if flat.null_count:
        raise ValueError(f"column {column!r} has a null token id")
    payload, _ = storage.encode(flat.to_numpy(zero_copy_only=False))  # every id checked against the dtype once
    tokens = np.frombuffer(payload, storage.encoder.stored_dtype)
    offsets = offsets - offsets[0]
    for start, stop in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True):
        yield tokens[start:stop]  # already as stored: written without conversion


def _incomplete(storage: Storage) -> Path:
    """Where this machine's writers of the storage build shards (an object store's: in its local cache)."""
    target = storage.commit_target()
    return target / INCOMPLETE_DIR if isinstance(target, Path) else target.incomplete


def _already_encoded(item: tuple[memoryview, int]) -> tuple[memoryview, int]:
    return item


def _write_shard(storage: Storage, shard: int, items: Iterable[Any]) -> tuple[ShardDigest, bool]:
    """Write ``items`` as ``shard``, or check the shard an earlier attempt committed holds exactly them.

    Returns the items' digest and whether this call committed the shard.
    """
    header = storage.create()
    digest = ShardDigest()
    committed = committed_digest(storage, header, shard) is not None
    writer: SyncWriter[tuple[memoryview, int]] | None = None
    if not committed:
        writer = SyncWriter(storage.commit_target(), header, _already_encoded)
    written = False
    try:
        for item in items:
            payload, element_count = storage.encode(item)
            digest.update(payload)
            if writer is not None:
                try:
                    writer.append(shard, (payload, element_count))
                except ShardExistsError:  # another attempt of this task committed it meanwhile
                    writer.close(commit=False)
                    writer = None
        if writer is not None:
            try:
                writer.close()  # commits the shard, if the task had any rows
                written = digest.records > 0
            except ShardExistsError:
                pass
    finally:
        if writer is not None:
            writer.close(commit=False)  # after an error; does nothing once closed
    if digest.records and not written:
        check_same_shard(storage, header, shard, digest)
    return digest, written


# --- guideloom tokenize --ray: one Ray task per input file ---------------------------------------------


def run_tokenize_tasks(
    jobs: list[FileJob], settings: Settings, address: str | None, update: Callable[[int], object]
) -> tuple[dict[int, tuple[int, int]], BaseException | None]:
    """Tokenize ``jobs`` as Ray tasks (largest first): the results by shard, and the first failure (or None).

    Connects to the cluster at ``address`` (None: ``RAY_ADDRESS`` or a new local cluster) unless Ray is
    already initialised in this process. The first failure cancels the other tasks; their shards in
    progress are not committed. A task whose worker dies is retried by Ray.
    """
    started_here = not ray.is_initialized()
    if started_here:
        ray.init(address=address, log_to_driver=False, logging_level=logging.ERROR)
    task = ray.remote(num_cpus=1, max_retries=3)(tokenize_job)  # a Ray-free function: workers import little
    pending = {task.remote(job, settings): job for job in sorted(jobs, key=lambda job: -job.size)}
    results: dict[int, tuple[int, int]] = {}
    failure: BaseException | None = None
    try:
        while pending and failure is None:
            [ready], _ = ray.wait(list(pending), num_returns=1)
            job = pending.pop(ready)
            try:
                kind, payload, trace = ray.get(ready)
            except ray.exceptions.RayError as error:  # retries exhausted: its worker kept dying
                failure = TokenizeWorkerDied(
                    f"the Ray task writing shard {job.shard} ({job.path}) failed: {error}; its shard was not committed"
                )
                continue
            if kind == "done":
                results[job.shard] = payload
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
        shards = [job.shard for job in jobs]
        remove_leftovers(_incomplete(settings.storage()), min(shards), max(shards) + 1)  # of killed attempts
    return results, failure
