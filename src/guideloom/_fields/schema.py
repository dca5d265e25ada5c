"""`RecordSchema`: a document format of named, typed fields; records are dicts, media among their fields.

A record's bytes (see docs/format.md, "Records of a RecordSchema"): a table of where each field ends (one
little-endian uint32 per field), a presence bitmap when the schema has optional fields, then the fields' bytes, the
non-media fields first and the media fields after them, each group in the schema's order. Reading one field is a
slice of the record; reading the whole record is one pass over the table, with nothing decoded but the small
fields (media read back as values holding their metadata and a view of their bytes).
"""

from __future__ import annotations

import functools
import json
import struct
import threading
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from guideloom._core.errors import CorruptStorageError
from guideloom._fields.decoders import MediaProblem
from guideloom._fields.field_types import FieldType
from guideloom._fields.record_columns import MAX_RECORD_BYTES, FieldColumn, pack_columns
from guideloom._shards.formats import DocumentStorageFormat

IDENTITY_PREFIX = "record-schema/1:"  # the format identity: this prefix, then the fields as JSON


class RecordSchema(DocumentStorageFormat[Mapping[str, Any], dict[str, Any]]):
    """Records of named, typed fields: ``RecordSchema(caption=Text(), image=Image(), length=fn)``.

    A ``DocumentStorage`` with a schema writes dicts with these fields (a field left out or None only where it is
    ``optional=True``) and reads them back as dicts: media fields as values with their metadata, decoded on
    request. The storage header records the fields (names, order and types), so opening a storage with another
    schema is a ``FormatMismatchError``. ``length(record)``, given the record as it reads back, returns its
    length (say text tokens plus image patches), stored per record for ``batch_tokens`` and ``pack_documents``.
    """

    __module__ = "guideloom.fields"

    def __init__(self, length: Callable[[dict[str, Any]], int] | None = None, **fields: FieldType) -> None:
        if not fields:
            raise ValueError("RecordSchema needs at least one field: RecordSchema(caption=Text(), image=Image())")
        for name, field in fields.items():
            if isinstance(field, type) and issubclass(field, FieldType):
                raise TypeError(f"RecordSchema: field {name!r} must be a field type instance: pass {field.__name__}()")
            if not isinstance(field, FieldType):
                raise TypeError(
                    f"RecordSchema: field {name!r} must be a field type (Tokens(), Text(), Image(), ...), "
                    f"got {type(field).__name__}"
                )
        self.fields: dict[str, FieldType] = dict(fields)
        if length is not None:
            if not callable(length):
                raise TypeError(f"RecordSchema: length must be a function of a record, got {type(length).__name__}")
            self.length_of = length
            self.length = self._length
        self.name = IDENTITY_PREFIX + json.dumps(
            [[name, field.identity()] for name, field in fields.items()], separators=(",", ":"), sort_keys=True
        )
        # Where each field's bytes are: the storage order puts the media fields last.
        self._stored = [name for name, field in fields.items() if not field.media]
        self._stored += [name for name, field in fields.items() if field.media]
        self._slot = {name: slot for slot, name in enumerate(self._stored)}
        self._table = struct.Struct(f"<{len(fields)}I")
        self._optional = any(field.optional for field in fields.values())
        self._head_size = self._table.size + ((len(fields) + 7) // 8 if self._optional else 0)
        self.read_fields: tuple[str, ...] = tuple(fields)  # what ``unpack`` reads (see ``selecting``)
        self._last = threading.local()  # the record packed last in this thread, for its length

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state.pop("_last")
        state.pop("_table")  # a struct.Struct: made again from the fields
        state.pop("length", None)  # a method of this schema: set again from length_of
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._last = threading.local()
        self._table = struct.Struct(f"<{len(self.fields)}I")
        if "length_of" in state:
            self.length = self._length

    def __repr__(self) -> str:
        described = ", ".join(f"{name}={field!r}" for name, field in self.fields.items())
        return f"RecordSchema({described}{', length=...' if hasattr(self, 'length_of') else ''})"

    @property
    def stored_fields(self) -> tuple[str, ...]:
        """The field names in the order a record stores them: the non-media fields, then the media fields."""
        return tuple(self._stored)

    @property
    def media_fields(self) -> tuple[str, ...]:
        """The names of the fields that hold media, in the schema's order."""
        return tuple(name for name, field in self.fields.items() if field.media)

    def check_fields(self, fields: object, what: str = "fields") -> tuple[str, ...]:
        """``fields`` (names of this schema's fields) as a tuple; a TypeError or ValueError naming ``what``."""
        if isinstance(fields, str) or not isinstance(fields, Iterable):
            raise TypeError(f"{what} must be a tuple of field names, got {type(fields).__name__}")
        names = tuple(fields)
        for name in names:
            if not isinstance(name, str):
                raise TypeError(f"{what} must be field names (str), got {type(name).__name__}")
            if name not in self.fields:
                raise ValueError(f"{what}: the schema has no field {name!r} (its fields: {', '.join(self.fields)})")
        if len(set(names)) != len(names):
            raise ValueError(f"{what} names a field twice: {names}")
        return names

    def selecting(self, fields: Iterable[str]) -> RecordSchema:
        """The same schema (the same storages), reading only ``fields``: what ``from_storage(fields=...)`` reads."""
        names = self.check_fields(fields)
        chosen = object.__new__(RecordSchema)
        chosen.__dict__.update(self.__dict__, read_fields=names, _last=threading.local())
        return chosen

    # -- writing --------------------------------------------------------------------------------------------------

    def pack(self, data: Mapping[str, Any]) -> bytes:
        if not isinstance(data, Mapping):
            raise TypeError(f"a record of a RecordSchema is a dict of its fields, got {type(data).__name__}")
        unknown = [name for name in data if name not in self.fields]
        if unknown:
            raise ValueError(
                f"the record has field {unknown[0]!r} that the schema does not (its fields: {', '.join(self.fields)})"
            )
        pieces: list[bytes | memoryview] = []
        ends: list[int] = []
        end = self._head_size
        present = bytearray((len(self.fields) + 7) // 8 if self._optional else 0)
        for slot, name in enumerate(self._stored):
            field, value = self.fields[name], data.get(name)
            if value is None and (field.kind != "json" or name not in data):  # JSON's null is a value
                if not field.optional:
                    raise ValueError(f"field {name!r} is missing (only optional=True fields may be left out)")
            else:
                try:
                    piece = field.pack(value)
                except MediaProblem as error:
                    raise ValueError(f"field {name!r}: {error}") from None
                except (TypeError, ValueError) as error:
                    raise type(error)(f"field {name!r}: {error}") from None
                pieces.append(piece)
                end += len(piece) if isinstance(piece, bytes) else piece.nbytes
                if self._optional:
                    present[slot // 8] |= 1 << (slot % 8)
            ends.append(end)
        if end > MAX_RECORD_BYTES:
            raise ValueError(f"the record is {end} bytes: a record of a RecordSchema holds at most 4 GiB - 1")
        encoded = b"".join([self._table.pack(*ends), present, *pieces])
        self._last.record = (data, encoded)
        return encoded

    def pack_columns(self, columns: Mapping[str, FieldColumn], rows: int) -> tuple[np.ndarray, np.ndarray]:
        """``rows`` records given field by field (non-media fields only): their bytes back to back, as ``pack`` gives
        each, and each record's size. What an importer of columnar data calls instead of ``pack`` per record; a
        value that does not fit is an error naming the field only (see ``record_columns.pack_columns``)."""
        return pack_columns(self.fields, self._stored, columns, rows)

    def _length(self, data: Mapping[str, Any]) -> int:
        """``length_of`` given the record as it reads back (the one just packed in this thread is not packed again)."""
        last = getattr(self._last, "record", None)
        encoded = last[1] if last is not None and last[0] is data else self.pack(data)
        self._last.record = None
        length: int = self.length_of(self.unpack_fields(memoryview(encoded), None, None, tuple(self.fields)))
        return length

    # -- reading --------------------------------------------------------------------------------------------------

    def unpack(self, encoded_data: memoryview, shard: int) -> dict[str, Any]:
        return self.unpack_fields(encoded_data, shard, None, None)

    def unpack_fields(
        self, encoded: memoryview, shard: int | None, record: int | None, fields: tuple[str, ...] | None
    ) -> dict[str, Any]:
        """The fields ``fields`` (default: ``read_fields``) of record ``record`` of ``shard`` (named in errors)."""
        names = self.read_fields if fields is None else fields
        size = len(encoded)
        try:
            ends = self._table.unpack_from(encoded)
        except struct.error:
            raise self._damaged(shard, record, f"its {size} bytes cannot hold its table of fields") from None
        optional, slot_of, head = self._optional, self._slot, self._head_size
        out: dict[str, Any] = {}
        for name in names:
            slot = slot_of[name]
            if optional and not encoded[self._table.size + slot // 8] >> (slot % 8) & 1:
                out[name] = None
                continue
            start, stop = ends[slot - 1] if slot else head, ends[slot]
            if not head <= start <= stop <= size:
                raise self._damaged(shard, record, f"field {name!r} lies outside its {size} bytes")
            try:
                out[name] = self.fields[name].unpack(encoded[start:stop], (shard, record, name))
            except (ValueError, TypeError, struct.error, IndexError) as error:  # includes UnicodeDecodeError
                raise self._damaged(shard, record, f"field {name!r} cannot be read: {error}") from None
        return out

    def unpack_fields_many(
        self,
        encoded: list[memoryview],
        shards: list[int],
        records: list[int],
        fields: tuple[str, ...] | None,
    ) -> list[dict[str, Any]]:
        """``unpack_fields`` of each record, in order."""
        unpack = self.unpack_fields
        located = zip(encoded, shards, records, strict=True)
        return [unpack(view, shard, record, fields) for view, shard, record in located]

    @staticmethod
    def _damaged(shard: int | None, record: int | None, problem: str) -> CorruptStorageError:
        where = "a record" if shard is None else f"record {record} of shard {shard}"
        return CorruptStorageError(f"{where} is damaged: {problem}")

    # -- field columns (docs/format.md, "Field columns") -----------------------------------------------------------

    @functools.cached_property
    def column_fields(self) -> tuple[str, ...]:
        """The fields a new storage holds again as field columns: the non-media ones, where there are media fields
        (a pass over the small fields then reads neither the media nor the records); none otherwise."""
        if not any(field.media for field in self.fields.values()):
            return ()
        return tuple(name for name in self._stored if not self.fields[name].media)

    def column_values(self, encoded: memoryview) -> list[memoryview | None]:
        """The bytes of each of ``column_fields`` in a record's bytes (as `pack` made them): None where absent."""
        ends = self._table.unpack_from(encoded)
        values: list[memoryview | None] = []
        start = self._head_size
        for slot in range(len(self.column_fields)):  # the columns' fields come first, in the stored order
            if self._optional and not encoded[self._table.size + slot // 8] >> (slot % 8) & 1:
                values.append(None)
            else:
                values.append(encoded[start : ends[slot]])
            start = ends[slot]
        return values

    def unpack_column_values(
        self, values: dict[str, memoryview | None], shard: int, record: int, fields: tuple[str, ...]
    ) -> dict[str, Any]:
        """A record of ``fields`` (each among ``column_fields``) from their columns' ``values`` (None: absent): what
        `unpack_fields` gives from the record's bytes."""
        out: dict[str, Any] = {}
        for name in fields:
            value = values[name]
            if value is None:
                out[name] = None
                continue
            try:
                out[name] = self.fields[name].unpack(value, (shard, record, name))
            except (ValueError, TypeError, struct.error, IndexError) as error:
                raise self._damaged(shard, record, f"field {name!r} cannot be read: {error}") from None
        return out
