"""Inputs for the import tests, written as their own tools write them, and the records an import wrote."""

from __future__ import annotations

import io
import json
import struct
import tarfile
from pathlib import Path
from typing import Any

import numpy as np

from guideloom import DocumentStorage
from guideloom.fields import MediaValue
from guideloom.importing import imported_schema


def _image(kind: str, size: tuple[int, int] = (4, 3)) -> bytes:
    from PIL import Image

    buffer = io.BytesIO()
    Image.new("RGB", size, (200, 30, 60)).save(buffer, format=kind)
    return buffer.getvalue()


def _flac() -> bytes:
    import soundfile

    buffer = io.BytesIO()
    soundfile.write(buffer, np.zeros((160, 1), np.float32), 16000, format="FLAC")
    return buffer.getvalue()


PNG, JPEG, FLAC = _image("PNG"), _image("JPEG"), _flac()


def stored_records(destination: Path) -> list[dict[str, Any]]:
    """Every record of an imported storage, in storage order: arrays as lists, scalars as Python numbers, media as
    their encoded bytes."""
    storage = DocumentStorage(destination, imported_schema(destination))
    with storage.sync_reader() as reader:
        return [{key: _plain(value) for key, value in record.items()} for record in reader]


def _plain(value: Any) -> Any:
    if isinstance(value, np.ndarray | np.generic):
        return value.tolist()
    if isinstance(value, MediaValue):
        return bytes(value.data)
    if isinstance(value, list):
        return [_plain(item) for item in value]
    return value


def write_jsonl(path: Path, rows: list[dict[str, Any]], compress: bool = False) -> Path:
    data = "".join(json.dumps(row) + "\n" for row in rows).encode()
    if compress:
        import zstandard

        data = zstandard.ZstdCompressor().compress(data)
    path.write_bytes(data)
    return path


def add_member(tar: tarfile.TarFile, name: str, data: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    tar.addfile(info, io.BytesIO(data))


def write_webdataset(path: Path, samples: list[dict[str, bytes]]) -> Path:
    """A WebDataset tar: each sample's members ``<__key__>.<extension>`` in order."""
    with tarfile.open(path, "w") as tar:
        for sample in samples:
            for extension, data in sample.items():
                if extension != "__key__":
                    add_member(tar, f"{sample['__key__'].decode()}.{extension}", data)
    return path


def write_mds(folder: Path, columns: dict[str, str], samples: list[dict[str, Any]], per_shard: int = 3) -> Path:
    """An MDS folder as ``MDSWriter`` writes it (format version 2, no compression), for str/int/bytes/ndarray:dtype
    and json columns: ``uint32 n | uint32 offsets[n + 1] | samples``, each sample the uint32 sizes of its
    variable-size columns then their bytes; ``index.json`` lists the shards."""
    folder.mkdir(parents=True)
    names, encodings = list(columns), list(columns.values())
    sizes = [8 if encoding == "int" else None for encoding in encodings]
    shards = []
    for number, first in enumerate(range(0, len(samples), per_shard)):
        encoded = []
        for sample in samples[first : first + per_shard]:
            heads, bodies = [], []
            for name, encoding, size in zip(names, encodings, sizes, strict=True):
                body = _mds_encode(encoding, sample[name])
                if size is None:
                    heads.append(len(body))
                bodies.append(body)
            encoded.append(np.array(heads, np.uint32).tobytes() + b"".join(bodies))
        offsets = np.cumsum([0, *map(len, encoded)]).astype(np.uint32) + 4 + 4 * (len(encoded) + 1)
        basename = f"shard.{number:05d}.mds"
        (folder / basename).write_bytes(np.uint32(len(encoded)).tobytes() + offsets.tobytes() + b"".join(encoded))
        shards.append(
            {
                "column_encodings": encodings,
                "column_names": names,
                "column_sizes": sizes,
                "compression": None,
                "format": "mds",
                "hashes": [],
                "raw_data": {"basename": basename, "bytes": (folder / basename).stat().st_size, "hashes": {}},
                "samples": len(encoded),
                "size_limit": 1 << 26,
                "version": 2,
                "zip_data": None,
            }
        )
    (folder / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return folder


def _mds_encode(encoding: str, value: Any) -> bytes:
    if encoding == "str":
        return str(value).encode()
    if encoding == "int":
        return np.int64(value).tobytes()
    if encoding == "json":
        return json.dumps(value).encode()
    if encoding.startswith("ndarray:"):  # a static dtype, a dynamic shape: [ndim << 2 | shape dtype] [shape] [values]
        array = np.asarray(value, encoding.split(":")[1])
        return bytes([array.ndim << 2 | 0]) + np.asarray(array.shape, np.uint8).tobytes() + array.tobytes()
    return bytes(value)


def write_litdata(folder: Path, formats: dict[str, str], items: list[dict[str, Any]], per_chunk: int = 3) -> Path:
    """A LitData folder as ``litdata.optimize`` writes it (PyTreeLoader, no compression) for flat dict items of
    str / int / float / bytes leaves: chunk ``uint32 n | uint32 offsets[n + 1] | items``, each item the uint32
    sizes of its leaves then their bytes; ``index.json`` holds the chunks and the config (data_format, data_spec)."""
    folder.mkdir(parents=True)
    keys = list(formats)
    chunks = []
    for number, first in enumerate(range(0, len(items), per_chunk)):
        encoded = []
        for item in items[first : first + per_chunk]:
            leaves = [_litdata_encode(formats[key], item[key]) for key in keys]
            encoded.append(struct.pack("<" + "I" * len(leaves), *map(len, leaves)) + b"".join(leaves))
        offsets = np.cumsum([0, *map(len, encoded)]).astype(np.uint32) + 4 + 4 * (len(encoded) + 1)
        filename = f"chunk-0-{number}.bin"
        (folder / filename).write_bytes(np.uint32(len(encoded)).tobytes() + offsets.tobytes() + b"".join(encoded))
        chunks.append({"chunk_bytes": (folder / filename).stat().st_size, "chunk_size": len(encoded),
                       "dim": None, "filename": filename})  # fmt: skip
    leaf = {"type": None, "context": None, "children_spec": []}
    spec = {"type": "builtins.dict", "context": json.dumps(keys), "children_spec": [leaf] * len(keys)}
    config = {"compression": None, "chunk_size": per_chunk, "chunk_bytes": None, "data_format": list(formats.values()),
              "data_spec": json.dumps([1, spec]), "encryption": None, "item_loader": "PyTreeLoader"}  # fmt: skip
    (folder / "index.json").write_text(json.dumps({"chunks": chunks, "config": config, "updated_at": "0"}))
    return folder


def _litdata_encode(data_format: str, value: Any) -> bytes:
    if data_format == "str":
        return str(value).encode()
    if data_format == "int":
        return struct.pack("<q", value)
    if data_format == "float":
        return struct.pack("<d", value)
    if data_format.startswith("no_header_numpy:"):
        return np.asarray(value).tobytes()
    return bytes(value)
