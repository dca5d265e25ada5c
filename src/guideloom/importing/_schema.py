"""The fields of the imported records: inferred from a source, given by the user, and each row checked against them.

A field is described by a :class:`FieldSpec` (the kind of ``guideloom.fields`` type it becomes, its dtype,
shape and whether it may be missing): what inference produces and rows are checked against; the storage is
written with the ``RecordSchema`` of these fields (:func:`record_schema`), or with the user's own.

A schema given by the user is a ``RecordSchema`` (its ``length`` and image encodings kept), or a JSON
object mapping field names to a kind (``"text"``) or to an object (``{"type": "tokens", "dtype": "uint32",
"optional": true}``, the keys a field type's identity has), in a file or as a dict named by ``module:attribute``.
"""

from __future__ import annotations

import importlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np

from guideloom.fields import Array, Audio, FieldType, Image, Images, Json, RecordSchema, Scalar, Text, Tokens, Video

KINDS = ("tokens", "text", "scalar", "array", "json", "image", "audio", "video", "images")
MEDIA_KINDS = ("image", "audio", "video")
DTYPE_KINDS = ("tokens", "scalar", "array")
DEFAULT_DTYPES = {"tokens": "int64", "scalar": "int64", "array": "float32"}
KEY_FIELD = "__key__"  # a WebDataset sample's key


@dataclass(frozen=True)
class FieldSpec:
    """One field: its kind (``"text"``, ``"tokens"``, ...), dtype (tokens, scalars, arrays), shape, optionality."""

    kind: str
    dtype: str | None = None
    optional: bool = False
    shape: tuple[int | None, ...] | None = None

    def as_json(self) -> dict[str, Any]:
        described: dict[str, Any] = {"type": self.kind}
        if self.dtype is not None:
            described["dtype"] = self.dtype
        if self.shape is not None:
            described["shape"] = list(self.shape)
        if self.optional:
            described["optional"] = True
        return described

    def describe(self) -> str:
        dtype = f"({self.dtype})" if self.dtype is not None else "()"
        return f"{self.kind.capitalize()}{dtype}{', optional' if self.optional else ''}"


Fields = dict[str, FieldSpec]


def fields_as_json(fields: Fields) -> dict[str, Any]:
    return {name: spec.as_json() for name, spec in fields.items()}


def describe_fields(fields: Fields) -> str:
    return ", ".join(f"{name}: {spec.describe()}" for name, spec in fields.items())


# --- the user's schema -------------------------------------------------------------------------------------------


def _spec_of(name: str, value: object, where: str) -> FieldSpec:
    if isinstance(value, str):
        value = {"type": value}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}: field {name!r} must be a kind ({', '.join(KINDS)}) or an object with 'type'")
    value = {key: item for key, item in value.items() if key not in ("encode", "quality")}  # how images are written
    unknown = set(value) - {"type", "dtype", "optional", "shape"}
    if unknown:
        raise ValueError(f"{where}: field {name!r} has unknown keys {sorted(unknown)} (type, dtype, shape, optional)")
    kind = value.get("type")
    if kind not in KINDS:
        raise ValueError(f"{where}: field {name!r} has type {kind!r}; use one of {', '.join(KINDS)}")
    dtype = value.get("dtype")
    if kind in DTYPE_KINDS:
        dtype = DEFAULT_DTYPES[kind] if dtype is None else dtype
        try:
            dtype = np.dtype(dtype).name
        except TypeError:
            raise ValueError(f"{where}: field {name!r} has dtype {value.get('dtype')!r}, not a NumPy dtype") from None
    elif dtype is not None:
        raise ValueError(f"{where}: field {name!r} of type {kind} takes no dtype")
    optional = value.get("optional", False)
    if not isinstance(optional, bool):
        raise ValueError(f"{where}: field {name!r} has optional={optional!r}; use true or false")
    shape = value.get("shape")
    if shape is not None:
        if kind != "array" or not isinstance(shape, list | tuple):
            raise ValueError(f"{where}: field {name!r}: only arrays take a shape (a list of ints or nulls)")
        shape = tuple(None if size is None else int(size) for size in shape)
    return FieldSpec(kind, dtype, optional, shape)


def fields_from_mapping(mapping: object, where: str) -> Fields:
    """The fields a JSON-like mapping describes (see the module's docstring); ValueError naming ``where``."""
    if not isinstance(mapping, Mapping) or not mapping:
        raise ValueError(f"{where}: a schema is a non-empty object mapping field names to types")
    return {str(name): _spec_of(str(name), value, where) for name, value in mapping.items()}


def load_schema(schema: object) -> RecordSchema | None:
    """The schema given: None, a ``RecordSchema``, a mapping of field names to types, a path to a JSON file of one,
    or ``"module:attribute"`` naming a ``RecordSchema`` or a mapping."""
    if schema is None or isinstance(schema, RecordSchema):
        return schema
    if isinstance(schema, Mapping):
        return record_schema(fields_from_mapping(schema, "schema"))
    if isinstance(schema, Path) or (isinstance(schema, str) and (schema.endswith(".json") or ":" not in schema)):
        path = Path(schema)
        try:
            text = path.read_text(encoding="utf-8")
        except OSError as error:
            raise ValueError(f"cannot read the schema file {path}: {error.strerror or error}") from None
        try:
            mapping = json.loads(text)
        except ValueError as error:
            raise ValueError(f"the schema file {path} is not JSON: {error}") from None
        return record_schema(fields_from_mapping(mapping, str(path)))
    if isinstance(schema, str):
        module_name, _, attribute = schema.partition(":")
        try:
            module = importlib.import_module(module_name)
        except ImportError as error:
            raise ValueError(f"schema {schema!r}: cannot import {module_name}: {error}") from None
        if not hasattr(module, attribute):
            raise ValueError(f"schema {schema!r}: module {module_name} has no attribute {attribute!r}")
        return load_schema(getattr(module, attribute))
    raise TypeError(
        "schema must be None, a RecordSchema, a mapping of field names to types, a JSON file or 'module:attribute', "
        f"got {type(schema).__name__}"
    )


# --- inference ---------------------------------------------------------------------------------------------------


def merge_fields(first: Fields, second: Fields, where: str) -> Fields:
    """The fields that hold the rows of two inputs: a field one lacks becomes optional, ints widen to floats."""
    merged: Fields = {}
    for name in [*first, *(name for name in second if name not in first)]:
        one, other = first.get(name), second.get(name)
        if one is None or other is None:
            spec = one if other is None else other
            assert spec is not None
            merged[name] = replace(spec, optional=True)
            continue
        if one.kind != other.kind:
            raise ValueError(f"{where}: field {name!r} holds {other.describe()}, elsewhere {one.describe()}")
        dtype = one.dtype
        if one.dtype != other.dtype and one.dtype is not None and other.dtype is not None:
            dtype = np.promote_types(one.dtype, other.dtype).name
        shape = one.shape if one.shape == other.shape else None
        merged[name] = FieldSpec(one.kind, dtype, one.optional or other.optional, shape)
    return merged


def _python_spec(value: object) -> FieldSpec | None:
    """The field a JSON value suggests (None for null)."""
    if value is None:
        return None
    if isinstance(value, bool):
        return FieldSpec("scalar", "bool")
    if isinstance(value, int):
        return FieldSpec("scalar", "int64")
    if isinstance(value, float):
        return FieldSpec("scalar", "float64")
    if isinstance(value, str):
        return FieldSpec("text")
    if isinstance(value, list) and value and all(type(item) is int for item in value):
        return FieldSpec("tokens", "int64")
    if isinstance(value, list) and value and all(type(item) in (int, float) for item in value):
        return FieldSpec("array", "float64")
    return FieldSpec("json")


def infer_from_rows(rows: list[dict[str, Any]], where: str) -> Fields:
    """The fields of JSON rows (a sample of an input's first rows): a key missing or null in some is optional."""
    fields: Fields = {}
    seen: dict[str, int] = {}
    for row in rows:
        for name, value in row.items():
            spec = _python_spec(value)
            seen[name] = seen.get(name, 0) + (spec is not None)
            if spec is None:
                fields.setdefault(name, FieldSpec("json", optional=True))
                continue
            known = fields.get(name)
            if known is None or (known.kind == "json" and known.optional and seen[name] == 1):
                fields[name] = spec
            elif known != spec:
                fields[name] = _widen(known, spec)
    return {name: replace(spec, optional=spec.optional or seen[name] < len(rows)) for name, spec in fields.items()}


def _widen(known: FieldSpec, spec: FieldSpec) -> FieldSpec:
    """Two suggestions for one JSON field: ints and floats become floats, anything else JSON."""
    numeric = {("scalar", "int64"), ("scalar", "float64")}
    if {(known.kind, known.dtype), (spec.kind, spec.dtype)} <= numeric:
        return FieldSpec("scalar", "float64", known.optional)
    if {known.kind, spec.kind} <= {"tokens", "array"}:
        return FieldSpec("array", "float64", known.optional)
    return FieldSpec("json", optional=known.optional)


# --- rows against the fields -------------------------------------------------------------------------------------


def _array(value: object, spec: FieldSpec) -> np.ndarray:
    array = np.asarray(value)
    if array.dtype == object:
        raise ValueError("a ragged or mixed sequence")
    if spec.kind == "tokens" and array.ndim != 1:
        raise ValueError(f"an array of {array.ndim} dimensions, not a sequence of ids")
    assert spec.dtype is not None
    dtype = np.dtype(spec.dtype)
    if array.size and array.dtype.kind in "iub" and dtype.kind in "iu":
        low, high = array.min(), array.max()
        if low < np.iinfo(dtype).min or high > np.iinfo(dtype).max:
            raise ValueError(f"values {low}..{high} that {dtype.name} cannot hold")
    elif array.size and array.dtype.kind == "f" and dtype.kind in "iu":
        raise ValueError(f"floats where {dtype.name} is expected")
    elif array.size and array.dtype.kind not in "iubf":
        raise ValueError(f"{array.dtype.name} values where numbers are expected")
    if spec.shape is not None and (
        len(spec.shape) != array.ndim
        or any(want is not None and want != got for want, got in zip(spec.shape, array.shape, strict=True))
    ):
        raise ValueError(f"shape {array.shape}, not {spec.shape}")
    return array.astype(dtype, copy=False)


def _scalar(value: object, spec: FieldSpec) -> object:
    assert spec.dtype is not None
    dtype = np.dtype(spec.dtype)
    if isinstance(value, np.generic):
        value = value.item()
    if dtype.kind == "b":
        if not isinstance(value, bool):
            raise ValueError(f"{type(value).__name__}, not a bool")
        return value
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{type(value).__name__}, not a number")
    if dtype.kind in "iu":
        if isinstance(value, float):
            if not value.is_integer():
                raise ValueError(f"{value!r}, not an integer")
            value = int(value)
        if not np.iinfo(dtype).min <= value <= np.iinfo(dtype).max:
            raise ValueError(f"{value}, which {dtype.name} cannot hold")
        return value
    return float(value)


def _json(value: object) -> object:
    try:
        json.dumps(value, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(f"a value that is not JSON ({error})") from None
    return value


def _media(value: object) -> object:
    if isinstance(value, bytes | bytearray | memoryview):
        return bytes(value)
    raise ValueError(f"{type(value).__name__}, not encoded bytes")


def conform(spec: FieldSpec, value: object) -> object:
    """``value`` as the field stores it; ValueError saying what does not fit (the caller names input and row)."""
    if value is None or (isinstance(value, float) and math.isnan(value) and spec.kind != "scalar"):
        if spec.optional:
            return None
        raise ValueError("null, and the field is not optional")
    kind = spec.kind
    if kind == "text":
        if not isinstance(value, str):
            raise ValueError(f"{type(value).__name__}, not a string")
        return value
    if kind == "scalar":
        return _scalar(value, spec)
    if kind in ("tokens", "array"):
        return _array(value, spec)
    if kind == "json":
        return _json(value)
    if kind == "images":
        if not isinstance(value, list | tuple):
            raise ValueError(f"{type(value).__name__}, not a list of images")
        return [_media(item) for item in value]
    return _media(value)


def conform_row(fields: Fields, row: Mapping[str, Any]) -> dict[str, Any]:
    """The row as stored: each field's value checked and converted; ValueError naming the field that does not fit."""
    extra = [name for name in row if name not in fields]
    if extra:
        raise ValueError(f"field {extra[0]!r} is not in the schema ({', '.join(fields)})")
    record: dict[str, Any] = {}
    for name, spec in fields.items():
        try:
            record[name] = conform(spec, row.get(name))
        except ValueError as error:
            what = "missing" if name not in row else str(error)
            if name not in row and spec.optional:
                record[name] = None
                continue
            raise ValueError(f"field {name!r}: {what}") from None
    return record


def record_schema(fields: Fields) -> RecordSchema:
    """The ``RecordSchema`` the storage is written with, from the fields."""
    types: dict[str, Any] = {name: _field_type(spec) for name, spec in fields.items()}
    return RecordSchema(**types)


def _field_type(spec: FieldSpec) -> FieldType:
    optional = spec.optional
    if spec.kind == "tokens":
        return Tokens(spec.dtype, optional=optional)
    if spec.kind == "scalar":
        return Scalar(spec.dtype, optional=optional)
    if spec.kind == "array":
        return Array(spec.dtype, shape=spec.shape, optional=optional)
    types: dict[str, type[FieldType]] = {
        "text": Text, "json": Json, "image": Image, "audio": Audio, "video": Video, "images": Images
    }  # fmt: skip
    return types[spec.kind](optional=optional)


def fields_of_record_schema(schema: RecordSchema) -> Fields:
    """The fields of a ``RecordSchema`` the user gave, as the import checks rows against them."""
    return {name: _spec_of(name, field.identity(), "schema") for name, field in schema.fields.items()}
