"""Many records of a ``RecordSchema`` packed at once, field by field, from NumPy columns instead of dicts.

What an importer reading columnar data (Arrow record batches) hands the schema: per field a :class:`FieldColumn`
of all the records' values. :func:`pack_columns` lays them out exactly as ``RecordSchema.pack`` lays out each
record (see docs/format.md, "Records of a RecordSchema"): the table of field ends and the presence bits computed
for all records with NumPy, each field's bytes cut from its column, and the pieces of each record joined in one
pass (pyarrow's ``binary_join_element_wise`` where pyarrow is installed, else slices joined by Python).
Only non-media fields: media keep the record-by-record path.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from guideloom._fields.field_types import NUMBER_KINDS, Array, FieldType, Json, Scalar, Tokens, cast_numbers

MAX_RECORD_BYTES = 2**32 - 1  # the table's uint32 offsets

# One field's bytes for every record: a uint8 array and where each record's bytes start in it (records + 1).
Segment = tuple[np.ndarray, np.ndarray]


@dataclass(frozen=True)
class FieldColumn:
    """One field's values for many records, by kind of field:

    * ``Text``: ``values`` the UTF-8 bytes of all records back to back (uint8), ``offsets`` where each starts;
    * ``Tokens``: ``values`` the ids of all records back to back, ``offsets`` (records + 1) in ids;
    * ``Array``: ``values`` the numbers of all records back to back, each record ``offsets[i + 1] - offsets[i]``
      elements of shape ``inner_shape`` (so the record's array has shape ``(count, *inner_shape)``);
    * ``Scalar``: ``values`` one number per record, no ``offsets``;
    * ``Json``: ``values`` a list of one JSON value per record, no ``offsets``.

    ``present`` (bools, one per record) marks the records that hold the field; None: all of them.
    """

    values: Any
    offsets: np.ndarray | None = None
    present: np.ndarray | None = None
    inner_shape: tuple[int, ...] = ()


def pack_columns(
    fields: Mapping[str, FieldType], stored: Sequence[str], columns: Mapping[str, FieldColumn], rows: int
) -> tuple[np.ndarray, np.ndarray]:
    """``rows`` records of a schema of ``fields`` (``stored``: their names in the stored order) from their fields'
    columns: their bytes back to back (uint8) and each record's size.

    The bytes are those ``RecordSchema.pack`` gives each record. A field left out of ``columns`` is absent from every
    record. A value that does not fit its field is a ValueError or TypeError naming the field, not the record:
    pack the records one by one to find it.
    """
    unknown = [name for name in columns if name not in fields]
    if unknown:
        raise ValueError(f"the columns hold field {unknown[0]!r} that the schema does not")
    optional = any(field.optional for field in fields.values())
    table_size = 4 * len(stored)
    head_size = table_size + ((len(stored) + 7) // 8 if optional else 0)
    sizes = np.zeros((rows, len(stored)), np.int64)
    bits = np.zeros((rows, head_size - table_size), np.uint8)
    pieces: list[tuple[Segment, np.ndarray | None]] = []
    for slot, name in enumerate(stored):
        field, column = fields[name], columns.get(name)
        if field.media and column is not None:
            raise ValueError(f"field {name!r} holds media: pack such records one by one")
        if column is None:
            if not field.optional:
                raise ValueError(f"field {name!r} is missing (only optional=True fields may be left out)")
            continue
        present = column.present
        if present is not None and not field.optional and not present.all():
            raise ValueError(f"field {name!r} is missing (only optional=True fields may be left out)")
        try:
            segments = _field_bytes(field, column, rows)
        except (TypeError, ValueError) as error:
            raise type(error)(f"field {name!r}: {error}") from None
        for data, starts in segments:
            size = np.diff(starts)
            sizes[:, slot] += size if present is None else np.where(present, size, 0)
            pieces.append(((data, starts), present))
        if optional:
            held = np.ones(rows, np.uint8) if present is None else present.astype(np.uint8)
            bits[:, slot // 8] |= held << (slot % 8)
    ends = head_size + np.cumsum(sizes, axis=1)
    if rows and ends[:, -1].max() > MAX_RECORD_BYTES:
        raise ValueError("a record of more than 4 GiB - 1 bytes: a record of a RecordSchema holds at most that")
    head = np.empty((rows, head_size), np.uint8)
    head[:, :table_size] = ends.astype("<u4").view(np.uint8).reshape(rows, table_size)
    head[:, table_size:] = bits
    starts = np.arange(rows + 1, dtype=np.int64) * head_size
    payload = join_rows([((head.reshape(-1), starts), None), *pieces], rows)
    return payload, ends[:, -1]


def _field_bytes(field: FieldType, column: FieldColumn, rows: int) -> list[Segment]:
    """The field's bytes for every record, as one or two segments (an array's dimensions, then its values)."""
    if isinstance(field, Json):
        return [_joined([field.pack(value) for value in column.values], rows)]
    if isinstance(field, Scalar):
        values = _numbers(column.values, rows, "one number per record")
        data = cast_numbers(values, field.dtype)
        return [(data.view(np.uint8), np.arange(rows + 1, dtype=np.int64) * data.itemsize)]
    offsets = _offsets(column.offsets, rows)
    if isinstance(field, Tokens | Array):
        values = np.asarray(column.values)
        if values.dtype.kind not in NUMBER_KINDS:
            raise TypeError(f"expected numbers, got values of {values.dtype}")
        inner = column.inner_shape
        if isinstance(field, Tokens) and inner:
            raise ValueError(f"expected a 1-D sequence of integers per record, got elements of shape {inner}")
        per_element = int(np.prod(inner, dtype=np.int64))
        flat = values.reshape(-1)[int(offsets[0]) * per_element : int(offsets[-1]) * per_element]
        data = cast_numbers(flat, field.dtype).view(np.uint8)
        starts = (offsets - offsets[0]) * (per_element * field.dtype.itemsize)
        if isinstance(field, Tokens):
            return [(data, starts)]
        counts = np.diff(offsets)
        _check_shape(field, counts, inner)
        if field.shape is not None and None not in field.shape:
            return [(data, starts)]
        return [_dimensions(counts, inner), (data, starts)]
    # Text: the UTF-8 bytes as given
    data = np.asarray(column.values, np.uint8)
    return [(data, offsets.astype(np.int64, copy=False))]


def _numbers(values: Any, rows: int, what: str) -> np.ndarray:
    array = np.asarray(values)
    if array.shape != (rows,):
        raise ValueError(f"expected {what}, got an array of shape {array.shape}")
    if array.dtype.kind not in NUMBER_KINDS:
        raise TypeError(f"expected numbers, got values of {array.dtype}")
    return array


def _offsets(offsets: np.ndarray | None, rows: int) -> np.ndarray:
    if offsets is None or len(offsets) != rows + 1:
        raise ValueError(f"a column of {rows} records needs {rows + 1} offsets")
    return np.asarray(offsets, np.int64)


def _check_shape(field: Array, counts: np.ndarray, inner: tuple[int, ...]) -> None:
    """Each record's shape ``(count, *inner)`` against the field's fixed sizes."""
    shape = field.shape
    if shape is None:
        return
    if len(shape) != 1 + len(inner) or any(
        want is not None and want != got for want, got in zip(shape[1:], inner, strict=True)
    ):
        raise ValueError(f"expected arrays of shape {shape}, got arrays of shape (n, {', '.join(map(str, inner))})")
    if shape[0] is not None and counts.size and not (counts == shape[0]).all():
        wrong = int(counts[counts != shape[0]][0])
        raise ValueError(f"expected arrays of shape {shape}, got one of {wrong} rows")


def _dimensions(counts: np.ndarray, inner: tuple[int, ...]) -> Segment:
    """Each record's array dimensions as ``Array`` stores them: one byte, then a uint64 per dimension."""
    ndim = 1 + len(inner)
    shapes = np.empty((len(counts), ndim), "<u8")
    shapes[:, 0] = counts
    shapes[:, 1:] = inner
    head = np.empty((len(counts), 1 + 8 * ndim), np.uint8)
    head[:, 0] = ndim
    head[:, 1:] = shapes.view(np.uint8).reshape(len(counts), 8 * ndim)
    return head.reshape(-1), np.arange(len(counts) + 1, dtype=np.int64) * (1 + 8 * ndim)


def _joined(pieces: list[bytes | memoryview], rows: int) -> Segment:
    sizes = np.fromiter((len(piece) for piece in pieces), np.int64, rows)
    starts = np.zeros(rows + 1, np.int64)
    np.cumsum(sizes, out=starts[1:])
    return np.frombuffer(b"".join(pieces), np.uint8), starts


def join_rows(pieces: list[tuple[Segment, np.ndarray | None]], rows: int) -> np.ndarray:
    """Each record's segments back to back (a segment left out where its ``present`` is False), records in order."""
    try:
        import pyarrow
        import pyarrow.compute
    except ImportError:
        return _join_rows_by_slices(pieces, rows)
    kind = pyarrow.large_binary()
    arrays = []
    for (data, starts), present in pieces:
        validity = None if present is None else pyarrow.array(present, pyarrow.bool_()).buffers()[1]
        buffers = [validity, pyarrow.py_buffer(starts.astype(np.int64, copy=False)), pyarrow.py_buffer(data)]
        arrays.append(pyarrow.Array.from_buffers(kind, rows, buffers))
    nothing = pyarrow.scalar(b"", kind)
    joined = pyarrow.compute.binary_join_element_wise(*arrays, nothing, null_handling="skip")
    _, offsets, data = joined.buffers()
    ends = np.frombuffer(offsets, np.int64, rows + 1, joined.offset * 8)
    return np.frombuffer(data, np.uint8)[int(ends[0]) : int(ends[-1])] if data is not None else np.empty(0, np.uint8)


def _join_rows_by_slices(pieces: list[tuple[Segment, np.ndarray | None]], rows: int) -> np.ndarray:
    """:func:`join_rows` without pyarrow: a slice per segment of each record, joined once."""
    views = [np.ascontiguousarray(data).data.cast("B") for (data, _), _ in pieces]
    bounds = [starts.tolist() for (_, starts), _ in pieces]
    held = [None if present is None else present.tolist() for _, present in pieces]
    parts: list[memoryview] = []
    for row in range(rows):
        for view, starts, present in zip(views, bounds, held, strict=True):
            if present is None or present[row]:
                parts.append(view[starts[row] : starts[row + 1]])
    return np.frombuffer(b"".join(parts), np.uint8)
