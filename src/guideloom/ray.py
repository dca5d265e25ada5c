"""Write a Ray Data dataset into a storage: ``ds.write_datasink(StorageDatasink(storage, column="tokens"))``.

With the Ray executor of ``guideloom tokenize`` and ``guideloom import`` (``_jobs.ray_tasks``), the only
guideloom module that imports Ray (the ``ray`` extra). Write task ``t`` of a write writes
shard ``first + t``, where ``first`` follows the storage's committed shards when the write starts;
Ray numbers write tasks in the dataset's block order, so the ids do not depend on which worker ran
what. A task whose shard an earlier attempt already committed checks the shard holds exactly its
rows and writes nothing. See docs/preprocessing.md for retries, lost tasks and re-runs.

``guideloom.ray.import_records(sources, destination, address=...)`` imports Parquet, saved datasets,
JSONL, WebDataset tars, MDS and LitData folders on a Ray cluster, one task per job (docs/importing.md).
"""

from __future__ import annotations

import os
import zlib
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Any

import numpy as np
import pyarrow as pa
from ray.data import Datasink
from ray.data.block import Block, BlockAccessor

from guideloom import importing
from guideloom._core.errors import ShardExistsError, UnfinishedWriteError
from guideloom._shards.formats import column_splitter
from guideloom._shards.loss_masks import MaskBits, loss_mask_array
from guideloom._shards.record_lengths import checked_length, lengths_bytes
from guideloom._shards.shard_names import check_shard_id
from guideloom._shards.writer import SyncWriter
from guideloom._storage.resumable_write import (
    ShardContents,
    check_same_shard,
    check_write_id,
    committed_digest,
    finish_write,
    remove_leftovers,
    start_write,
)
from guideloom._storage.storages import DocumentStorage, TokenStorage
from guideloom._storage.writers import record_measure

if TYPE_CHECKING:
    from ray.data.datasource.datasink import WriteResult

    from guideloom.importing import ImportSummary

__all__ = ["StorageDatasink", "UnfinishedWriteError", "import_records"]

Storage = TokenStorage | DocumentStorage[Any, Any]
TaskResult = dict[str, int]


class StorageDatasink(Datasink[TaskResult]):
    """A Ray Data sink writing each row (or its ``column``) as one sample of ``storage``.

    For a ``TokenStorage`` a row's value is one document's token ids; without ``column`` the rows
    must have a single column. For a ``DocumentStorage`` a row (a dict), or its ``column``, is one
    record in the storage's format. Each write task writes one shard; ``write_id`` names the write
    so that running it again after a crash of the driver finishes it instead of writing it twice.
    After the write, ``shards`` lists the shards holding its rows and ``records`` counts them.
    A masked token storage (``loss_mask=True``) takes each document's mask from ``loss_mask_column``
    (bools or 0/1, one per token); ``column`` must then name the tokens.
    """

    def __init__(
        self,
        storage: Storage,
        column: str | None = None,
        *,
        write_id: str | None = None,
        loss_mask_column: str | None = None,
    ) -> None:
        if not isinstance(storage, TokenStorage | DocumentStorage):
            raise TypeError(f"storage must be a TokenStorage or DocumentStorage, got {type(storage).__name__}")
        if column is not None and not isinstance(column, str):
            raise TypeError(f"column must be a str or None, got {type(column).__name__}")
        if loss_mask_column is not None and not isinstance(loss_mask_column, str):
            raise TypeError(f"loss_mask_column must be a str or None, got {type(loss_mask_column).__name__}")
        masked = isinstance(storage, TokenStorage) and storage.loss_mask
        if masked and (loss_mask_column is None or column is None):
            raise ValueError(
                f"{storage} is a masked token storage: give column= (the token ids) and loss_mask_column= "
                "(each document's loss mask)"
            )
        if not masked and loss_mask_column is not None:
            raise ValueError(
                f"loss_mask_column applies to a TokenStorage created with loss_mask=True, not to {storage}"
            )
        self.storage: Storage = storage
        self.column = column
        self.loss_mask_column = loss_mask_column
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
        items = self._masked_items(blocks) if self.loss_mask_column is not None else self._items(blocks)
        digest, written = _write_shard(self.storage, shard, items)
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
        remove_leftovers(self.storage.incomplete_files_dir(), self.first_shard, stop)
        finish_write(self.storage, self.write_id, self.shards, self.records)
        if self.storage.is_remote:  # readers of a large remote storage then list only what was committed since
            self.storage.write_index()

    def on_write_failed(self, error: Exception) -> None:
        """On the driver: remove the failed write's files in progress; its committed shards stay."""
        if self.first_shard is not None:
            remove_leftovers(self.storage.incomplete_files_dir(), self.first_shard, None)

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

    def _masked_items(self, blocks: Iterable[Block]) -> Iterator[tuple[Any, Any]]:
        """Each row's token ids and loss mask."""
        assert isinstance(self.storage, TokenStorage) and self.loss_mask_column is not None
        for block in blocks:
            accessor = BlockAccessor.for_block(block)
            if accessor.num_rows() == 0:
                continue
            tokens = _token_rows(block, accessor, _column_name(accessor, self.column), self.storage)
            yield from zip(tokens, accessor.to_numpy(_column_name(accessor, self.loss_mask_column)), strict=True)


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


def _already_encoded(item: tuple[memoryview, int, int]) -> tuple[memoryview, int]:
    return item[0], item[1]


def _given_length(item: tuple[memoryview, int, int]) -> int:
    return item[2]


def _write_shard(storage: Storage, shard: int, items: Iterable[Any]) -> tuple[ShardContents, bool]:
    """Write ``items`` as ``shard``, or check the shard an earlier attempt committed holds exactly them.

    Returns the items' digest and whether this call committed the shard.
    """
    header = storage.create()
    digest = ShardContents()
    masks = MaskBits() if header.loss_mask else None  # the footer's checksum goes on over the packed mask
    measure = None  # a document storage's format's length(), where the storage records lengths
    if isinstance(storage, DocumentStorage):
        measure = record_measure(storage.format, header.record_lengths, storage.location)
    lengths: list[int] = []  # ... and the checksum over the lengths
    committed = committed_digest(storage, header, shard) is not None
    writer: SyncWriter[tuple[memoryview, int, int]] | None = None
    if not committed:
        columns = column_splitter(storage.format, header) if isinstance(storage, DocumentStorage) else None
        given_length = _given_length if measure else None
        writer = SyncWriter(storage.commit_target(), header, _already_encoded, given_length, None, columns)
    written = False
    try:
        for item in items:
            loss_mask = None
            if masks is not None:
                item, loss_mask = item
            length = (
                0 if measure is None else checked_length(measure(item), f"record {digest.records} of shard {shard}")
            )
            payload, element_count = storage.encode(item)
            if measure is not None:
                lengths.append(length)
            if masks is not None:
                loss_mask = loss_mask_array(loss_mask, element_count)
                masks.append(loss_mask)
            digest.update(payload)
            if writer is not None:
                try:
                    writer.append(shard, (payload, element_count, length), loss_mask=loss_mask)
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
    if masks is not None:
        digest.data_crc = zlib.crc32(masks.finish(), digest.data_crc)
    if measure is not None:
        digest.data_crc = zlib.crc32(lengths_bytes(lengths), digest.data_crc)
    if digest.records and not written:
        check_same_shard(storage, header, shard, digest)
    return digest, written


def import_records(
    sources: Any, destination: str | os.PathLike[str], *, address: str | None = None, **options: Any
) -> ImportSummary:
    """``guideloom.importing.import_records`` on the Ray cluster at ``address`` (None: ``RAY_ADDRESS``, else a new
    local cluster), one task per job: the same jobs, shards and schema as worker processes write, exactly once
    (a task that dies is run again and goes on after what its job committed). Every machine must see
    ``destination`` at the same path (a shared file system), and the sources (the same paths, or an object store).
    ``options`` are ``import_records``'s (``schema``, ``shard_size``, ``storage_options``, ``progress``)."""
    return importing.import_records(sources, destination, ray=True if address is None else address, **options)
