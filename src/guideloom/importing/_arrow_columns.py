"""Arrow tables as records: the fields an Arrow schema holds, and a record batch's rows as dicts.

Shared by Parquet files and Hugging Face datasets' Arrow files. Types map to fields as: strings ->
``Text``; booleans, integers and floats -> ``Scalar(dtype)``; lists of integers -> ``Tokens(dtype)``;
lists of floats, and lists of fixed-size lists of numbers -> ``Array(dtype)``; binary -> ``Image`` /
``Audio`` / ``Video`` when its first value starts as such a file does, else ``Array(uint8)`` (a struct of
``bytes`` and ``path`` likewise, by its bytes); anything
else (ragged nested lists, structs, lists of strings, maps, nulls) -> ``Json``; dates, times and
decimals -> ``Text``. A Hugging Face
``Image()`` / ``Audio()`` / ``Video()`` feature (the schema's ``huggingface`` metadata) becomes that media
field, a list of ``Image()`` an ``Images()`` field, an ``Array2D`` ... ``Array5D`` an ``Array`` of its shape;
a ``ClassLabel`` stays a ``Scalar``.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import numpy as np

from guideloom._fields.record_columns import FieldColumn
from guideloom._shards.record_lengths import defines_length
from guideloom.fields import RecordSchema
from guideloom.importing._errors import ImportInputError
from guideloom.importing._schema import Fields, FieldSpec
from guideloom.importing._stream import Row

MEDIA_MAGIC = (
    (b"\xff\xd8\xff", "image"),
    (b"\x89PNG\r\n\x1a\n", "image"),
    (b"GIF8", "image"),
    (b"fLaC", "audio"),
    (b"ID3", "audio"),
    (b"OggS", "audio"),
    (b"\x1aE\xdf\xa3", "video"),  # Matroska / WebM
)
HF_MEDIA = {"Image": "image", "Audio": "audio", "Video": "video"}


def sniff_media(data: bytes | None) -> str | None:
    """``"image"``, ``"audio"`` or ``"video"`` when ``data`` starts as such a file does, else None."""
    if not data:
        return None
    for magic, kind in MEDIA_MAGIC:
        if data.startswith(magic):
            return kind
    if data[:4] == b"RIFF" and data[8:12] in (b"WEBP", b"WAVE"):
        return "image" if data[8:12] == b"WEBP" else "audio"
    if data[4:8] == b"ftyp":
        return "video"
    return None


def hf_features(schema: Any) -> dict[str, Any]:
    """The Hugging Face features recorded in an Arrow schema's metadata (empty when there are none)."""
    metadata = schema.metadata or {}
    raw = metadata.get(b"huggingface")
    if raw is None:
        return {}
    try:
        info = json.loads(raw)
        features = info.get("info", {}).get("features", {})
    except (ValueError, AttributeError):
        return {}
    return features if isinstance(features, dict) else {}


def _hf_media(feature: object) -> tuple[str, bool] | None:
    """``(media kind, is a list)`` of a Hugging Face feature, None when it is not a media feature."""
    if isinstance(feature, dict):
        kind = HF_MEDIA.get(str(feature.get("_type")))
        if kind is not None:
            return kind, False
        if feature.get("_type") in ("Sequence", "List", "LargeList"):
            inner = _hf_media(feature.get("feature"))
            return (inner[0], True) if inner is not None and not inner[1] else None
    if isinstance(feature, list) and len(feature) == 1:
        inner = _hf_media(feature[0])
        return (inner[0], True) if inner is not None and not inner[1] else None
    return None


def _hf_array(feature: object) -> FieldSpec | None:
    """The field of a Hugging Face ``Array2D`` ... ``Array5D`` feature (an Arrow extension type): an ``Array``."""
    if not isinstance(feature, dict) or feature.get("_type") not in ("Array2D", "Array3D", "Array4D", "Array5D"):
        return None
    try:
        shape = tuple(None if size is None else int(size) for size in feature["shape"])
        return FieldSpec("array", np.dtype(feature["dtype"]).name, shape=shape)
    except (KeyError, TypeError, ValueError):
        return None


def _numeric_leaf(arrow_type: Any) -> tuple[Any, int]:
    """The innermost value type of nested lists, and how deep it lies."""
    import pyarrow.types as types

    depth = 0
    while types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type):
        arrow_type = arrow_type.value_type
        depth += 1
    return arrow_type, depth


def _fixed_shape(arrow_type: Any) -> tuple[int | None, ...]:
    import pyarrow.types as types

    shape: list[int | None] = []
    while types.is_list(arrow_type) or types.is_large_list(arrow_type) or types.is_fixed_size_list(arrow_type):
        shape.append(arrow_type.list_size if types.is_fixed_size_list(arrow_type) else None)
        arrow_type = arrow_type.value_type
    return tuple(shape)


def field_of_type(arrow_type: Any, nullable: bool, first_value: Any = None) -> FieldSpec:
    """The field an Arrow type becomes (see the module's docstring); ``first_value`` decides binary columns."""
    import pyarrow.types as types

    optional = bool(nullable)
    if types.is_dictionary(arrow_type):  # dictionary-encoded (a pandas category): its values' type
        arrow_type = arrow_type.value_type
    if types.is_string(arrow_type) or types.is_large_string(arrow_type):
        return FieldSpec("text", optional=optional)
    if types.is_boolean(arrow_type):
        return FieldSpec("scalar", "bool", optional)
    if types.is_integer(arrow_type) or types.is_floating(arrow_type):
        return FieldSpec("scalar", np.dtype(arrow_type.to_pandas_dtype()).name, optional)
    if types.is_binary(arrow_type) or types.is_large_binary(arrow_type) or types.is_fixed_size_binary(arrow_type):
        media = sniff_media(first_value if isinstance(first_value, bytes) else None)
        return FieldSpec(media, optional=optional) if media else FieldSpec("array", "uint8", optional)
    if _is_bytes_struct(arrow_type):  # {bytes, path}: how Hugging Face and others store media without metadata
        media = sniff_media(first_value if isinstance(first_value, bytes) else None)
        if media is not None:
            return FieldSpec(media, optional=optional)
    if types.is_temporal(arrow_type) or types.is_decimal(arrow_type):
        return FieldSpec("text", optional=optional)
    leaf, depth = _numeric_leaf(arrow_type)
    if depth and (types.is_integer(leaf) or types.is_floating(leaf) or types.is_boolean(leaf)):
        dtype = "bool" if types.is_boolean(leaf) else np.dtype(leaf.to_pandas_dtype()).name
        if depth == 1 and types.is_integer(leaf):
            return FieldSpec("tokens", dtype, optional)
        shape = _fixed_shape(arrow_type)
        if None not in shape[1:]:  # rectangular: only the outer length may vary
            return FieldSpec("array", dtype, optional, shape)
    return FieldSpec("json", optional=optional)


def fields_of_schema(schema: Any, first_values: dict[str, Any] | None = None) -> Fields:
    """The fields of an Arrow schema, its Hugging Face features deciding media columns."""
    features = hf_features(schema)
    fields: Fields = {}
    for field in schema:
        media = _hf_media(features.get(field.name))
        if media is not None:
            kind, is_list = media
            fields[field.name] = FieldSpec("images" if is_list and kind == "image" else kind, optional=field.nullable)
            if is_list and kind != "image":
                fields[field.name] = FieldSpec("json", optional=field.nullable)
            continue
        array = _hf_array(features.get(field.name))
        if array is not None:
            fields[field.name] = replace(array, optional=field.nullable)
            continue
        first = (first_values or {}).get(field.name)
        fields[field.name] = field_of_type(field.type, field.nullable, first)
    return fields


def _is_bytes_struct(arrow_type: Any) -> bool:
    """Whether a type is a struct with a binary ``bytes`` field (and maybe a ``path``)."""
    import pyarrow.types as types

    if not types.is_struct(arrow_type):
        return False
    names = {arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)}
    data = names.get("bytes")
    return (
        data is not None and (types.is_binary(data) or types.is_large_binary(data)) and set(names) <= {"bytes", "path"}
    )


def binary_columns(schema: Any) -> list[str]:
    """The columns of an Arrow schema whose values may be media: binary ones, and ``{bytes, path}`` structs."""
    import pyarrow.types as types

    return [
        field.name
        for field in schema
        if types.is_binary(field.type) or types.is_large_binary(field.type) or _is_bytes_struct(field.type)
    ]


def first_binary_values(batch: Any) -> dict[str, Any]:
    """The first non-null value of each binary column (or ``bytes`` of a ``{bytes, path}`` struct) of a record batch:
    what decides its media kind."""
    import pyarrow.types as types

    values: dict[str, Any] = {}
    for name, column in zip(batch.schema.names, batch.columns, strict=True):
        if _is_bytes_struct(column.type):
            column = column.field("bytes")
        if types.is_binary(column.type) or types.is_large_binary(column.type):
            valid = column.drop_null()
            if len(valid):
                values[name] = valid[0].as_py()
    return values


def _media_values(column: Any) -> list[Any]:
    """A Hugging Face media column (a struct of ``bytes`` and ``path``, or plain binary) as bytes per row."""
    import pyarrow.types as types

    if types.is_struct(column.type):
        names = [column.type.field(i).name for i in range(column.type.num_fields)]
        if "bytes" in names:
            data = column.field("bytes").to_pylist()
            paths = column.field("path").to_pylist() if "path" in names else [None] * len(column)
            valid = column.is_valid().to_pylist()
            return [
                (value if value is not None or path is None else _PathOnly(path)) if ok else None
                for value, path, ok in zip(data, paths, valid, strict=True)
            ]
    return list(column.to_pylist())


class _PathOnly(str):
    """A media value that names a file instead of holding its bytes (not imported: the row is refused)."""


def _list_arrays(column: Any, spec: FieldSpec) -> list[Any] | None:
    """A list column of numbers (of fixed-size lists of numbers) as one NumPy array per row, cut from the column's
    values without Python lists."""
    import pyarrow.types as types

    if not (types.is_list(column.type) or types.is_large_list(column.type) or types.is_fixed_size_list(column.type)):
        return None
    found = _list_column(column, None)
    if found is None:
        return None
    assert found.offsets is not None
    offsets = found.offsets - found.offsets[0]
    per_element = int(np.prod(found.inner_shape, dtype=np.int64))
    first = int(found.offsets[0]) * per_element
    values = found.values[first : first + int(offsets[-1]) * per_element].reshape(-1, *found.inner_shape)
    arrays: list[Any] = np.split(values, offsets[1:-1]) if len(column) else []
    if column.null_count:
        valid = column.is_valid().to_pylist()
        arrays = [array if ok else None for array, ok in zip(arrays, valid, strict=True)]
    return arrays


def column_values(column: Any, spec: FieldSpec) -> list[Any]:
    """One column of a record batch as values per row, ready for :func:`conform` (arrays for tokens and arrays)."""
    import pyarrow

    if isinstance(column.type, pyarrow.ExtensionType):  # Hugging Face's ArrayND: nested lists underneath
        column = column.storage
    if pyarrow.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if spec.kind in ("image", "audio", "video"):
        return _media_values(column)
    if spec.kind == "images":
        import pyarrow.types as types

        if types.is_list(column.type) or types.is_large_list(column.type):
            inner = _media_values(column.flatten())
            offsets = column.offsets.to_numpy()
            valid = column.is_valid().to_pylist()
            return [
                inner[start - offsets[0] : stop - offsets[0]] if ok else None
                for start, stop, ok in zip(offsets[:-1].tolist(), offsets[1:].tolist(), valid, strict=True)
            ]
    if spec.kind in ("tokens", "array"):
        arrays = _list_arrays(column, spec)
        if arrays is not None:
            return arrays
        if spec.dtype == "uint8" and not spec.shape:
            return [None if value is None else np.frombuffer(value, np.uint8) for value in column.to_pylist()]
    if spec.kind == "text":
        import pyarrow.types as types

        if not (types.is_string(column.type) or types.is_large_string(column.type)):
            return [None if value is None else str(value) for value in column.to_pylist()]
    return list(column.to_pylist())


def _fits_whole(column: Any, spec: FieldSpec) -> bool:
    """Whether every value of an Arrow column fits its field, from the column's type and null count alone."""
    if column.null_count and not spec.optional:
        return False
    found = field_of_type(column.type, True, None)
    if spec.kind in ("image", "audio", "video", "images", "json"):
        return True  # media bytes and JSON values: the schema's own checks name a bad one
    if found.kind != spec.kind or (spec.shape is not None and found.shape != spec.shape):
        return False
    if spec.dtype is None or found.dtype is None:
        return found.dtype == spec.dtype
    return bool(np.can_cast(found.dtype, spec.dtype, "safe"))


class CheckedRow(dict):  # type: ignore[type-arg]
    """A row whose values are known to fit the fields (from its Arrow batch's types): not checked again one by one."""


def batch_rows(batch: Any, fields: Fields) -> list[dict[str, Any]]:
    """The rows of an Arrow record batch as dicts, each column converted as its field stores it.

    When the batch's columns are the fields and their types fit them (no null where a field is not optional,
    dtypes that cast safely), the rows are :class:`CheckedRow` values, which the import does not check again.
    """
    names = batch.schema.names
    columns = [
        column_values(column, fields[name]) if name in fields else column.to_pylist()
        for name, column in zip(names, batch.columns, strict=True)
    ]
    complete = set(names) >= {name for name, spec in fields.items() if not spec.optional}
    fits = complete and all(
        name in fields and _fits_whole(column, fields[name]) for name, column in zip(names, batch.columns, strict=True)
    )
    kind = CheckedRow if fits else dict
    return [kind(zip(names, values, strict=True)) for values in zip(*columns, strict=True)]


def rows_of_batch(path: object, first: int, batch: Any, fields: Fields, position: int) -> Iterator[Row]:
    """The rows of a record batch whose first row is row ``first`` of input ``path``, as a source's rows."""
    try:
        rows = batch_rows(batch, fields)
    except Exception as error:  # say, text that is not UTF-8 in an Arrow file
        last = first + batch.num_rows - 1
        raise ImportInputError(
            f"{path}: rows {first} to {last} cannot be read ({type(error).__name__}: {error})"
        ) from None
    for row, values in enumerate(rows, first):
        yield row, values, position


# --- whole batches packed at once ---------------------------------------------------------------------------------


def packed_batch(batch: Any, fields: Fields, schema: RecordSchema) -> tuple[np.ndarray, np.ndarray] | None:
    """The records of a record batch packed at once, field by field: their bytes back to back and each record's
    size, the same bytes ``schema.pack`` gives each row of :func:`batch_rows`.

    None where the batch must go row by row: a media field, a schema with a ``length``, a column that does not
    fit its field whole, a type packed only from Python values, or a value that does not fit (the rows then name it).
    """
    if defines_length(schema) or any(spec.kind in MEDIA_AND_LISTS for spec in fields.values()):
        return None
    names = batch.schema.names
    if not set(names) >= {name for name, spec in fields.items() if not spec.optional}:
        return None
    columns: dict[str, FieldColumn] = {}
    for name, column in zip(names, batch.columns, strict=True):
        spec = fields.get(name)
        if spec is None or not _fits_whole(column, spec):
            return None
        found = _field_column(column, spec)
        if found is None:
            return None
        columns[name] = found
    try:
        return schema.pack_columns(columns, batch.num_rows)
    except (TypeError, ValueError):
        return None


MEDIA_AND_LISTS = ("image", "audio", "video", "images")


def _field_column(column: Any, spec: FieldSpec) -> FieldColumn | None:
    """An Arrow column as the schema packs it whole (see ``FieldColumn``), None for types it does not."""
    import pyarrow
    import pyarrow.types as types

    if isinstance(column.type, pyarrow.ExtensionType):
        column = column.storage
    if types.is_dictionary(column.type):
        column = column.dictionary_decode()
    present = column.is_valid().to_numpy(zero_copy_only=False) if column.null_count else None
    if spec.kind == "json":
        return FieldColumn(column.to_pylist())
    if spec.kind == "scalar":
        if not (types.is_integer(column.type) or types.is_floating(column.type) or types.is_boolean(column.type)):
            return None
        filled = column.fill_null(False if types.is_boolean(column.type) else 0) if present is not None else column
        return FieldColumn(filled.to_numpy(zero_copy_only=False), present=present)
    if spec.kind == "text":
        if not (types.is_string(column.type) or types.is_large_string(column.type)):
            return None
        column.validate(full=True)  # UTF-8, as the row by row path's str values are
        return _binary_column(column, present)
    if spec.kind == "array" and (types.is_binary(column.type) or types.is_large_binary(column.type)):
        return _binary_column(column, present)
    if spec.kind in ("tokens", "array"):
        return _list_column(column, present)
    return None


def _binary_column(column: Any, present: np.ndarray | None) -> FieldColumn:
    """A string or binary column's bytes and offsets, as its buffers hold them."""
    import pyarrow.types as types

    _, offsets_buffer, data_buffer = column.buffers()
    wide = types.is_large_string(column.type) or types.is_large_binary(column.type)
    offsets = np.frombuffer(
        offsets_buffer, np.int64 if wide else np.int32, len(column) + 1, column.offset * (8 if wide else 4)
    )
    data = np.frombuffer(data_buffer, np.uint8) if data_buffer is not None else np.empty(0, np.uint8)
    return FieldColumn(data, offsets.astype(np.int64), present)


def _list_column(column: Any, present: np.ndarray | None) -> FieldColumn | None:
    """A list column of numbers (lists of fixed-size lists within) as values, offsets and the elements' shape."""
    import pyarrow.types as types

    if types.is_fixed_size_list(column.type):
        if column.null_count:
            return None
        size = column.type.list_size
        offsets = np.arange(len(column) + 1, dtype=np.int64) * size
        values = column.flatten()
    elif types.is_list(column.type) or types.is_large_list(column.type):
        offsets = column.offsets.to_numpy().astype(np.int64)
        values = column.values
    else:
        return None
    inner: list[int] = []
    while types.is_fixed_size_list(values.type):
        if values.null_count:
            return None
        inner.append(values.type.list_size)
        values = values.flatten()
    if values.null_count or not (
        types.is_integer(values.type) or types.is_floating(values.type) or types.is_boolean(values.type)
    ):
        return None
    return FieldColumn(values.to_numpy(zero_copy_only=False), offsets, present, tuple(inner))
