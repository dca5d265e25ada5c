"""Document formats: how one record becomes bytes on disk and back.

A format's identity (recorded in the storage header) is its ``name`` attribute
when it sets one (usually on the class), else its class's qualified name, so the
class may move between modules without breaking existing storages.
"""

from __future__ import annotations

import functools
import json
import math
import pickle
import struct
from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

import numpy as np

from guideloom._core.checks import check_bool
from guideloom._shards.field_columns import ColumnSplitter
from guideloom._shards.header import StorageHeader

In = TypeVar("In")
Out = TypeVar("Out")

NUMPY_ARRAY_EXTENSION = 1  # MessagePack extension type of a NumPy array: head | shape (uint64 each) | data
NUMPY_ARRAY_HEAD = struct.Struct("<4sB")  # dtype string (e.g. b"<i4", space-padded), number of dimensions
NUMPY_ARRAY_KINDS = "biufc"  # bool, integers, floats, complex: plain bytes, nothing to construct


class DocumentStorageFormat(ABC, Generic[In, Out]):
    """Encodes records of type ``In`` to bytes and decodes them to ``Out``.

    ``unpack`` receives a read-only ``memoryview`` into the mapped shard file
    (zero-copy) and the id of the shard the record came from. A format may also define
    ``length(data) -> int``, a record's cost (its tokens, say): the writer then stores it per record,
    and readers and planners get it without decoding (``reader.length(i)``).
    """

    __module__ = "guideloom.types"  # its public home: reprs and pickles name it there

    name: str | None = None

    @abstractmethod
    def pack(self, data: In) -> bytes:
        """Encode one record."""

    @abstractmethod
    def unpack(self, encoded_data: memoryview, shard: int) -> Out:
        """Decode one record from a read-only view of its bytes."""

    def unpack_many(self, encoded_data: list[memoryview], shards: list[int]) -> list[Out]:
        """Decode a batch of records, in order; the loader calls this once per batch.

        The default calls ``unpack`` for each. Override it to decode a batch with a few NumPy
        calls instead of Python work per record; it must return one record per view.
        """
        unpack = self.unpack
        return [unpack(data, shard) for data, shard in zip(encoded_data, shards, strict=True)]


@runtime_checkable
class FieldFormat(Protocol):
    """A format whose records are dicts of named fields (``guideloom.fields.RecordSchema``): a reader asks it for
    some fields alone (``reader.read(i, fields=...)``) and tells it where each record lies, which its values name
    when they fail to decode."""

    def unpack_fields(
        self, encoded: memoryview, shard: int | None, record: int | None, fields: tuple[str, ...] | None
    ) -> Any: ...

    def unpack_fields_many(
        self, encoded: list[memoryview], shards: list[int], records: list[int], fields: tuple[str, ...] | None
    ) -> list[Any]: ...

    def check_fields(self, fields: object, what: str = "fields") -> tuple[str, ...]: ...

    @property
    def read_fields(self) -> tuple[str, ...]:
        """The fields a read gives where it names none."""
        ...

    def unpack_column_values(
        self, values: dict[str, memoryview | None], shard: int, record: int, fields: tuple[str, ...]
    ) -> Any: ...


def format_columns(document_format: object) -> tuple[str, ...]:
    """The fields a new storage of ``document_format`` holds again as field columns (docs/format.md): those a
    ``RecordSchema`` with media fields names in ``column_fields``; none for other formats."""
    return tuple(getattr(document_format, "column_fields", ()))


def column_splitter(document_format: object, header: StorageHeader) -> ColumnSplitter | None:
    """How a writer of a storage with ``header`` splits a record's bytes into its field columns' values (the
    format's ``column_values``), or None where the header names no field columns."""
    if not header.field_columns:
        return None
    split: ColumnSplitter | None = getattr(document_format, "column_values", None)
    return split


def format_identity(document_format: DocumentStorageFormat[Any, Any]) -> str:
    """The name recorded on disk for ``document_format``; a ``name`` that is not a str is a TypeError."""
    declared = document_format.name
    if declared is not None and not isinstance(declared, str):
        raise TypeError(f"{type(document_format).__name__}.name must be a str, got {type(declared).__name__}")
    return declared if declared else type(document_format).__qualname__


class _MeasuredFormat(DocumentStorageFormat[Any, Any]):
    """A built-in format: it measures records only with the ``length`` function it was given."""

    def __init__(self, length: Callable[[Any], int] | None = None) -> None:
        if length is not None:
            if not callable(length):
                raise TypeError(f"length must be a function of a record, got {type(length).__name__}")
            self.length = length


class DocumentPickleFormat(_MeasuredFormat):
    """Any picklable record. Decoding pickle can run code: trusted data only.

    ``length``: an optional function giving a record's length (its tokens, say), stored per record.
    """

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    name = "pickle"

    def pack(self, data: Any) -> bytes:
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        return pickle.loads(encoded_data)


class DocumentJsonFormat(_MeasuredFormat):
    """JSON records (UTF-8, compact). Decoding runs no code.

    ``length``: an optional function giving a record's length (its tokens, say), stored per record.
    """

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    name = "json"

    def pack(self, data: Any) -> bytes:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        return json.loads(bytes(encoded_data))


class DocumentMsgpackFormat(_MeasuredFormat):
    """MessagePack records (needs the ``msgpack`` extra). Decoding runs no code.

    NumPy scalars are stored as the plain numbers they hold. With ``numpy_arrays=True`` NumPy
    arrays of numbers are stored as typed binary (extension type 1, reserved for them) and decode
    as read-only arrays of the same dtype and shape, with no Python object per element; such a
    storage is named ``"msgpack-numpy"``, so it is never read by the plain format by mistake.
    ``length``: an optional function giving a record's length (its tokens, say), stored per record.
    """

    __module__ = "guideloom"  # its public home: reprs and pickles name it there

    name = "msgpack"

    def __init__(self, numpy_arrays: bool = False, length: Callable[[Any], int] | None = None) -> None:
        super().__init__(length)
        self.numpy_arrays = numpy_arrays = check_bool("numpy_arrays", numpy_arrays)
        if numpy_arrays:
            self.name = "msgpack-numpy"
        try:
            import msgpack
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(
                "DocumentMsgpackFormat needs the msgpack package: pip install 'guideloom[msgpack]'"
            ) from error
        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb
        self._extension = msgpack.ExtType

    def pack(self, data: Any) -> bytes:
        packed: bytes = self._packb(data, use_bin_type=True, default=self._pack_numpy)
        return packed

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        if not self.numpy_arrays:
            return self._unpackb(encoded_data, raw=False, strict_map_key=False)
        return self._unpackb(encoded_data, raw=False, strict_map_key=False, ext_hook=self._unpack_extension)

    def _pack_numpy(self, value: Any) -> Any:
        if isinstance(value, np.generic) and value.dtype.kind in "biuf":
            return value.item()
        if isinstance(value, np.ndarray) and not self.numpy_arrays:
            raise TypeError("DocumentMsgpackFormat stores NumPy arrays only with numpy_arrays=True")
        if isinstance(value, np.ndarray) and value.dtype.kind in NUMPY_ARRAY_KINDS and value.ndim <= 32:
            dtype = value.dtype.newbyteorder("<") if value.dtype.byteorder == "=" else value.dtype
            head = NUMPY_ARRAY_HEAD.pack(dtype.str.encode().ljust(4), value.ndim)
            shape = np.asarray(value.shape, "<u8").tobytes()
            return self._extension(NUMPY_ARRAY_EXTENSION, head + shape + np.ascontiguousarray(value, dtype).tobytes())
        raise TypeError(f"DocumentMsgpackFormat cannot store a {type(value).__name__} ({value!r:.40})")

    def _unpack_extension(self, code: int, payload: bytes) -> Any:
        if code != NUMPY_ARRAY_EXTENSION:
            return self._extension(code, payload)
        try:
            dtype_code, ndim = NUMPY_ARRAY_HEAD.unpack_from(payload)
            dtype = _array_dtype(dtype_code)
            data_start = NUMPY_ARRAY_HEAD.size + 8 * ndim
            shape = struct.unpack_from(f"<{ndim}Q", payload, NUMPY_ARRAY_HEAD.size)
            count = math.prod(shape)
            if dtype.itemsize * count != len(payload) - data_start:
                raise ValueError("its dtype, shape and size disagree")
            array = np.frombuffer(payload, dtype, count, data_start)
            return array if ndim == 1 else array.reshape(shape)
        except (ValueError, TypeError, struct.error) as error:
            raise ValueError(f"a MessagePack record holds a malformed NumPy array: {error}") from None


@functools.lru_cache(maxsize=64)
def _array_dtype(code: bytes) -> np.dtype[Any]:
    """The dtype of a stored array's dtype string, numbers only (anything else is refused)."""
    try:
        dtype = np.dtype(code.rstrip(b" ").decode("ascii"))
    except (TypeError, ValueError, UnicodeDecodeError):
        raise ValueError(f"unknown dtype {code!r}") from None
    if dtype.kind not in NUMPY_ARRAY_KINDS:
        raise ValueError(f"dtype {dtype} is not a plain number type")
    return dtype
