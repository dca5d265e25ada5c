"""JSON Lines files, plain or compressed (``.jsonl.zst``, ``.jsonl.gz``, ...): one JSON object per row.

Row ``n`` is line ``n + 1`` of the file (blank lines are no rows, and count as lines). The fields are
inferred from the first rows (see ``_schema.infer_from_rows``). Compression is known by the file's first
bytes and read with the tokenize command's decompressing reader; damaged data names the file.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any, BinaryIO, cast

from guideloom._core.errors import TokenizeInputError
from guideloom.importing._errors import ImportInputError
from guideloom.importing._files import InputPath, open_binary, read_head, size_of
from guideloom.importing._schema import infer_from_rows
from guideloom.importing._stream import Described, Piece, Row
from guideloom.tokenize._compression import CODECS, DecompressingReader, codec_for_data, codec_for_suffix

INFER_ROWS = 1000
DECOMPRESSED_BUFFER = 1 << 20


def _codec_name(path: InputPath, options: dict[str, Any] | None) -> str | None:
    head = read_head(path, options)
    by_data, by_name = codec_for_data(head), codec_for_suffix(Path(str(path)))
    if by_data is None and by_name is not None and head:
        raise ImportInputError(f"{path}: the name says {by_name.name} but the file does not hold {by_name.name} data")
    if by_data is not None and by_data.name == "zstd":
        by_data.new_decompressor()  # ImportError with the install hint now, before anything is written
    return None if by_data is None else by_data.name


def _lines(path: InputPath, codec: str | None, options: dict[str, Any] | None) -> Iterator[tuple[bytes, int]]:
    """``(line, bytes of the file read so far)``; damaged compressed data is an ImportInputError."""
    with open_binary(path, options) as raw:
        if codec is None:
            position = 0
            for line in raw:
                position += len(line)
                yield line, position
            return
        reader = DecompressingReader(cast(BinaryIO, raw), next(c for c in CODECS if c.name == codec), Path(str(path)))
        lines: BinaryIO = io.BufferedReader(reader, DECOMPRESSED_BUFFER)
        try:
            for line in lines:
                yield line, reader.consumed
        except TokenizeInputError as error:
            raise ImportInputError(str(error)) from None


def _records(
    path: InputPath, codec: str | None, options: dict[str, Any] | None
) -> Iterator[tuple[int, dict[str, Any], int]]:
    for index, (line, position) in enumerate(_lines(path, codec, options)):
        if index == 0 and line.startswith(b"\xef\xbb\xbf"):  # a UTF-8 byte order mark
            line = line[3:]
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except (ValueError, RecursionError) as error:
            raise ImportInputError(f"{path}: row {index} (line {index + 1}) is not JSON: {error}") from None
        if not isinstance(record, dict):
            raise ImportInputError(
                f"{path}: row {index} (line {index + 1}) holds a JSON {type(record).__name__}, not an object"
            )
        yield index, record, position


def describe(path: InputPath, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    del shard_size
    codec = _codec_name(path, options)
    sample = []
    for _, record, _ in _records(path, codec, options):
        sample.append(record)
        if len(sample) >= INFER_ROWS:
            break
    try:
        fields = infer_from_rows(sample, str(path))
    except ValueError as error:
        raise ImportInputError(str(error)) from None
    return Described(fields, [Piece(path, "jsonl", 0, None, size_of(path, options), (codec,), options)])


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    del fields
    (codec,) = piece.detail
    for index, record, position in _records(piece.path, codec, piece.options):
        if index >= start:
            yield index, record, position
