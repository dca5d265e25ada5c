"""The input files of a tokenize run: which files, of what kind, and the documents each holds.

Kinds, by the name once a compression suffix is removed: ``.jsonl`` (one JSON object per line, the
document in ``text_field``), ``.parquet`` (the string column ``text_field``, one document per row) and
anything else (UTF-8 text, one document per file). JSON documents, Arrow IPC files and zip archives are
refused up front. gzip, zstd, bz2 and xz files are decompressed as they are read, known by their suffix
(``.gz``, ``.zst``, ``.bz2``, ``.xz``) and by their first bytes.
"""

from __future__ import annotations

import io
import json
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

from guideloom._core.errors import TokenizeInputError
from guideloom.tokenize._compression import (
    CODECS,
    INSTALL_HINT,
    DecompressingReader,
    codec_for_data,
    codec_for_suffix,
    read_head,
)

DIRECTORY_SUFFIXES = (".txt", ".jsonl", ".parquet")  # what a directory stands for (.txt and .jsonl also compressed)
SUPPORTED = "use JSON Lines (.jsonl), .txt or .parquet"
REFUSED_SUFFIXES = {
    ".json": f"JSON documents are not supported as input; {SUPPORTED}",
    ".arrow": "Arrow IPC files are not supported as input; use Parquet (.parquet)",
    ".zip": "zip archives are not supported as input; extract them, or compress each file with gzip, zstd, bz2 or xz",
}
DECOMPRESSED_BUFFER = 1 << 20


@dataclass(frozen=True)
class InputFile:
    """One checked input file: its kind (``"jsonl"``, ``"parquet"`` or ``"text"``) and compression, if any."""

    path: Path
    size: int
    kind: str
    codec: str | None = None  # "gzip", "zstd", "bz2", "xz"


def _kind_of_name(path: Path) -> str:
    """The kind the file's name says, a compression suffix set aside; TokenizeInputError for a refused one."""
    name = Path(path.stem) if codec_for_suffix(path) is not None else path
    suffix = name.suffix.lower()
    if suffix in REFUSED_SUFFIXES:
        raise TokenizeInputError(f"{path}: {REFUSED_SUFFIXES[suffix]}")
    return {".jsonl": "jsonl", ".parquet": "parquet"}.get(suffix, "text")


def _codec(path: Path, head: bytes, kind: str) -> str | None:
    """The compression of the file: its first bytes decide; a name that promises one the data lacks is refused."""
    by_data = codec_for_data(head)
    by_name = codec_for_suffix(path)
    if by_data is None and by_name is not None and head:
        raise TokenizeInputError(f"{path}: the name says {by_name.name} but the file does not hold {by_name.name} data")
    if by_data is not None and kind == "parquet":
        raise TokenizeInputError(
            f"{path}: a {by_data.name}-compressed Parquet file cannot be read; Parquet compresses its columns "
            "itself (write it with compression='zstd', for instance)"
        )
    if by_data is not None and by_data.name == "zstd":
        by_data.new_decompressor()  # ImportError with the install hint now, before anything is written
    return None if by_data is None else by_data.name


def describe_input(path: Path, text_field: str) -> InputFile:
    """Check one input before anything is written: it exists, is readable, has a kind we read and a text column."""
    kind = _kind_of_name(path)
    if not path.exists():
        raise FileNotFoundError(f"input file not found: {path}")
    if not path.is_file():
        raise TokenizeInputError(f"input {path} is not a regular file")
    try:
        head = read_head(path)
    except OSError as error:
        raise type(error)(f"cannot read input file {path}: {error.strerror or error}") from None
    codec = _codec(path, head, kind)
    if kind == "parquet":
        parquet_file(path, text_field)
    return InputFile(path, path.stat().st_size, kind, codec)


def _in_directory(path: Path) -> bool:
    name = Path(path.stem) if codec_for_suffix(path) is not None else path
    suffix = name.suffix.lower()
    return suffix in DIRECTORY_SUFFIXES and not (suffix == ".parquet" and name is not path)


def expand_inputs(inputs: Sequence[str | os.PathLike[str]]) -> list[Path]:
    """The input files, sorted by path: directories stand for their input files, recursively."""
    if isinstance(inputs, str | os.PathLike):
        inputs = [inputs]
    paths: list[Path] = []
    for item in inputs:
        if not isinstance(item, str | os.PathLike):
            raise TypeError(f"inputs must be paths, got {type(item).__name__}")
        if os.fspath(item) == "":
            raise ValueError("inputs hold an empty path (it would mean the current directory)")
        path = Path(item)
        if path.is_dir():
            found = sorted(p for p in path.rglob("*") if _in_directory(p) and p.is_file())
            if not found:
                raise ValueError(f"input directory {path} holds no .txt, .jsonl or .parquet files (compressed or not)")
            paths.extend(found)
        else:
            paths.append(path)
    if not paths:
        raise ValueError("inputs is empty: give at least one input file")
    return sorted(paths, key=str)


def _import_pyarrow_parquet() -> Any:
    try:
        import pyarrow.parquet
    except ImportError as error:
        raise ImportError(f"reading Parquet needs the pyarrow package: {INSTALL_HINT}") from error
    return pyarrow.parquet


def parquet_file(path: Path, text_field: str) -> Any:
    """The opened ``pyarrow.parquet.ParquetFile``; TokenizeInputError when it is unreadable or lacks the column."""
    parquet = _import_pyarrow_parquet()
    try:
        file = parquet.ParquetFile(path)
    except OSError:
        raise
    except Exception as error:
        raise TokenizeInputError(f"{path}: not a readable Parquet file: {error}") from None
    names = file.schema_arrow.names
    if text_field not in names:
        raise TokenizeInputError(f"{path}: no column {text_field!r} (columns: {', '.join(names) or 'none'})")
    return file


def _decompressing(raw: BinaryIO, file: InputFile) -> tuple[BinaryIO, DecompressingReader]:
    codec = next(codec for codec in CODECS if codec.name == file.codec)
    reader = DecompressingReader(raw, codec, file.path)
    return io.BufferedReader(reader, DECOMPRESSED_BUFFER), reader


def _text_document(file: InputFile) -> Iterator[tuple[str, int]]:
    with open(file.path, "rb") as raw:
        data = raw.read() if file.codec is None else _decompressing(raw, file)[0].read()
    if not data:
        return  # an empty text file holds no document
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise TokenizeInputError(f"{file.path}: not UTF-8 text (invalid byte at offset {error.start})") from None
    yield text, file.size


def _jsonl_lines(file: InputFile) -> Iterator[tuple[bytes, int]]:
    """``(line, bytes of the file read so far)``: compressed bytes for a compressed file."""
    with open(file.path, "rb") as raw:
        if file.codec is None:
            position = 0
            for line in raw:
                position += len(line)
                yield line, position
        else:
            lines, reader = _decompressing(raw, file)
            for line in lines:
                yield line, reader.consumed


def jsonl_values(file: InputFile, field: str) -> Iterator[tuple[Any, int, int]]:
    """``(record[field], line number, bytes read so far)`` for every non-blank line of a JSONL file.

    A line that is not JSON, not an object or lacks the field is a TokenizeInputError naming the file and line.
    """
    path = file.path
    for number, (line, position) in enumerate(_jsonl_lines(file), 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as error:
            raise TokenizeInputError(f"{path}:{number}: not valid JSON: {error}") from None
        if not isinstance(record, dict):
            raise TokenizeInputError(f"{path}:{number}: a JSON object was expected, got {type(record).__name__}")
        if field not in record:
            fields = ", ".join(map(str, record)) or "none"
            raise TokenizeInputError(f"{path}:{number}: no field {field!r} (fields: {fields})")
        yield record[field], number, position


def _jsonl_documents(file: InputFile, text_field: str) -> Iterator[tuple[str, int]]:
    for text, number, position in jsonl_values(file, text_field):
        if not isinstance(text, str):
            raise TokenizeInputError(
                f"{file.path}:{number}: field {text_field!r} holds {type(text).__name__}, not a string"
            )
        yield text, position


def parquet_values(file: InputFile, column: str) -> Iterator[tuple[Any, int, int]]:
    """``(value, row number from 1, bytes read so far, estimated)`` for every row of a Parquet file's ``column``."""
    parquet = parquet_file(file.path, column)
    total_rows = max(1, int(parquet.metadata.num_rows))
    row = 0
    for batch in parquet.iter_batches(columns=[column], batch_size=4096):
        for value in batch.column(0).to_pylist():
            row += 1
            yield value, row, file.size * row // total_rows


def _parquet_documents(file: InputFile, text_field: str) -> Iterator[tuple[str, int]]:
    for text, row, position in parquet_values(file, text_field):
        if not isinstance(text, str):
            what = "null" if text is None else type(text).__name__
            raise TokenizeInputError(f"{file.path}: row {row - 1} of column {text_field!r} is {what}, not a string")
        yield text, position


def iter_documents(source: Path | InputFile, text_field: str = "text") -> Iterator[tuple[str, int]]:
    """Yield ``(text, bytes_read_so_far)`` for every document of one input file (a path is checked first)."""
    file = source if isinstance(source, InputFile) else describe_input(Path(source), text_field)
    if file.kind == "text":
        return _text_document(file)
    if file.kind == "jsonl":
        return _jsonl_documents(file, text_field)
    return _parquet_documents(file, text_field)
