"""A storage's header, ``guideloom.json``: what the storage holds (see docs/format.md).

Written once, atomically, by the first writer; every shard records its checksum, so a shard is
never read under another storage's header.
"""

from __future__ import annotations

import functools
import json
import os
import stat
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from guideloom._core.errors import CorruptStorageError, FormatMismatchError, StorageNotFoundError
from guideloom._shards.checkpoints import CHECKPOINTS_FLAG, valid_checkpoint_bytes
from guideloom._shards.field_columns import FIELD_COLUMNS_FLAG
from guideloom._shards.loss_masks import LOSS_MASK_FLAG
from guideloom._shards.record_lengths import RECORD_LENGTHS_FLAG

LAYOUT_VERSION = 1
HEADER_NAME = "guideloom.json"
MAX_HEADER_BYTES = 64 * 1024

KINDS = ("documents", "tokens")
TOKEN_DTYPES = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64")
COMPRESSIONS = ("zstd",)  # of shard objects on an object store (see _remote.compression)


@dataclass(frozen=True)
class StorageHeader:
    """What a storage holds: its kind, the format identity or the token dtype."""

    kind: str
    format: str | None = None
    dtype: str | None = None
    layout_version: int = LAYOUT_VERSION
    loss_mask: bool = False  # tokens only: a mask bit per token beside the tokens (absent from 0.2 headers)
    compression: str | None = None
    record_lengths: bool = False  # documents only: a length per record beside the offsets (absent before 0.4)
    # The piece size of the shards' checkpoints; None (absent from the JSON) in storages created without them.
    # New storages get CHECKPOINT_BYTES from the storage classes, so that a header built here mirrors its JSON.
    checkpoint_bytes: int | None = None
    # Documents only: the fields each shard holds again as columns (a RecordSchema's non-media fields, where it has
    # media fields); empty (absent from the JSON) in other storages and in those created before columns.
    field_columns: tuple[str, ...] = ()

    def to_json(self) -> bytes:
        fields: dict[str, Any] = {"layout_version": self.layout_version, "kind": self.kind}
        if self.format is not None:
            fields["format"] = self.format
        if self.dtype is not None:
            fields["dtype"] = self.dtype
        if self.loss_mask:
            fields["loss_mask"] = True
        if self.compression is not None:  # absent otherwise: headers written before compression are unchanged
            fields["compression"] = self.compression
        if self.record_lengths:  # likewise: headers of storages without lengths are those of 0.3
            fields["record_lengths"] = True
        if self.checkpoint_bytes is not None:  # likewise: headers of storages created before checkpoints
            fields["checkpoint_bytes"] = self.checkpoint_bytes
        if self.field_columns:  # likewise: headers of storages created before field columns
            fields["field_columns"] = list(self.field_columns)
        return json.dumps(fields, sort_keys=True).encode() + b"\n"

    @functools.cached_property
    def checksum(self) -> int:
        """Ties every shard to the header it was written under (computed once: every shard opened compares it)."""
        return zlib.crc32(self.to_json())

    @functools.cached_property
    def element_size(self) -> int:
        return 1 if self.dtype is None else np.dtype(self.dtype).itemsize

    def describe(self) -> str:
        if self.dtype is None:
            described = f"{self.kind} with format {self.format!r}"
            described += " and record lengths" if self.record_lengths else ""
        else:
            described = f"tokens of {self.dtype}{' with a loss mask' if self.loss_mask else ' without a loss mask'}"
        return described if self.compression is None else f"{described}, compressed with {self.compression}"

    @property
    def readable_in_parts(self) -> bool:
        """Whether a part of a shard can be read alone (``_remote.shard_parts``): its object read by range (not
        compressed) and its pieces checked against their checkpoints."""
        return self.compression is None and self.checkpoint_bytes is not None

    @property
    def footer_flags(self) -> int:
        """The footer flags of this storage's shards."""
        return (
            (LOSS_MASK_FLAG if self.loss_mask else 0)
            | (RECORD_LENGTHS_FLAG if self.record_lengths else 0)
            | (CHECKPOINTS_FLAG if self.checkpoint_bytes is not None else 0)
            | (FIELD_COLUMNS_FLAG if self.field_columns else 0)
        )


def why_not_a_directory(path: Path) -> str:
    """Why ``path``, which is not a directory, holds no storage: a file there is not a missing directory."""
    return "it is a file, not a storage directory" if path.exists() else "the directory does not exist"


def read_header(path: Path) -> StorageHeader:
    """Read and validate ``guideloom.json``; a missing one is StorageNotFoundError."""
    header_path = path / HEADER_NAME
    if not path.is_dir():
        raise StorageNotFoundError(f"no storage at {path}: {why_not_a_directory(path)}")
    try:
        # O_NONBLOCK: opening a FIFO planted as the header must not wait for a writer
        descriptor = os.open(header_path, os.O_RDONLY | os.O_NONBLOCK)
    except FileNotFoundError:
        raise StorageNotFoundError(f"no storage at {path}: {HEADER_NAME} is missing") from None
    except OSError as error:
        raise CorruptStorageError(f"{header_path} cannot be opened: {error.strerror or error}") from None
    try:
        if not stat.S_ISREG(os.fstat(descriptor).st_mode):
            raise CorruptStorageError(f"{header_path} is not a regular file")
        raw = b""
        while len(raw) <= MAX_HEADER_BYTES and (chunk := os.read(descriptor, MAX_HEADER_BYTES + 1 - len(raw))):
            raw += chunk
    finally:
        os.close(descriptor)
    return parse_header(raw, str(header_path))


def parse_header(raw: bytes, header_path: str) -> StorageHeader:
    """Validate a header's bytes (read from ``header_path``, named in errors)."""
    if len(raw) > MAX_HEADER_BYTES:
        raise CorruptStorageError(f"{header_path} is larger than {MAX_HEADER_BYTES} bytes")
    try:
        fields = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError) as error:  # RecursionError: nesting too deep
        raise CorruptStorageError(f"{header_path} is not valid JSON: {error}") from None
    if not isinstance(fields, dict):
        raise CorruptStorageError(f"{header_path} does not hold a JSON object")
    version = fields.get("layout_version")
    if version != LAYOUT_VERSION:
        raise FormatMismatchError(
            f"{header_path} has layout version {version!r}; this guideloom reads version {LAYOUT_VERSION}"
        )
    kind, document_format, dtype = fields.get("kind"), fields.get("format"), fields.get("dtype")
    loss_mask = fields.get("loss_mask", False)
    compression = fields.get("compression")
    if compression is not None and compression not in COMPRESSIONS:
        raise FormatMismatchError(f"{header_path} records compression {compression!r}: this guideloom cannot read it")
    record_lengths = fields.get("record_lengths", False)
    checkpoint_bytes = fields.get("checkpoint_bytes")
    if "checkpoint_bytes" in fields and not valid_checkpoint_bytes(checkpoint_bytes):
        raise CorruptStorageError(
            f"{header_path} records checkpoint_bytes {checkpoint_bytes!r}: it must be a power of two from 4096 to 2**26"
        )
    field_columns = fields.get("field_columns", [])
    if not _valid_field_columns(field_columns) or ("field_columns" in fields and not field_columns):
        raise CorruptStorageError(f"{header_path} records field_columns {field_columns!r}: it must name fields")
    if kind == "documents" and isinstance(document_format, str) and dtype is None and "loss_mask" not in fields:
        if record_lengths is True or "record_lengths" not in fields:
            return StorageHeader(
                kind,
                format=document_format,
                compression=compression,
                record_lengths=record_lengths,
                checkpoint_bytes=checkpoint_bytes,
                field_columns=tuple(field_columns),
            )
    if kind == "tokens" and dtype in TOKEN_DTYPES and document_format is None and loss_mask in (True, False):
        if "record_lengths" not in fields and "field_columns" not in fields:
            return StorageHeader(
                kind,
                dtype=dtype,
                loss_mask=loss_mask is True,
                compression=compression,
                checkpoint_bytes=checkpoint_bytes,
            )
    raise CorruptStorageError(f"{header_path} describes no valid storage: {fields!r}")


def _valid_field_columns(value: object) -> bool:
    """Whether a header's ``field_columns`` is usable: a list of distinct field names."""
    return (
        isinstance(value, list)
        and all(isinstance(name, str) and name for name in value)
        and len(set(value)) == len(value)
    )
