"""MosaicML MDS folders (``MDSWriter``'s output), read from their documented on-disk format, no library needed.

``index.json`` lists the shards (``{"format": "mds", "version": 2, "column_names", "column_encodings",
"column_sizes", "samples", "raw_data", "zip_data", "compression"}``); a shard file is ``uint32 samples |
uint32 offsets[samples + 1] | ... | samples``, each sample the uint32 sizes of its variable-size columns,
then the columns' bytes. Shards compressed with ``zstd``, ``gz`` or ``bz2`` are decompressed in memory.
Each shard is one piece; rows are numbered across the folder's shards, as the dataset's sample indices.

Encodings become fields: ``str`` -> ``Text``; ``int`` and the NumPy scalar names -> ``Scalar``;
``str_int`` / ``str_float`` -> ``Scalar``, ``str_decimal`` -> ``Text``; ``ndarray[:dtype[:shape]]`` ->
``Tokens`` (one dimension of integers) or ``Array``; ``jpeg`` / ``png`` -> ``Image`` (the stored bytes);
``list[jpeg]`` / ``list[png]`` / ``jpeg_array`` -> ``Images``; ``json`` -> ``Json``; ``bytes`` -> a media
field when its first value starts as an image, audio or video file does, else ``Array(uint8)``.
``pil`` and ``list[pil]`` (raw pixels) and ``pkl`` (pickles are never loaded) are refused, naming the column.
"""

from __future__ import annotations

import bz2
import gzip
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from guideloom.importing._errors import ImportInputError
from guideloom.importing._sample_files import Words, field_of_value, guarded, piece_rows, record, samples
from guideloom.importing._schema import Fields, FieldSpec, merge_fields
from guideloom.importing._stream import Described, Piece, Row

SCALARS = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64")
NDARRAY_DTYPES = {8: "uint8", 9: "int8", 16: "uint16", 17: "int16", 18: "float16", 32: "uint32", 33: "int32",
                  34: "float32", 64: "uint64", 65: "int64", 66: "float64"}  # fmt: skip
SHAPE_DTYPES = ("uint8", "uint16", "uint32", "uint64")
WORDS = Words(sample="sample", file="shard", parts="columns", damaged="a damaged MDS shard")


def is_mds(path: Path) -> bool:
    index = path / "index.json"
    if not index.is_file():
        return False
    try:
        shards = json.loads(index.read_text())["shards"]
    except (ValueError, KeyError, TypeError, OSError):
        return False
    return isinstance(shards, list) and all(isinstance(s, dict) and s.get("format") == "mds" for s in shards)


def _index(path: Path) -> list[dict[str, Any]]:
    try:
        shards = json.loads((path / "index.json").read_text())["shards"]
    except (ValueError, KeyError, TypeError) as error:
        raise ImportInputError(f"{path / 'index.json'}: not an MDS index ({error})") from None
    return list(shards)


def _shard_file(path: Path, shard: dict[str, Any]) -> tuple[Path, str | None]:
    info = shard.get("zip_data") or shard.get("raw_data")
    name = str(info["basename"]) if isinstance(info, dict) else ""
    if not name or Path(name).is_absolute() or ".." in Path(name).parts:
        raise ImportInputError(f"{path / 'index.json'}: a shard names the file {name!r}, outside the folder")
    compression = shard.get("compression") if shard.get("zip_data") else None
    return path / name, None if compression is None else str(compression).split(":")[0]


def _field(encoding: str, name: str, where: Path) -> FieldSpec:
    base, _, config = encoding.partition(":")
    if base == "str" or base == "str_decimal":
        return FieldSpec("text")
    if base == "int" or base == "str_int":
        return FieldSpec("scalar", "int64")
    if base == "str_float":
        return FieldSpec("scalar", "float64")
    if base in SCALARS:
        return FieldSpec("scalar", base)
    if base == "ndarray":
        dtype, _, shape = config.partition(":")
        if not dtype:
            return FieldSpec("array", "float64")  # decided by the first sample (see describe)
        shape_of = tuple(int(size) for size in shape.split(",")) if shape else None
        if dtype[0] in "iu" and (shape_of is None or len(shape_of) == 1):
            return FieldSpec("tokens", dtype)
        return FieldSpec("array", dtype, shape=shape_of)
    if base in ("jpeg", "png"):
        return FieldSpec("image")
    if base in ("list[jpeg]", "list[png]", "jpeg_array", "jpegarray"):
        return FieldSpec("images")
    if base == "json":
        return FieldSpec("json")
    if base == "bytes":
        return FieldSpec("array", "uint8")  # or a media field: decided by the first sample
    raise ImportInputError(f"{where}: column {name!r} has MDS encoding {encoding!r}, which is not imported")


def _decompressed(file: Path, compression: str | None) -> bytes:
    data = file.read_bytes()
    if compression is None:
        return data
    try:
        if compression == "zstd":
            import zstandard

            return zstandard.ZstdDecompressor().decompress(data, max_output_size=1 << 40)
        if compression == "gz":
            return gzip.decompress(data)
        if compression == "bz2":
            return bz2.decompress(data)
    except ImportError as error:
        raise ImportError("reading zstd-compressed MDS shards needs zstandard: pip install zstandard") from error
    except Exception as error:
        raise ImportInputError(f"{file}: damaged {compression} data ({error})") from None
    raise ImportInputError(f"{file}: MDS compression {compression!r} is not supported (use zstd, gz or bz2)")


def _ndarray(data: bytes, config: str) -> np.ndarray:
    dtype, _, shape = config.partition(":")
    index = 0
    if not dtype:
        dtype = NDARRAY_DTYPES[data[0]]
        index = 1
    if shape:
        dims: tuple[int, ...] = tuple(int(size) for size in shape.split(","))
    else:
        ndim, shape_dtype = data[index] >> 2, SHAPE_DTYPES[data[index] % 4]
        width = np.dtype(shape_dtype).itemsize
        dims = tuple(np.frombuffer(data, shape_dtype, ndim, index + 1).tolist())
        index += 1 + ndim * width
    return np.frombuffer(data, dtype, offset=index).reshape(dims)


def _images(data: bytes, base: str) -> list[bytes]:
    index = 4 if base.startswith("list[") else 0  # lists start with a 4-byte placeholder
    count = int(np.frombuffer(data, np.uint32, 1, index)[0])
    sizes = np.frombuffer(data, np.uint32, count, index + 4).tolist()
    position = index + 4 + 4 * count
    images = []
    for size in sizes:
        images.append(data[position : position + size])
        position += size
    return images


def _decode(encoding: str, data: bytes) -> Any:
    base, _, config = encoding.partition(":")
    if base == "str" or base == "str_decimal":
        return data.decode("utf-8")
    if base == "int":
        return int(np.frombuffer(data, np.int64)[0])
    if base == "str_int":
        return int(data.decode("utf-8"))
    if base == "str_float":
        return float(data.decode("utf-8"))
    if base in SCALARS:
        return np.frombuffer(data, base)[0].item()
    if base == "ndarray":
        return _ndarray(data, config)
    if base in ("list[jpeg]", "list[png]", "jpeg_array", "jpegarray"):
        return _images(data, base)
    if base == "json":
        return json.loads(data.decode("utf-8"))
    return bytes(data)  # bytes, jpeg, png


def _shard_rows(path: Path, shard: dict[str, Any]) -> Iterator[dict[str, Any]]:
    file, compression = _shard_file(path, shard)
    data = _decompressed(file, compression)
    names, encodings, sizes = shard["column_names"], shard["column_encodings"], shard["column_sizes"]
    for sample in samples(data, WORDS):
        position = 0
        lengths = []
        for size in sizes:
            if size is None:
                size = int(np.frombuffer(sample, np.uint32, 1, position)[0])
                position += 4
            lengths.append(size)
        yield record(sample, position, zip(names, encodings, lengths, strict=True), _decode, WORDS)


def describe(path: Path, shard_size: int, options: dict[str, Any] | None = None) -> Described:
    del shard_size, options  # a local folder
    shards = _index(path)
    pieces: list[Piece] = []
    fields: Fields = {}
    first_row = 0
    for number, shard in enumerate(shards):
        try:
            found = {
                name: _field(encoding, name, path)
                for name, encoding in zip(shard["column_names"], shard["column_encodings"], strict=True)
            }
            rows_in = int(shard["samples"])
            file, _ = _shard_file(path, shard)
        except (KeyError, TypeError, ValueError) as error:
            if isinstance(error, ImportInputError):
                raise
            raise ImportInputError(f"{path / 'index.json'}: shard {number} is not described ({error})") from None
        if not file.is_file():
            raise ImportInputError(f"{path}: the shard file {file.name} that index.json lists is missing")
        fields = found if number == 0 else merge_fields(fields, found, str(path))
        pieces.append(Piece(path, "mds", first_row, rows_in, file.stat().st_size, (number,)))
        first_row += rows_in
    if pieces:
        fields = _from_first_sample(path, shards[0], fields)
    return Described(fields, pieces)


def _from_first_sample(path: Path, shard: dict[str, Any], fields: Fields) -> Fields:
    """Fields whose type only a value tells (``bytes``, ``ndarray`` without dtype), from the first sample."""
    undecided = [
        name
        for name, encoding in zip(shard["column_names"], shard["column_encodings"], strict=True)
        if encoding in ("bytes", "ndarray")
    ]
    if not undecided or not shard.get("samples"):
        return fields
    first = next(guarded(path, _shard_rows(path, shard), 0, WORDS))
    decided = dict(fields)
    for name in undecided:
        shown = field_of_value(first[name])
        if shown is not None:
            decided[name] = shown
    return decided


def rows(piece: Piece, fields: Any, start: int) -> Iterator[Row]:
    del fields
    (number,) = piece.detail
    assert isinstance(piece.path, Path)  # a local folder
    shard = _index(piece.path)[number]
    yield from piece_rows(piece, guarded(piece.path, _shard_rows(piece.path, shard), piece.first_row, WORDS), start)
