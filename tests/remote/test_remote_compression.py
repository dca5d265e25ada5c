"""compression="zstd": smaller objects on the store, the plain shard in the cache, the same batches."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from guideloom import (
    CorruptStorageError,
    DocumentJsonFormat,
    DocumentStorage,
    FormatMismatchError,
    StatefulDataLoader,
    TokenStorage,
)
from tests.remote.conftest import ServiceStorage


def _fill(storage: TokenStorage, shards: int = 3) -> None:
    generator = np.random.default_rng(5)
    with storage.sync_writer() as writer:
        for shard in range(shards):
            for _ in range(40):
                writer.append(shard, generator.integers(0, 500, int(generator.integers(50, 200)), dtype=np.uint32))


def _epoch(storage: Any, **options: Any) -> list[Any]:
    with StatefulDataLoader.from_storage(
        storage, device="cpu", local_batch_size=4, shuffle=True, seed=2, **options
    ) as loader:
        return [_plain(batch) for batch in loader]


def _plain(batch: Any) -> Any:
    """A batch with its tensors as lists, to compare whole batches."""
    if isinstance(batch, dict):
        return {key: _plain(value) for key, value in batch.items()}
    return batch.tolist() if hasattr(batch, "tolist") else batch


def _objects(service: ServiceStorage) -> dict[str, int]:
    """The storage's objects (``shards/...``) and their sizes, as the service lists them."""
    root = service.object_path("")
    return {
        path.removeprefix(root): int(info["size"])
        for path, info in service.filesystem().find(root.rstrip("/"), detail=True).items()
    }


def test_compressed_shards_are_smaller_and_read_the_same_batches(service: ServiceStorage, tmp_path: Path) -> None:
    local = TokenStorage(tmp_path / "local")
    _fill(local)
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd")
    _fill(storage)
    assert json.loads(service.object_bytes("guideloom.json"))["compression"] == "zstd"
    stored = {key: size for key, size in _objects(service).items() if key.endswith(".shard")}
    plain = {path.name: path.stat().st_size for path in (tmp_path / "local" / "shards").iterdir()}
    assert sorted(key.rsplit("/", 1)[1] for key in stored) == sorted(plain)
    assert all(stored[f"shards/{name}"] < size * 0.8 for name, size in plain.items())
    reader_storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r")
    assert reader_storage.compression == "zstd"  # compression=None: as recorded
    for options in ({"sequence_length": 33}, {"sequence_length": 64, "pack_documents": True, "num_workers": 2}):
        assert _epoch(reader_storage, **options) == _epoch(local, **options)
    cached = sorted(path.stat().st_size for path in (tmp_path / "r").rglob("*.shard"))
    assert cached == sorted(plain.values())  # the plain shards, read zero-copy from there
    assert reader_storage.verify() == []


def test_documents_compress_too(service: ServiceStorage, tmp_path: Path) -> None:
    records = [{"text": "lorem ipsum " * (i % 9), "id": i} for i in range(60)]
    storage = DocumentStorage(
        service.url, DocumentJsonFormat(), storage_options=service.options, cache_dir=tmp_path, compression="zstd"
    )
    with storage.sync_writer() as writer:
        for i, record in enumerate(records):
            writer.append(i % 2, record)
    with storage.sync_reader() as reader:
        assert sorted((reader.read(i) for i in range(len(reader))), key=lambda r: r["id"]) == records


def test_a_different_explicit_compression_is_a_format_mismatch(service: ServiceStorage, tmp_path: Path) -> None:
    _fill(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path), shards=1)
    with pytest.raises(FormatMismatchError, match=r"compressed with zstd"):
        TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path, compression="zstd")


def test_compression_arguments_are_checked(service: ServiceStorage, tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"compression applies to storages on object stores.*local path"):
        TokenStorage(tmp_path / "local", compression="zstd")
    with pytest.raises(ValueError, match=r"compression must be one of \('zstd',\)"):
        TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path, compression="gzip")
    with pytest.raises(ValueError, match=r"compression_level must be from 1 to 22"):
        TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path, compression_level=0)
    with pytest.raises(TypeError, match=r"compression_level must be an int"):
        TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path, compression_level="3")


def test_a_shard_without_its_marker_is_indexed_from_the_plain_footer(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd")
    _fill(storage, shards=2)
    expected = _epoch(storage, sequence_length=16)
    for key in _objects(service):
        if key.endswith(".meta") and "/000000000001." in key:
            service.delete_object(key)
    fresh = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r")
    assert _epoch(fresh, sequence_length=16) == expected


def test_a_damaged_compressed_object_is_downloaded_three_times_then_named(
    service: ServiceStorage, tmp_path: Path
) -> None:
    _fill(TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd"))
    key = "shards/000000000001.shard"
    damaged = bytearray(service.object_bytes(key))
    damaged[len(damaged) // 2] ^= 0x10
    service.put_object(key, bytes(damaged))
    storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r")
    with storage.sync_reader() as reader:
        with pytest.raises(CorruptStorageError, match=r"shard 1 failed its checks 3 times"):
            reader.read(50)  # shard 1 holds documents 40 to 79
        assert reader.read(0).size  # the other shards are fine
    assert list((tmp_path / "r").rglob("*.part")) == []
    assert [problem.startswith("shard 1") for problem in storage.verify()] == [True]


@pytest.mark.parametrize("dtype", ["uint16", "uint32"])
def test_shards_of_several_shuffle_blocks_come_back_whole(service: ServiceStorage, tmp_path: Path, dtype: str) -> None:
    documents = [np.arange(start, start + 700_000, dtype=np.int64) % 60_000 for start in range(0, 2_100_000, 700_000)]
    storage = TokenStorage(
        service.url, dtype, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd"
    )
    with storage.sync_writer() as writer:
        for tokens in documents:
            writer.append(0, tokens)  # one shard of 4 or 8 MB: several 1 MiB blocks of data
    reader_storage = TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r")
    with reader_storage.sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(3)] == [tokens.tolist() for tokens in documents]


def test_a_masked_storage_compresses_with_its_masks(service: ServiceStorage, tmp_path: Path) -> None:
    storage = TokenStorage(
        service.url, loss_mask=True, storage_options=service.options, cache_dir=tmp_path / "w", compression="zstd"
    )
    documents = [np.arange(start, start + 500, dtype=np.uint32) for start in range(0, 3000, 500)]
    masks = [np.arange(500) % (index + 2) == 0 for index in range(len(documents))]
    with storage.sync_writer() as writer:
        for tokens, mask in zip(documents, masks, strict=True):
            writer.append(0, tokens, loss_mask=mask)
    with TokenStorage(service.url, storage_options=service.options, cache_dir=tmp_path / "r").sync_reader() as reader:
        assert [reader.read(i).tolist() for i in range(len(reader))] == [tokens.tolist() for tokens in documents]
        assert [reader.loss_mask(i).tolist() for i in range(len(reader))] == [mask.tolist() for mask in masks]
