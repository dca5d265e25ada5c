"""LitData folders (``litdata.optimize``'s output), read from their on-disk format, no library needed.

``index.json`` holds ``{"chunks": [{"filename", "chunk_size", ...}], "config": {"data_format", "data_spec",
"compression", "encryption", ...}}``; a chunk file is ``uint32 items | uint32 offsets[items + 1] | items``,
each item the ``uint32`` sizes of its leaves (little-endian) then the leaves' bytes, in the order
``data_format`` lists them. Whole-chunk ``zstd`` compression is read; encrypted chunks and per-item
compression are refused. Items that are a dict of leaves become records with those keys; a single leaf
becomes the field ``value``. Each chunk is one piece; rows are numbered across the folder's chunks.

Leaf formats become fields: ``str`` / ``text`` -> ``Text``; ``int`` -> ``Scalar(int64)``; ``float`` ->
``Scalar(float64)``; ``bool`` -> ``Scalar(bool)``; ``no_header_numpy:N`` and ``numpy`` -> ``Tokens`` (one
dimension of integers) or ``Array``; ``jpeg`` -> ``Image``; ``bytes`` -> a media field when its first value
starts as a media file does, else ``Array(uint8)``. ``pickle``, ``pil`` (raw pixels), tensors and the
other formats are refused, naming the leaf.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from guideloom.importing._errors import ImportInputError
from guideloom.importing._sample_files import Words, field_of_value, guarded, piece_rows, record, samples
from guideloom.importing._schema import Fields, FieldSpec
from guideloom.importing._stream import Described, Piece, Row

NUMPY_DTYPES = (
    "int8",
    "int16",
    "int32",
    "int64",
    "uint8",
    "uint16",
    "uint32",
    "uint64",
    "float16",
    "float32",
    "float64",
)  # fmt: skip  (LitData's dtype numbers, in its order)
WORDS = Words(sample="item", file="chunk", parts="leaves", damaged="a damaged LitData chunk")


def is_litdata(path: Path) -> bool:
    index = path / "index.json"
    if not index.is_file():
        return False
    try:
        data = json.loads(index.read_text())
    except (ValueError, OSError):
        return False
    return isinstance(data, dict) and "chunks" in data and "config" in data


def _index(path: Path) -> dict[str, Any]:
    try:
        data = json.loads((path / "index.json").read_text())
        config, chunks = data["config"], data["chunks"]
        if not isinstance(config, dict) or not isinstance(chunks, list):
            raise TypeError("config or chunks has the wrong type")
    except (ValueError, KeyError, TypeError) as error:
        raise ImportInputError(f"{path / 'index.json'}: not a LitData index ({error})") from None
    if config.get("encryption"):
        raise ImportInputError(f"{path}: encrypted LitData chunks are not imported")
    if config.get("compression") not in (None, "zstd") and not str(config.get("compression")).startswith("zstd:"):
        raise ImportInputError(f"{path}: LitData compression {config.get('compression')!r} is not supported")
    if config.get("compression_level") not in (None, "chunk"):
        raise ImportInputError(f"{path}: LitData per-item compression ({config['compression_level']}) is not supported")
    return dict(data)


def _keys(path: Path, config: dict[str, Any]) -> list[str]:
    """The field names: the keys of a flat dict item, or ``["value"]`` for a single leaf."""
    formats = config.get("data_format") or []
    spec_text = config.get("data_spec")
    if spec_text is None:
        raise ImportInputError(f"{path}: the LitData index has no data_spec")
    try:
        _, spec = json.loads(spec_text)
        if spec["type"] is None:
            keys = ["value"]
        elif spec["type"] == "builtins.dict" and all(child["type"] is None for child in spec["children_spec"]):
            keys = [str(key) for key in json.loads(spec["context"])]
        else:
            raise ImportInputError(f"{path}: LitData items of type {spec['type']} are not imported (use a flat dict)")
    except (ValueError, KeyError, TypeError) as error:
        raise ImportInputError(f"{path}: the LitData data_spec cannot be read ({error})") from None
    if len(keys) != len(formats):
        raise ImportInputError(f"{path}: the LitData index lists {len(formats)} formats for {len(keys)} keys")
    return keys


def _field(data_format: str, key: str, path: Path) -> FieldSpec:
    base, _, config = data_format.partition(":")
    if base in ("str", "text"):
        return FieldSpec("text")
    if base == "int":
        return FieldSpec("scalar", "int64")
    if base == "float":
        return FieldSpec("scalar", "float64")
    if base == "bool":
        return FieldSpec("scalar", "bool")
    if base == "no_header_numpy":
        dtype = NUMPY_DTYPES[int(config)]
        return FieldSpec("tokens" if dtype[0] in "iu" else "array", dtype)
    if base == "numpy":
        return FieldSpec("array", "float64")  # decided by the first item
    if base == "jpeg":
        return FieldSpec("image")
    if base == "bytes":
        return FieldSpec("array", "uint8")  # or a media field: decided by the first item
    raise ImportInputError(f"{path}: leaf {key!r} has LitData format {data_format!r}, which is not imported")


def _decode(data_format: str, data: bytes) -> Any:
    base, _, config = data_format.partition(":")
    if base in ("str", "text"):
        return data.decode("utf-8")
    if base == "int":
        return struct.unpack("<q", data)[0]
    if base == "float":
        return struct.unpack("<d", data)[0]
    if base == "bool":
        return data != b"\x00"
    if base == "no_header_numpy":
        return np.frombuffer(data, NUMPY_DTYPES[int(config)])
    if base == "numpy":
        dtype = NUMPY_DTYPES[int(np.frombuffer(data, np.uint32, 1)[0])]
        ndim = int(np.frombuffer(data, np.uint32, 1, 4)[0])
        shape = tuple(np.frombuffer(data, np.uint32, ndim, 8).tolist())
        return np.frombuffer(data, dtype, offset=8 + 4 * ndim).reshape(shape)
    return bytes(data)


def _chunk_file(path: Path, chunk: dict[str, Any]) -> Path:
    name = str(chunk.get("filename", ""))
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ImportInputError(f"{path / 'index.json'}: a chunk names the file {name!r}, outside the folder")
    return path / name


def _chunk_rows(path: Path, chunk: dict[str, Any], config: dict[str, Any], keys: list[str]) -> Iterator[dict[str, Any]]:
    file = _chunk_file(path, chunk)
    data = file.read_bytes()
    if config.get("compression"):
        try:
            import zstandard
        except ImportError as error:
            raise ImportError(
                "reading zstd-compressed LitData chunks needs zstandard: pip install zstandard"
            ) from error
        data = zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 40)
    formats = config["data_format"]
    header = struct.Struct("<" + "I" * len(formats))
    for item in samples(data, WORDS):
        sizes = header.unpack_from(item)
        yield record(item, header.size, zip(keys, formats, sizes, strict=True), _decode, WORDS)


def describe(path: Path, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    del shard_size, options  # a local folder
    data = _index(path)
    config, chunks = data["config"], data["chunks"]
    keys = _keys(path, config)
    fields: Fields = {key: _field(fmt, key, path) for key, fmt in zip(keys, config["data_format"], strict=True)}
    pieces: list[Piece] = []
    first_row = 0
    for number, chunk in enumerate(chunks):
        file = _chunk_file(path, chunk)
        if not file.is_file():
            raise ImportInputError(f"{path}: the chunk file {file.name} that index.json lists is missing")
        try:
            count = int(chunk["chunk_size"])
        except (KeyError, TypeError, ValueError) as error:
            raise ImportInputError(f"{path / 'index.json'}: chunk {number} is not described ({error})") from None
        pieces.append(Piece(path, "litdata", first_row, count, file.stat().st_size, (number,)))
        first_row += count
    undecided = [key for key, fmt in zip(keys, config["data_format"], strict=True) if fmt in ("bytes", "numpy")]
    if undecided and chunks:
        first = next(guarded(path, _chunk_rows(path, chunks[0], config, keys), 0, WORDS), {})
        for key in undecided if first else []:
            shown = field_of_value(first[key])
            if shown is not None:
                fields[key] = shown
    return Described(fields, pieces)


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    del fields
    (number,) = piece.detail
    assert isinstance(piece.path, Path)  # a local folder
    data = _index(piece.path)
    config = data["config"]
    keys = _keys(piece.path, config)
    records = _chunk_rows(piece.path, data["chunks"][number], config, keys)
    yield from piece_rows(piece, guarded(piece.path, records, piece.first_row, WORDS), start)
