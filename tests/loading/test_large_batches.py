"""Batches from worker processes: small arrays through the pipe, large ones (1 MiB and more) through shared memory."""

from __future__ import annotations

import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from guideloom import DocumentStorage, StatefulDataLoader
from guideloom._loading.worker_wire import SHARED_MEMORY_BYTES
from guideloom.types import DocumentStorageFormat

FEATURES = 16_384  # float32: 64 KiB a record, 2 MiB a batch of 32


class Features(DocumentStorageFormat[tuple[int, np.ndarray], tuple[int, np.ndarray]]):
    """An id, then float32 features decoded as a read-only view of the mapped shard."""

    name = "test-features-v1"

    def pack(self, data: tuple[int, np.ndarray]) -> bytes:
        return struct.pack("<I", data[0]) + np.asarray(data[1], "<f4").tobytes()

    def unpack(self, encoded_data: memoryview, shard: int) -> tuple[int, np.ndarray]:
        return struct.unpack_from("<I", encoded_data)[0], np.frombuffer(encoded_data, "<f4", offset=4)


def features_storage(path: Path, count: int = 128) -> DocumentStorage[Any, Any]:
    storage = DocumentStorage(path, Features())
    rng = np.random.default_rng(0)
    with storage.sync_writer() as writer:
        for index in range(count):
            writer.append(index // 64, (index, rng.standard_normal(FEATURES, dtype=np.float32)))
    return storage


def as_tensors(records: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    """A large tensor, a small one, a large bfloat16 one (a dtype NumPy lacks) and the ids as a list."""
    features = torch.from_numpy(np.stack([features for _, features in records]))
    return {
        "features": features,
        "ids": torch.tensor([record_id for record_id, _ in records]),
        "half": features.to(torch.bfloat16),
        "names": [f"record {record_id}" for record_id, _ in records],
    }


def as_arrays(records: list[tuple[int, np.ndarray]]) -> dict[str, Any]:
    """A large NumPy array, a small one, and a large array of strings (which torch cannot hold)."""
    return {
        "features": np.stack([features for _, features in records]),
        "ids": np.array([record_id for record_id, _ in records]),
        "names": np.array([f"record {record_id:060d}" for record_id, _ in records] * 200),
    }


def batches(storage: DocumentStorage[Any, Any], collate: Any, workers: int) -> list[dict[str, Any]]:
    with StatefulDataLoader.from_storage(
        storage, collate, device="cpu", local_batch_size=32, shuffle=True, seed=3, num_workers=workers
    ) as loader:
        return list(loader)


def same_batches(left: list[dict[str, Any]], right: list[dict[str, Any]]) -> None:
    assert len(left) == len(right)
    for one, other in zip(left, right, strict=True):
        assert list(one) == list(other)
        for name, value in one.items():
            assert type(value) is type(other[name])
            if isinstance(value, torch.Tensor):
                assert value.dtype == other[name].dtype and torch.equal(value, other[name])
            elif isinstance(value, np.ndarray):
                assert value.dtype == other[name].dtype and np.array_equal(value, other[name])
            else:
                assert value == other[name]


def test_tensor_batches_from_workers_are_those_of_the_main_process(tmp_path: Path) -> None:
    storage = features_storage(tmp_path / "features")
    from_workers = batches(storage, as_tensors, workers=2)
    same_batches(from_workers, batches(storage, as_tensors, workers=0))
    assert from_workers[0]["features"].nbytes >= SHARED_MEMORY_BYTES


def test_numpy_batches_from_workers_are_those_of_the_main_process(tmp_path: Path) -> None:
    storage = features_storage(tmp_path / "features")
    from_workers = batches(storage, as_arrays, workers=2)
    same_batches(from_workers, batches(storage, as_arrays, workers=0))
    assert from_workers[0]["names"].nbytes >= SHARED_MEMORY_BYTES


def test_large_tensors_cross_in_shared_memory_and_small_ones_through_the_pipe(tmp_path: Path) -> None:
    (batch, *_) = batches(features_storage(tmp_path / "features"), as_tensors, workers=2)
    assert batch["features"].is_shared() and batch["half"].is_shared()
    assert not batch["ids"].is_shared()


def test_large_numpy_arrays_arrive_as_writable_numpy_arrays(tmp_path: Path) -> None:
    (batch, *_) = batches(features_storage(tmp_path / "features"), as_arrays, workers=2)
    features = batch["features"]
    assert type(features) is np.ndarray and features.flags.writeable
    features[0, 0] = 1.0  # the batch is the training process's own


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_outlives_its_loader(tmp_path: Path, workers: int) -> None:
    storage = features_storage(tmp_path / "features", count=64)
    kept = batches(storage, as_arrays, workers)
    with storage.sync_reader() as reader:
        expected = np.stack([reader.read(int(record_id))[1] for record_id in kept[0]["ids"]])
    assert np.array_equal(kept[0]["features"], expected)
