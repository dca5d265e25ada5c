"""Parquet files: read with pyarrow, a row group range per piece, in batches (``iter_batches``)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

from guideloom.importing._arrow_columns import binary_columns, fields_of_schema, first_binary_values, rows_of_batch
from guideloom.importing._cores import threads_for
from guideloom.importing._errors import ImportInputError
from guideloom.importing._files import InputPath, open_binary, size_of
from guideloom.importing._stream import Described, Piece, Row

BATCH_ROWS = 4096


SNIFF_BUFFER = 1 << 20  # bytes read at a time where only a column's first rows are wanted


def _open(path: InputPath, options: dict[str, Any] | None, buffer_size: int = 0) -> Any:
    try:
        import pyarrow.parquet as parquet
    except ImportError as error:
        raise ImportError("reading Parquet needs pyarrow: pip install pyarrow") from error
    try:
        source = path if isinstance(path, Path) else open_binary(path, options)
        return parquet.ParquetFile(source, buffer_size=buffer_size, pre_buffer=buffer_size == 0)
    except (FileNotFoundError, PermissionError):
        raise
    except Exception as error:
        raise ImportInputError(f"{path}: not a readable Parquet file ({error})") from None


def _without_nulls(metadata: Any) -> list[str]:
    """The flat columns whose statistics say no row group holds a null: those fields are not optional."""
    if not metadata.num_row_groups:
        return []
    found = []
    for column in range(metadata.num_columns):
        name = metadata.schema.column(column).path
        if "." in name:
            continue
        chunks = [metadata.row_group(group).column(column) for group in range(metadata.num_row_groups)]
        if all(chunk.is_stats_set and chunk.statistics.has_null_count and chunk.statistics.null_count == 0
               for chunk in chunks):  # fmt: skip
            found.append(name)
    return found


def describe(path: InputPath, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    """The file's fields and its pieces: consecutive row groups of about ``shard_size`` bytes each. Binary columns'
    first values say their media kind: read in a buffered stream, so that a few pages are read, not the row group."""
    file = _open(path, options, SNIFF_BUFFER)
    try:
        metadata = file.metadata
        schema = file.schema_arrow
        first: dict[str, Any] = {}
        media = binary_columns(schema)
        if media and metadata.num_row_groups and metadata.num_rows:
            for batch in file.iter_batches(batch_size=16, row_groups=[0], columns=media):
                first = first_binary_values(batch)
                break
        fields = fields_of_schema(schema, first)
        for name in _without_nulls(metadata):
            if name in fields:
                fields[name] = replace(fields[name], optional=False)
        pieces: list[Piece] = []
        groups: list[int] = []
        size = rows = first_row = 0
        for group in range(metadata.num_row_groups):
            facts = metadata.row_group(group)
            groups.append(group)
            size += facts.total_byte_size
            rows += facts.num_rows
            if size >= shard_size or group == metadata.num_row_groups - 1:
                pieces.append(Piece(path, "parquet", first_row, rows, size, (tuple(groups),), options))
                first_row, groups, size, rows = first_row + rows, [], 0, 0
    except ImportInputError:
        raise
    except Exception as error:
        raise ImportInputError(f"{path}: a damaged Parquet file ({error})") from None
    total = sum(piece.size for piece in pieces) or 1
    file_size = size_of(path, options)
    pieces = [replace(piece, size=piece.size * file_size // total) for piece in pieces]  # bytes of the file read
    return Described(fields, pieces)


def batches(piece: Piece, start: int) -> Iterator[tuple[int, Any, int]]:
    """The piece's record batches from row ``start`` of the file on: ``(first row, batch, bytes read after it)``."""
    file = _open(piece.path, piece.options)
    (groups,) = piece.detail
    row = piece.first_row
    metadata = file.metadata
    wanted: list[int] = []
    for group in groups:  # whole row groups before ``start`` are not read at all
        count = metadata.row_group(group).num_rows
        if row + count <= start:
            row += count
            continue
        wanted.append(group)
    total_rows = max(1, piece.rows or 1)
    threads = threads_for(piece.size)
    for group in wanted:  # one row group at a time, so that damage is named with the rows it lies in
        count = metadata.row_group(group).num_rows
        batches = iter(file.iter_batches(batch_size=BATCH_ROWS, row_groups=[group], use_threads=threads))
        while True:
            try:
                batch = next(batches)
            except StopIteration:
                break
            except Exception as error:
                raise ImportInputError(
                    f"{piece.path}: a damaged Parquet file in row group {group} (rows {row} to "
                    f"{row + count - 1}; {error})"
                ) from None
            if row < start:
                skipped = min(batch.num_rows, start - row)
                batch, row = batch.slice(skipped), row + skipped
            if batch.num_rows:
                yield row, batch, piece.size * (row + batch.num_rows - piece.first_row) // total_rows
            row += batch.num_rows


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    """The piece's rows from row ``start`` of the file on."""
    for first, batch, position in batches(piece, start):
        yield from rows_of_batch(piece.path, first, batch, fields, position)
