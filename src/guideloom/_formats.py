"""Document formats: how one record becomes bytes on disk and back.

A format's identity (recorded in the storage header) is its ``name`` class
attribute when it sets one, else its class's qualified name, so the class may
move between modules without breaking existing storages.
"""

from __future__ import annotations

import json
import pickle
from abc import ABC, abstractmethod
from typing import Any, ClassVar, Generic, TypeVar

In = TypeVar("In")
Out = TypeVar("Out")


class DocumentStorageFormat(ABC, Generic[In, Out]):
    """Encodes records of type ``In`` to bytes and decodes them to ``Out``.

    ``unpack`` receives a read-only ``memoryview`` into the mapped shard file
    (zero-copy) and the id of the shard the record came from.
    """

    name: ClassVar[str | None] = None

    @abstractmethod
    def pack(self, data: In) -> bytes:
        """Encode one record."""

    @abstractmethod
    def unpack(self, encoded_data: memoryview, shard: int) -> Out:
        """Decode one record from a read-only view of its bytes."""


def format_identity(document_format: DocumentStorageFormat[Any, Any]) -> str:
    """The name recorded on disk for ``document_format``."""
    declared = type(document_format).name
    return declared if declared else type(document_format).__qualname__


class DocumentPickleFormat(DocumentStorageFormat[Any, Any]):
    """Any picklable record. Decoding pickle can run code: trusted data only."""

    name = "pickle"

    def pack(self, data: Any) -> bytes:
        return pickle.dumps(data, protocol=pickle.HIGHEST_PROTOCOL)

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        return pickle.loads(encoded_data)


class DocumentJsonFormat(DocumentStorageFormat[Any, Any]):
    """JSON records (UTF-8, compact). Decoding runs no code."""

    name = "json"

    def pack(self, data: Any) -> bytes:
        return json.dumps(data, ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode()

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        return json.loads(bytes(encoded_data))


class DocumentMsgpackFormat(DocumentStorageFormat[Any, Any]):
    """MessagePack records (needs the ``msgpack`` extra). Decoding runs no code."""

    name = "msgpack"

    def __init__(self) -> None:
        try:
            import msgpack
        except ImportError as error:  # pragma: no cover - depends on the environment
            raise ImportError(
                "DocumentMsgpackFormat needs the msgpack package: pip install 'guideloom[msgpack]'"
            ) from error
        self._packb = msgpack.packb
        self._unpackb = msgpack.unpackb

    def pack(self, data: Any) -> bytes:
        packed: bytes = self._packb(data, use_bin_type=True)
        return packed

    def unpack(self, encoded_data: memoryview, shard: int) -> Any:
        return self._unpackb(encoded_data, raw=False, strict_map_key=False)
